## BPPARAM on knnGraph() and knnSearch() (R/parallel.R): blocks of query
## nodes as BiocParallel tasks give the bits of one process, whatever the
## workers and block count; failures name the block; the data reaches a
## worker once.

edgeColumns <- function(edges) lapply(c(edges), identity)

## expr evaluated with searches streamed in blocks of `block` nodes.
inBlocks <- function(block, expr) {
    withr::with_options(list(knngpu.block.nodes = block), expr)
}

test_that("blocks on workers give the bits of one process", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(700, 10, 41)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    q <- tiedMatrix(90, 10, 42)
    params <- list(BiocParallel::MulticoreParam(2, tasks = 7),
                   BiocParallel::SnowParam(2, tasks = 3))
    for (metric in c("pearson", "euclidean", "cosine")) {
        whole <- knnGraph(x, k = 8, metric = metric, device = "cpu",
                          progress = FALSE)
        near <- knnSearch(x, q, k = 5, metric = metric, device = "cpu")
        for (param in params) {
            split <- knnGraph(x, k = 8, metric = metric, device = "cpu",
                              BPPARAM = param)
            expect_identical(edgeColumns(split), edgeColumns(whole))
            expect_identical(attr(split, "nodes"), attr(whole, "nodes"))
            found <- knnSearch(x, q, k = 5, metric = metric, device = "cpu",
                               BPPARAM = param)
            expect_identical(found[c("index", "distance")],
                             near[c("index", "distance")])
        }
    }
    expect_identical(attr(split, "timings")$blocks, 3L)
    ## Symmetrised and SNN graphs come from the same neighbours.
    param <- BiocParallel::MulticoreParam(2, tasks = 4)
    for (snn in c("rank", "jaccard")) {
        expect_identical(
            edgeColumns(knnGraph(x, k = 6, snn = snn, device = "cpu",
                                 BPPARAM = param)),
            edgeColumns(knnGraph(x, k = 6, snn = snn, device = "cpu")))
    }
    expect_identical(
        edgeColumns(knnGraph(x, k = 6, symmetrize = "mutual",
                             device = "cpu", BPPARAM = param)),
        edgeColumns(knnGraph(x, k = 6, symmetrize = "mutual",
                             device = "cpu")))
})

test_that("BatchtoolsParam runs the blocks as batchtools jobs", {
    skip_if_not_installed("BiocParallel")
    skip_if_not_installed("batchtools")
    skip_on_os("windows")
    x <- tiedMatrix(300, 8, 43)
    param <- BiocParallel::BatchtoolsParam(
        2, cluster = "multicore",
        registryargs = BiocParallel::batchtoolsRegistryargs(
            file.dir = tempfile("registry")))
    split <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                       BPPARAM = param)
    whole <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu")
    expect_identical(split[c("index", "distance")],
                     whole[c("index", "distance")])
})

test_that("a worker's failure names the block and returns nothing", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(400, 8, 44)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    x[c(250, 260), ] <- NA
    ## Every block searches the whole reference, so every worker finds
    ## the rows and the first block is named.
    expect_error(knnGraph(x, k = 5, device = "cpu",
                          BPPARAM = BiocParallel::MulticoreParam(2,
                                                                 tasks = 4)),
                 paste0("worker failed on block 1 of 4 \\('x' rows g1 to ",
                        "g100; 4 block\\(s\\) failed\\): 'x' has NA, NaN or ",
                        "Inf values in rows: g250, g260"))
    expect_error(knnGraph(x, k = 5, BPPARAM = 2), "'BPPARAM' must be NULL")
    expect_error(knnSearch(x, k = 5, BPPARAM = "snow"),
                 "'BPPARAM' must be NULL")
    ## The transfer file is gone once the search ends, failed or not.
    dir <- tempfile("transfer")
    dir.create(dir)
    withr::with_options(list(knngpu.transfer.dir = dir), {
        expect_error(knnGraph(x, k = 5, device = "cpu",
                              BPPARAM = BiocParallel::SnowParam(2)),
                     "worker failed")
    })
    expect_length(list.files(dir), 0L)
    expect_error(knnGraph(x, k = 5, checkpoint = tempfile()),
                 "'checkpoint' needs a 'BPPARAM' with more than one")
})

