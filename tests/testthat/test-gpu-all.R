## The GPU on real expression data: the ALL microarray set (12625 probe sets
## x 128 samples), genes as nodes and samples as nodes.

test_that("ALL: GPU equals CPU for genes and for samples", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_if_not_installed("ALL")
    skip_if_not_installed("Biobase")
    env <- new.env()
    utils::data("ALL", package = "ALL", envir = env)
    expr <- Biobase::exprs(env$ALL)
    for (metric in c("pearson", "spearman", "cosine", "euclidean",
                     "abspearson", "manhattan", "sqeuclidean")) {
        expectGpuIdentical(expr, 10, metric, label = "ALL genes")
    }
    for (k in c(1, 100, 1000)) {
        expectGpuIdentical(expr, k, "pearson", label = "ALL genes")
    }
    for (metric in allMetrics) for (k in c(1, 16, 100)) {
        expectGpuIdentical(expr, k, metric, by = "columns",
                           label = "ALL samples")
    }
})
