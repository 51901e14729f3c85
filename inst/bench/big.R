## One large self search on the GPU, for issue #10's 10M x 50 target:
## n N(0,1) nodes of d features, k Euclidean neighbours, one run through
## the engine (.engineSearch: the same .Call as knnSearch, without building
## R's result data frame), then a few rows checked against a float64
## reference computed here.
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/big.R [--n=10000000] [--d=50] [--k=15]
##
## Prints the wall time and the engine's phases; device memory stays
## O(n d + tile slots), as the tiles are planned (src/cuda/knn_gpu_plan.cu).

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
n <- as.numeric(argValue("n", "10000000"))
d <- as.integer(argValue("d", "50"))
k <- as.integer(argValue("k", "15"))

set.seed(1)
x <- matrix(rnorm(d * n), d)
invisible(gc())
t0 <- proc.time()[["elapsed"]]
r <- knngpu:::.engineSearch(x, NULL, k, "euclidean", gpu = TRUE)
wall <- proc.time()[["elapsed"]] - t0
i <- r$info
cat(sprintf(paste("%g x %d, k = %d, euclidean, %s, %s: wall %.1f s,",
                  "search %.1f s, re-rank %.1f s, prepare %.1f s,",
                  "collect %.1f s, %.1f candidates per row, row tile %d\n"),
            n, d, k, i$device, format(Sys.time(), tz = "UTC", usetz = TRUE),
            wall, i$seconds_search, i$seconds_rerank, i$seconds_prepare,
            i$seconds_collect, i$candidates, i$row_tile))
cat("precision:", i$precision, "\n")

## The first, middle and last rows against float64 distances; ties in the
## reference go to the smaller index, as knngpu's contract says.
for (row in unique(c(1, ceiling(n / 2), n))) {
    dist <- colSums((x - x[, row])^2)
    dist[row] <- Inf
    expected <- order(dist)[seq_len(k)]
    cat(sprintf("row %.0f equal to float64: %s\n", row,
                identical(as.integer(r$index[row, ]), expected)))
}