## A runner that fails on the block holding node `node` until `gate`
## exists, as a worker does whose job is cancelled mid-run; it counts the
## blocks it searches in files of `log`.
gatedRunner <- function(metric, node, gate, log) {
    runner <- knngpu:::.engineRunner(metric, "cpu", 1L, NULL)
    function(ref, query, k) {
        if (node %in% query$labels && !file.exists(gate)) {
            stop("the job of this block was cancelled")
        }
        file.create(tempfile("block", tmpdir = log))
        runner(ref, query, k)
    }
}

test_that("a rerun with the checkpoint searches only the missing blocks", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(400, 8, 49)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    whole <- knnSearch(x, k = 6, metric = "euclidean", device = "cpu")
    source <- knngpu:::.nodeSource(x, "rows")
    gate <- tempfile("gate")
    log <- tempfile("log")
    dir.create(log)
    dir <- tempfile("checkpoint")
    runner <- gatedRunner("euclidean", "g250", gate, log)
    checkpoint <- knngpu:::.checkpoint(dir, "euclidean")
    ## With stop.on.error (the default), a block may be left unevaluated
    ## after block 3's error, and is then searched by the rerun.
    for (param in list(BiocParallel::SnowParam(2, tasks = 4,
                                               stop.on.error = FALSE),
                       BiocParallel::MulticoreParam(2, tasks = 4))) {
        unlink(c(dir, gate, file.path(log, "*")), recursive = TRUE)
        search <- function() {
            knngpu:::.searchBlocks(source, NULL, NULL, 6L, runner, param,
                                   checkpoint)
        }
        expect_error(search(),
                     paste0("block 3 of 4 \\('x' rows g201 to g300; [12] ",
                            "block\\(s\\) failed\\): the job of this block ",
                            "was cancelled; [23] finished block\\(s\\) stay ",
                            "in 'checkpoint'"))
        written <- file.info(list.files(dir, "^block", full.names = TRUE))
        expect_length(list.files(log), nrow(written))
        if (!BiocParallel::bpstopOnError(param)) {
            expect_identical(nrow(written), 3L)
        }
        file.create(gate)
        got <- search()
        expect_identical(got$index, whole$index)
        expect_identical(got$distance, whole$distance)
        expect_identical(got$info$resumed, nrow(written))
        ## Nothing done twice: four blocks searched in all, the files of
        ## the first run untouched.
        expect_length(list.files(log), 4L)
        expect_identical(file.info(rownames(written))$mtime, written$mtime)
        ## A third run reads every block and searches none.
        expect_identical(search()$info$resumed, 4L)
        expect_length(list.files(log), 4L)
    }
    unlink(c(dir, gate, log), recursive = TRUE)
})

