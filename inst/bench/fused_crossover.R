## Measures where the fused candidate kernel (products and selection in one,
## src/cuda/knn_gpu_fused.cu) beats the panel path (cuBLAS products, then
## the warp or radix selection kernel), in k, features and query rows, to
## set the constants of knn_fused_choose() in src/cuda/knn_gpu_policy.cuh
## (KNN_FUSED_AUTO_MAX_K, KNN_FUSED_AUTO_MAX_FEATURES,
## KNN_FUSED_SMS_PER_BLOCK).
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/fused_crossover.R [--out=FILE] [--n=200000]
##
## Self searches of n N(0,1) nodes (euclidean; and pearson at one size),
## and query searches of a few query-set sizes against n references, each
## with every path forced in turn (.engineSearch(select = )): the engine's
## wall time, faster of 2 runs, in seconds, and the ratio of the fused
## path's time to the better panel kernel's.

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
out <- argValue("out", "")
n <- as.integer(argValue("n", "200000"))

engineSeconds <- function(ref, query, k, metric, select) {
    if (select == "warp" && k > 32) return(NA_real_)
    times <- vapply(1:2, function(i) {
        gc()
        t0 <- proc.time()[["elapsed"]]
        knngpu:::.engineSearch(ref, query, k, metric, gpu = TRUE,
                               select = select)
        proc.time()[["elapsed"]] - t0
    }, numeric(1))
    min(times)
}

paths <- c("fused", "warp", "radix")
row <- function(case, ref, query, k, metric) {
    secs <- vapply(paths, function(s) engineSeconds(ref, query, k, metric,
                                                    s), numeric(1))
    panel <- min(secs[c("warp", "radix")], na.rm = TRUE)
    data.frame(case = case, metric = metric, d = nrow(ref), k = k,
               queries = if (is.null(query)) ncol(ref) else ncol(query),
               t(secs), fused_over_panel = signif(secs[["fused"]] / panel, 3))
}

set.seed(1)
grid <- list()
for (d in c(16L, 50L, 128L, 295L)) {
    x <- matrix(rnorm(d * n), d)
    for (k in c(1L, 10L, 16L, 24L, 32L, 100L, 128L)) {
        grid[[length(grid) + 1L]] <- row("self", x, NULL, k, "euclidean")
    }
    if (d == 128L) {
        grid[[length(grid) + 1L]] <- row("self", x, NULL, 10L, "pearson")
    }
}
x <- matrix(rnorm(50L * n), 50L)
for (nq in c(2048L, 8192L, 32768L, 131072L)) {
    q <- matrix(rnorm(50L * nq), 50L)
    grid[[length(grid) + 1L]] <- row("query", x, q, 10L, "euclidean")
}
grid <- do.call(rbind, grid)
print(grid, row.names = FALSE)
lines <- c(sprintf("fused crossover on %s, %s, n = %d",
                   gpuInfo()$devices$name[1L],
                   format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"), n),
           capture.output(print(grid, row.names = FALSE)))
if (nzchar(out)) writeLines(lines, out)
