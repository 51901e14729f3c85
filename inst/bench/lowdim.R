## Where the CPU's exact k-d tree beats the product scan: times both
## (options(knngpu.algorithm = "tree" | "products")) on the same data, k =
## 15, Euclidean, over features p and nodes n, on N(0,1) and on tied
## small-integer data; checks that both give identical results; prints the
## table and the (p, n) region where the tree wins in every data kind. Those
## bounds are KNN_KD_MAX_FEATURES and KNN_KD_MIN_NODES in
## src/engine/knn_kdtree.h; the last run's table is in RESULTS.md.
##
## Then the headline cases: the graph of 200000 nodes x 1 and x 3 features
## (k = 15, Euclidean and Manhattan, N(0,1) and 4-valued tied data), with
## FNN's kd-tree (Euclidean, approximate ties) beside it.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript inst/bench/lowdim.R [--max-p=8]

suppressPackageStartupMessages(library(knngpu))

args <- commandArgs(trailingOnly = TRUE)
hit <- grep("^--max-p=", args, value = TRUE)
maxP <- if (length(hit)) as.integer(sub("^--max-p=", "", hit)) else 8L
k <- 15L

timeWith <- function(algorithm, x) {
    old <- options(knngpu.algorithm = algorithm)
    on.exit(options(old))
    reps <- 3L
    times <- numeric(reps)
    for (r in seq_len(reps)) {
        start <- Sys.time()
        res <- knnSearch(x, k = k, metric = "euclidean", device = "cpu",
                         progress = FALSE)
        times[r] <- as.numeric(Sys.time()) - as.numeric(start)
        if (times[r] > 2) break
    }
    list(seconds = min(times[times > 0]), result = res)
}

set.seed(20261123)
rows <- list()
for (p in seq_len(maxP)) for (n in c(500L, 2000L, 8000L, 32000L)) {
    data <- list(normal = matrix(rnorm(n * p), n),
                 tied = matrix(sample(0:3, n * p, TRUE), n))
    for (kind in names(data)) {
        tree <- timeWith("tree", data[[kind]])
        scan <- timeWith("products", data[[kind]])
        same <- identical(tree$result[c("index", "distance")],
                          scan$result[c("index", "distance")])
        rows[[length(rows) + 1L]] <- data.frame(
            p = p, n = n, data = kind, tree_s = signif(tree$seconds, 3),
            products_s = signif(scan$seconds, 3),
            ratio = signif(tree$seconds / scan$seconds, 3), identical = same)
    }
}
table <- do.call(rbind, rows)
cat(sprintf("# %s, %s, %d threads\n", format(Sys.time(), "%Y-%m-%d"),
            R.version.string, parallel::detectCores()))
print(table, row.names = FALSE)
wins <- aggregate(ratio ~ p + n, table, max)
wins <- wins[wins$ratio < 1, ]
cat("\nthe tree wins on every data kind at (p, n):\n")
print(wins[order(wins$p, wins$n), ], row.names = FALSE)
stopifnot(all(table$identical))

seconds <- function(expr) {
    start <- Sys.time()
    force(expr)
    as.numeric(Sys.time()) - as.numeric(start)
}
cat("\n200000 nodes, k = 15, seconds (knngpu CPU; FNN::get.knn kd-tree):\n")
head <- list()
for (p in c(1L, 3L)) for (kind in c("normal", "tied")) {
    x <- if (kind == "normal") matrix(rnorm(200000 * p), ncol = p)
         else matrix(sample(0:3, 200000 * p, TRUE), ncol = p)
    for (metric in c("euclidean", "manhattan")) {
        s <- seconds(knnGraph(x, k = k, metric = metric, device = "cpu",
                              progress = FALSE))
        fnn <- if (metric == "euclidean" && requireNamespace("FNN",
                                                            quietly = TRUE))
            seconds(FNN::get.knn(x, k = k)) else NA_real_
        head[[length(head) + 1L]] <- data.frame(
            p = p, data = kind, metric = metric, knngpu_s = signif(s, 3),
            fnn_s = signif(fnn, 3))
    }
}
print(do.call(rbind, head), row.names = FALSE)