test_that("a checkpoint is kept for its own search only", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(300, 8, 50)
    param <- BiocParallel::SnowParam(2, tasks = 3)
    dir <- tempfile("checkpoint")
    first <- knnGraph(x, k = 5, device = "cpu", BPPARAM = param,
                      checkpoint = dir)
    expect_identical(edgeColumns(first),
                     edgeColumns(knnGraph(x, k = 5, device = "cpu")))
    expect_setequal(list.files(dir), c("search.key", sprintf(
        "block-%d-of-3.rds", 1:3)))
    again <- knnGraph(x, k = 5, device = "cpu", BPPARAM = param,
                      checkpoint = dir)
    expect_identical(edgeColumns(again), edgeColumns(first))
    expect_identical(attr(again, "timings")$resumed, 3L)
    for (other in list(
        function() knnGraph(x, k = 6, device = "cpu", BPPARAM = param,
                            checkpoint = dir),
        function() knnGraph(x, k = 5, metric = "cosine", device = "cpu",
                            BPPARAM = param, checkpoint = dir),
        function() knnGraph(x + 1, k = 5, device = "cpu", BPPARAM = param,
                            checkpoint = dir),
        function() knnGraph(x, k = 5, device = "cpu", checkpoint = dir,
                            BPPARAM = BiocParallel::SnowParam(2, tasks = 4))
    )) {
        expect_error(other(), "'checkpoint' holds the blocks of another")
    }
    stray <- tempfile("stray")
    dir.create(stray)
    file.create(file.path(stray, "notes.txt"))
    expect_error(knnGraph(x, k = 5, BPPARAM = param, checkpoint = stray),
                 "'checkpoint' must be a new or empty directory")
    expect_error(knnGraph(x, k = 5, BPPARAM = param, checkpoint = NA),
                 "'checkpoint' must be NULL or the path of a directory")
    unlink(c(dir, stray), recursive = TRUE)
})

test_that("a worker reads the reference once for all its blocks", {
    x <- tiedMatrix(200, 6, 45)
    source <- knngpu:::.nodeSource(x, "rows")
    runner <- knngpu:::.engineRunner("euclidean", "cpu", 1L, NULL)
    handle <- knngpu:::.shareSources(source, NULL)
    store <- list(dir = tempfile("blocks"), keep = FALSE, count = 2L)
    store$stop <- file.path(store$dir, "stop")
    dir.create(store$dir)
    task <- knngpu:::.blockTask(handle, 4L, runner, store)
    task(list(block = 1L, rows = 1:50))
    ## With the file gone, a second block can only come from what the
    ## first one kept.
    unlink(handle$path)
    task(list(block = 2L, rows = 51:100))
    parts <- lapply(knngpu:::.blockFile(store, 1:2), readRDS)
    whole <- knnSearch(x, k = 4, metric = "euclidean", device = "cpu")
    expect_identical(rbind(parts[[1L]]$index, parts[[2L]]$index),
                     whole$index[1:100, ])
    ## Only finished blocks have files, beside the worker's name.
    expect_setequal(list.files(store$dir),
                    c("block-1-of-2.rds", "block-2-of-2.rds",
                      paste0("worker-", Sys.getpid())))
    knngpu:::.workerForget()
    unlink(store$dir, recursive = TRUE)
})

test_that("a streamed search (blocks of nodes) gives the same bits", {
    x <- tiedMatrix(500, 9, 46)
    q <- tiedMatrix(60, 9, 47)
    for (metric in c("pearson", "spearman", "cosine", "euclidean",
                     "manhattan", "sqeuclidean")) {
        for (k in c(1L, 7L, 120L)) {
            whole <- knnSearch(x, k = k, metric = metric, device = "cpu")
            graph <- knnGraph(x, k = k, metric = metric, device = "cpu")
            near <- knnSearch(x, q, k = k, metric = metric, device = "cpu")
            for (block in c(37L, 499L)) {
                label <- sprintf("%s k=%d block=%d", metric, k, block)
                got <- inBlocks(block, knnSearch(x, k = k, metric = metric,
                                                 device = "cpu"))
                expect_identical(got$index, whole$index, label = label)
                expect_identical(got$distance, whole$distance, label = label)
                edges <- inBlocks(block, knnGraph(x, k = k, metric = metric,
                                                  device = "cpu"))
                expect_identical(edgeColumns(edges), edgeColumns(graph),
                                 label = label)
                got <- inBlocks(block, knnSearch(x, q, k = k,
                                                 metric = metric,
                                                 device = "cpu"))
                expect_identical(got$index, near$index, label = label)
                expect_identical(got$distance, near$distance, label = label)
            }
        }
    }
    ## Blocks of one node: every merge path, on few nodes (each block is
    ## a search of its own).
    small <- x[1:40, ]
    for (metric in c("pearson", "euclidean")) {
        whole <- knnSearch(small, k = 5, metric = metric, device = "cpu")
        got <- inBlocks(1L, knnSearch(small, k = 5, metric = metric,
                                      device = "cpu"))
        expect_identical(got[c("index", "distance")],
                         whole[c("index", "distance")])
    }
    ## One scale for every block: distances that underflow or overflow in
    ## float64 rank as one search ranks them.
    for (scale in c(1e-300, 1e200)) {
        y <- x[1:120, ] * scale
        whole <- knnSearch(y, k = 6, metric = "sqeuclidean", device = "cpu")
        got <- inBlocks(11L, knnSearch(y, k = 6, metric = "sqeuclidean",
                                       device = "cpu"))
        expect_identical(got[c("index", "distance")],
                         whole[c("index", "distance")])
    }
    expect_error(inBlocks(-1, knnSearch(x, k = 3)),
                 "option 'knngpu.block.nodes' must")
})

