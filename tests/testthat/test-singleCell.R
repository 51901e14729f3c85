## The single-cell defaults (R/singleCell.R): Euclidean on reduced
## dimensions, logcounts where there are some, and the result saying
## which was searched.

sceLike <- function(seed) {
    set.seed(seed)
    counts <- matrix(rpois(40 * 120, 3), 40,
                     dimnames = list(paste0("gene", 1:40),
                                     paste0("cell", 1:120)))
    pcs <- matrix(rnorm(120 * 6), 120)
    SingleCellExperiment::SingleCellExperiment(
        assays = list(counts = counts, logcounts = log2(counts + 1)),
        reducedDims = list(PCA = pcs))
}

test_that("use.dimred searches Euclidean by default, as scran does", {
    skip_if_not_installed("SingleCellExperiment")
    sce <- sceLike(51)
    pcs <- SingleCellExperiment::reducedDim(sce, "PCA")
    got <- knnGraph(sce, k = 4, use.dimred = "PCA", device = "cpu")
    ref <- knnGraph(pcs, k = 4, metric = "euclidean", device = "cpu")
    expect_identical(attr(got, "metric"), "euclidean")
    expect_identical(got$distance, ref$distance)
    expect_identical(attr(got, "reducedDim"), "PCA")
    expect_null(attr(got, "assay"))
    nn <- knnSearch(sce, k = 3, use.dimred = 1, device = "cpu")
    expect_identical(nn$index, knnSearch(pcs, k = 3, metric = "euclidean",
                                         device = "cpu")$index)
    expect_identical(attr(nn, "reducedDim"), 1)
    ## A metric given is the metric used.
    pearson <- knnGraph(sce, k = 4, use.dimred = "PCA", metric = "pearson",
                        device = "cpu")
    expect_identical(attr(pearson, "metric"), "pearson")
    ## Without use.dimred the default stays Pearson, co-expression's.
    expect_identical(attr(knnGraph(sce, k = 4, device = "cpu"), "metric"),
                     "pearson")
})

test_that("logcounts is searched where it exists, and the result says so", {
    skip_if_not_installed("SingleCellExperiment")
    sce <- sceLike(52)
    logs <- SummarizedExperiment::assay(sce, "logcounts")
    for (by in c("columns", "rows")) {
        got <- knnSearch(sce, k = 3, by = by, metric = "euclidean",
                         device = "cpu")
        ref <- knnSearch(logs, k = 3, by = by, metric = "euclidean",
                         device = "cpu")
        expect_identical(got$distance, ref$distance, label = by)
        expect_identical(attr(got, "assay"), "logcounts")
    }
    counts <- knnGraph(sce, k = 3, by = "columns", assay = "counts",
                       device = "cpu")
    expect_identical(attr(counts, "assay"), "counts")
    expect_identical(counts$distance, knnGraph(
        SummarizedExperiment::assay(sce, "counts"), k = 3, by = "columns",
        device = "cpu")$distance)
    ## Without logcounts, the first assay, named.
    se <- SummarizedExperiment::SummarizedExperiment(
        assays = list(raw = logs, other = logs + 1))
    expect_identical(attr(knnGraph(se, k = 3, by = "columns",
                                   device = "cpu"), "assay"), "raw")
    expect_identical(attr(knnSearch(se, k = 3, assay = 2, device = "cpu"),
                          "assay"), "other")
    expect_null(attr(knnSearch(logs, k = 3, device = "cpu"), "assay"))
})
