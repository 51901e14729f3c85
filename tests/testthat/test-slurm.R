## BatchtoolsParam with the package's SLURM template against a real SLURM,
## which tools/slurm-local.sh starts on this machine (it sets KNNGPU_SLURM
## for the command it runs): the bits of one process; a job cancelled
## mid-run is an error naming its block; a rerun with the checkpoint
## searches only that block.

skipUnlessSlurm <- function() {
    if (!identical(Sys.getenv("KNNGPU_SLURM"), "1")) {
        skip("no SLURM cluster (tools/slurm-local.sh starts one)")
    }
    skip_if_not_installed("BiocParallel")
    skip_if_not_installed("batchtools")
}

packageTemplate <- function() {
    system.file("templates", "slurm-knngpu.tmpl", package = "knngpu",
                mustWork = TRUE)
}

## Two jobs at a time on the cluster's two CPUs.
slurmParam <- function(template = packageTemplate(),
                       resources = list(walltime = 600, ncpus = 1,
                                        memory = 512)) {
    BiocParallel::BatchtoolsParam(
        2, cluster = "slurm", template = template, resources = resources,
        registryargs = BiocParallel::batchtoolsRegistryargs(
            file.dir = tempfile("registry")))
}

## The package's template with each job held, once running, until `gate`
## exists: a job can then be cancelled while it runs, before it writes
## its block.
gatedTemplate <- function(gate) {
    lines <- readLines(packageTemplate())
    at <- grep("^Rscript", lines)
    expect_length(at, 1L)
    file <- tempfile("gated", fileext = ".tmpl")
    writeLines(append(lines, sprintf(
        "while [ ! -e '%s' ]; do sleep 0.2; done", gate), at - 1L), file)
    file
}

## In the background: once both jobs run, cancels the one submitted first
## (scancel), then opens the gate for the other; gives up after a minute.
cancelFirstJob <- function(gate) {
    script <- sprintf(paste(
        "i=0; while [ \"$(squeue -h -t R | wc -l)\" -lt 2 ]; do",
        "i=$((i + 1)); [ $i -le 300 ] || exit 1; sleep 0.2; done;",
        "scancel \"$(squeue -h -o %%i | sort -n | head -n 1)\";",
        "sleep 1; touch '%s'"), gate)
    system2("sh", c("-c", shQuote(script)), wait = FALSE)
}

test_that("SLURM jobs give the bits of one process", {
    skipUnlessSlurm()
    x <- tiedMatrix(600, 10, 61)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    q <- tiedMatrix(80, 10, 62)
    graph <- knnGraph(x, k = 7, metric = "pearson", device = "cpu",
                      BPPARAM = slurmParam())
    expect_identical(lapply(c(graph), identity),
                     lapply(c(knnGraph(x, k = 7, metric = "pearson",
                                       device = "cpu")), identity))
    expect_identical(attr(graph, "timings")$blocks, 2L)
    ## Resources left out take the cluster's defaults.
    near <- knnSearch(x, q, k = 5, metric = "euclidean", device = "cpu",
                      BPPARAM = slurmParam(resources = list(ncpus = 1)))
    expect_identical(near[c("index", "distance")],
                     knnSearch(x, q, k = 5, metric = "euclidean",
                               device = "cpu")[c("index", "distance")])
})

test_that("a cancelled job names its block; the rerun searches only it", {
    skipUnlessSlurm()
    x <- tiedMatrix(800, 10, 63)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    whole <- knnSearch(x, k = 6, metric = "euclidean", device = "cpu")
    gate <- tempfile("gate")
    dir <- tempfile("checkpoint")
    cancelFirstJob(gate)
    err <- tryCatch(knnSearch(x, k = 6, metric = "euclidean", device = "cpu",
                              BPPARAM = slurmParam(gatedTemplate(gate)),
                              checkpoint = dir),
                    error = identity)
    expect_s3_class(err, "error")
    expect_match(conditionMessage(err), paste0(
        "worker failed on block [12] of 2 \\('x' rows g(1 to g400|401 to ",
        "g800); 1 block\\(s\\) failed\\): its worker ended without ",
        "writing it \\(a job cancelled.*1 finished block\\(s\\) stay in ",
        "'checkpoint'"))
    cancelled <- as.integer(sub(".*on block ([12]) of 2.*", "\\1",
                                conditionMessage(err)))
    kept <- file.path(dir, sprintf("block-%d-of-2.rds", 3L - cancelled))
    before <- file.info(kept)$mtime
    expect_false(file.exists(file.path(dir, sprintf("block-%d-of-2.rds",
                                                    cancelled))))
    got <- knnSearch(x, k = 6, metric = "euclidean", device = "cpu",
                     BPPARAM = slurmParam(), checkpoint = dir)
    expect_identical(got[c("index", "distance")],
                     whole[c("index", "distance")])
    ## Nothing done twice: one block read, the other searched; the file
    ## of the first run is the one read.
    expect_identical(attr(got, "timings")$resumed, 1L)
    expect_identical(file.info(kept)$mtime, before)
    unlink(c(dir, gate), recursive = TRUE)
})