test_that("every row in another order is a subset, not the whole search", {
    skip_if_not_installed("BiocNeighbors")
    x <- tiedMatrix(150, 6, 48)
    whole <- knnSearch(x, k = 4, metric = "euclidean", device = "cpu")
    got <- BiocNeighbors::findKNN(x, k = 4, subset = 150:1,
                                  BNPARAM = KnngpuParam(device = "cpu"))
    expect_identical(got$index, whole$index[150:1, ])
    expect_identical(got$distance, whole$distance[150:1, ])
})

test_that("an interrupt of the master alone stops its workers within 1 s", {
    skip_if_not_installed("BiocParallel")
    skip_if_not(file.exists("/proc/self/stat"))
    ## RStudio's Stop button interrupts the R session only, not its
    ## workers: SnowParam's waited for its workers' blocks (tens of
    ## seconds), and MulticoreParam's workers went on searching, then
    ## stayed, for the rest of the session. The signal comes once both
    ## workers are inside their blocks, which each name themselves in the
    ## transfer directory (R/parallel.R, .blockTask()). Pearson keeps the
    ## workers on the product scan, whose interrupt polls are the ones
    ## timed here.
    running <- function(pid) {
        stat <- sprintf("/proc/%d/stat", pid)
        if (!file.exists(stat)) return(FALSE)
        line <- tryCatch(readLines(stat, warn = FALSE),
                         error = function(e) "")
        grepl("^[0-9]+ \\(.*\\) [RSDT]", line)
    }
    for (param in c("SnowParam(2)", "MulticoreParam(2)")) {
        dir <- tempfile("knngpu-transfer")
        dir.create(dir)
        pids <- integer()
        workers <- function() {
            as.integer(sub("^worker-", "", basename(list.files(
                dir, "^worker-[0-9]+$", recursive = TRUE))))
        }
        got <- rscriptInterrupted(
            setup = c(
                sprintf("options(knngpu.transfer.dir = '%s')", dir),
                "set.seed(1); x <- matrix(rnorm(80000 * 50), 80000)"),
            code = paste0(
                "knnGraph(x, k = 10, metric = 'pearson', device = 'cpu', ",
                "threads = 1, progress = FALSE, BPPARAM = BiocParallel::",
                param, ")"),
            ready = function() {
                pids <<- workers()
                length(pids) == 2L
            }, after = 0.5)
        expect_identical(got$lines, "interrupt", label = param)
        expect_lt(got$took, 1, label = param)
        limit <- proc.time()[["elapsed"]] + 2
        while (any(vapply(pids, running, logical(1))) &&
               proc.time()[["elapsed"]] < limit) {
            Sys.sleep(0.05)
        }
        expect_false(any(vapply(pids, running, logical(1))), label = param)
        unlink(dir, recursive = TRUE)
    }
})
