## Same bits from two builds: runs one set of searches with the knngpu
## installed in each of two libraries (each in an R process of its own)
## and says, case by case, whether their results are identical(). For a
## change that must not move a bit (such as a refactoring of src/cuda).
##
## Usage, from the repository root:
##   Rscript tools/ab-bits.R LIB_A LIB_B [--device=gpu|cpu] [--n=N]
##   --device  where the searches run (default gpu)
##   --n       nodes of the larger cases (default 200000 on the GPU,
##             20000 on the CPU)
## Exits 1 when a case differs or fails in either build.
source(file.path("tools", "args.R"))
libs <- args[!startsWith(args, "--")]
if (length(libs) != 2L) stop("give two libraries: LIB_A LIB_B")
device <- argValue("device", "gpu")
n <- as.numeric(argValue("n", if (device == "gpu") "200000" else "20000"))

## The searches, run in a child R whose library path starts with one
## build's; their results go to the file named last on its command line.
runner <- '
args <- commandArgs(trailingOnly = TRUE)
device <- args[1L]
n <- as.numeric(args[2L])
suppressPackageStartupMessages(library(knngpu))
source(file.path("inst", "bench", "shapes-data.R"))
graph <- function(x, ...) knnGraph(x, ..., device = device,
                                   progress = FALSE)
set.seed(1)
normal <- matrix(rnorm(n * 50), n)
few <- normal[seq_len(min(n, 20000)), ]
nq <- min(4096, n %/% 4)
cases <- list(
    walk_euclidean = function() graph(normal, k = 15, metric = "euclidean"),
    walk_pearson = function() graph(normal, k = 10),
    wide_pearson = function()
        graph(matrix(rnorm(n / 4 * 295), n / 4), k = 20),
    k100 = function() graph(normal[seq_len(n / 2), ], k = 100,
                            metric = "euclidean"),
    query = function() knnSearch(normal[-seq_len(nq), ],
                                 normal[seq_len(nq), ], k = 16,
                                 metric = "euclidean", device = device,
                                 progress = FALSE),
    blocks = function() {
        old <- options(knngpu.block.nodes = 3001L)
        on.exit(options(old))
        graph(few, k = 10, metric = "euclidean")
    })
for (kind in c("levels", "logcounts", "clusters", "neardup", "pca",
               "cellpcs", "heavy", "binary", "duplicates", "replicates")) {
    x <- shapeData(kind, n / 4)
    for (m in c("pearson", "cosine", "euclidean"))
        cases[[paste(kind, m)]] <- local({
            xx <- x
            mm <- m
            function() graph(xx, k = 10, metric = mm)
        })
}
rungs <- if (device == "gpu") c("tf32", "tf32x3", "fp32", "fp64") else
    c("fp32", "fp64")
for (r in rungs)
    cases[[paste("rung", r)]] <- local({
        rr <- r
        function() graph(few, k = 10, precision = rr)
    })
if (device == "gpu")
    for (s in c("warp", "radix", "fused", "fused_rows"))
        cases[[paste("select", s)]] <- local({
            ss <- s
            function() {
                Sys.setenv(KNNGPU_SELECT = ss)
                on.exit(Sys.unsetenv("KNNGPU_SELECT"))
                graph(few, k = 10, metric = "euclidean")
            }
        })
res <- lapply(cases, function(f) {
    got <- tryCatch(f(), error = function(e) e)
    if (inherits(got, "error")) return(conditionMessage(got))
    if (is.data.frame(got))
        as.list(got[c("from", "to", "weight", "distance", "rank")])
    else got[c("index", "distance")]
})
saveRDS(res, args[3L])
'

runBuild <- function(lib) {
    out <- tempfile(fileext = ".rds")
    script <- tempfile(fileext = ".R")
    writeLines(runner, script)
    status <- system2("Rscript",
                      c(script, device, format(n, scientific = FALSE), out),
                      env = paste0("R_LIBS=", lib))
    if (status != 0) stop("the searches failed with the library ", lib)
    readRDS(out)
}

a <- runBuild(libs[1L])
b <- runBuild(libs[2L])
verdict <- vapply(names(a), function(case) {
    if (is.character(a[[case]])) return(paste("A failed:", a[[case]]))
    if (is.character(b[[case]])) return(paste("B failed:", b[[case]]))
    if (identical(a[[case]], b[[case]])) "identical" else "DIFFERENT"
}, character(1))
for (case in names(verdict))
    cat(sprintf("%-24s %s\n", case, verdict[[case]]))
same <- sum(verdict == "identical")
cat(sprintf("%d of %d cases identical\n", same, length(verdict)))
if (same < length(verdict)) quit(status = 1)
