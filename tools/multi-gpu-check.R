## Several GPUs give the single GPU's (and the CPU's) edges, bit for bit, and
## how the time splits. Run on a machine with two or more GPUs, with knngpu
## installed in R_LIBS:  Rscript tools/multi-gpu-check.R
suppressPackageStartupMessages(library(knngpu))
info <- gpuInfo()
print(info)
ids <- info$devices$id
stopifnot(length(ids) >= 2L)

same <- function(a, b) {
    identical(a$index, b$index) && identical(a$distance, b$distance)
}

set.seed(7)
random <- matrix(rnorm(20000 * 50), 20000)
tied <- matrix(sample(0:3, 12000 * 10, replace = TRUE), 12000)
tied[seq(2, 12000, by = 5), ] <- tied[seq(1, 11999, by = 5), ]
tied <- tied[apply(tied, 1, function(r) any(r != r[1])), ]
## Neighbours close against the nodes' norms: the distance searches give
## TF32 up for float32 on each GPU separately.
levels <- matrix(runif(20000, 0, 100), 20000, 16) +
    matrix(rnorm(20000 * 16, sd = 0.01), 20000)
checks <- 0L
for (data in list(random = random, tied = tied, levels = levels)) {
    for (metric in c("pearson", "euclidean", "manhattan", "spearman",
                     "cosine", "abspearson", "sqeuclidean")) {
        for (k in c(1, 16, 300)) {
            one <- knnSearch(data, k = k, metric = metric, device = "gpu",
                             devices = ids[1], progress = FALSE)
            all <- knnSearch(data, k = k, metric = metric, device = "gpu",
                             devices = ids, progress = FALSE)
            if (!same(one, all)) {
                stop(sprintf("multi-GPU differs: %s k=%d", metric, k))
            }
            ## Graphs: written by the engine in edge order.
            graphOne <- knnGraph(data, k = k, metric = metric,
                                 device = "gpu", devices = ids[1],
                                 progress = FALSE)
            graphAll <- knnGraph(data, k = k, metric = metric,
                                 device = "gpu", devices = ids,
                                 progress = FALSE)
            columns <- c("from", "to", "weight", "distance", "rank")
            if (!identical(unclass(graphOne)[columns],
                           unclass(graphAll)[columns]) ||
                !identical(graphAll$to, as.vector(t(one$index)))) {
                stop(sprintf("multi-GPU graph differs: %s k=%d", metric, k))
            }
            checks <- checks + 1L
        }
    }
}
cpu <- knnSearch(random, k = 16, metric = "pearson", device = "cpu",
                 progress = FALSE)
gpu <- knnSearch(random, k = 16, metric = "pearson", device = "gpu",
                 devices = ids, progress = FALSE)
stopifnot(same(cpu, gpu))
cat(sprintf("multi-GPU parity: %d cases identical on %d GPUs and on 1\n",
            checks, length(ids)))

big <- matrix(rnorm(1e6 * 50), ncol = 50)
for (use in list(ids[1], ids)) {
    t <- system.time(nn <- knnSearch(big, k = 15, metric = "euclidean",
                                     device = "gpu", devices = use,
                                     progress = FALSE))[["elapsed"]]
    cat(sprintf("n=1M d=50 k=15 euclidean on %d GPU(s): %.2f s (%s)\n",
                length(use), t, attr(nn, "device")))
}
