## How the small GPU search (16384 references, 4096 queries, d = 128,
## k = 16: inst/bench/gpu.R's s16k case) depends on what the process did
## just before: calls back to back, a gc() or 50 ms of sleep between calls
## (the host's cores and OpenMP's threads go idle), and after large
## searches. Milliseconds, median of 21 calls: the wall clock of knnSearch
## and the engine's phases (attr(, "timings")).
##
## Usage, on a machine with a GPU, from the repository root, with knngpu
## installed in R_LIBS:  Rscript inst/bench/gpu_idle.R

suppressPackageStartupMessages(library(knngpu))
set.seed(1)
x <- matrix(rnorm(20480 * 128), 128)
ref <- x[, 1:16384]
query <- x[, 16385:20480]
rm(x)
search <- function() {
    knnSearch(ref, query, k = 16, metric = "euclidean", by = "columns",
              device = "gpu", progress = FALSE)
}
invisible(search())

phases <- c("elapsed", "seconds_setup", "seconds_prepare", "seconds_search",
            "seconds_rerank", "seconds_collect")
series <- function(label, between = function() NULL) {
    runs <- replicate(21, {
        between()
        start <- as.numeric(Sys.time())
        res <- search()
        c(as.numeric(Sys.time()) - start, unlist(attr(res, "timings")[phases]))
    })
    cat(sprintf("%-28s", label),
        sprintf("%7.3f", 1000 * apply(runs, 1, stats::median)), "\n")
}

cat(sprintf("%-28s", "ms"), " wall   engine setup  prepare search",
    " rerank copy-out\n")
series("back to back")
series("gc() between", function() invisible(gc(verbose = FALSE)))
series("50 ms of sleep between", function() Sys.sleep(0.05))
big <- matrix(rnorm(262144 * 128), 128)
g <- knnGraph(big, k = 100, metric = "euclidean", by = "columns",
              device = "gpu", progress = FALSE)
rm(g, big)
invisible(gc())
series("after a 262144-node graph")
cat(sprintf("\n%s; %s\n", gpuInfo()$devices$name[1L],
            format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")))
