## Inputs read in blocks (R/nodes.R): DelayedArray/HDF5Array matrices, also
## in a SummarizedExperiment, and sparse matrices give the bits of the
## dense matrix; unreadable blocks and layouts too large name the argument.

denseEdges <- function(x, ...) {
    lapply(c(knnGraph(x, device = "cpu", progress = FALSE, ...)), identity)
}

test_that("HDF5Array inputs, read in blocks, give the dense result", {
    skip_if_not_installed("HDF5Array")
    x <- tiedMatrix(400, 12, 51)
    dimnames(x) <- list(paste0("g", 1:400), paste0("s", 1:12))
    h5 <- HDF5Array::writeHDF5Array(x, tempfile(fileext = ".h5"), "x",
                                    with.dimnames = TRUE)
    ## Small blocks, so that the reader takes many.
    old <- DelayedArray::setAutoBlockSize(2000)
    on.exit(DelayedArray::setAutoBlockSize(old))
    for (by in c("rows", "columns")) {
        k <- if (by == "rows") 6 else 3
        expect_identical(denseEdges(h5, k = k, by = by, metric = "cosine"),
                         denseEdges(x, k = k, by = by, metric = "cosine"))
    }
    found <- knnSearch(h5, h5[1:7, ], k = 4, metric = "euclidean",
                       device = "cpu")
    expect_identical(found[c("index", "distance")],
                     knnSearch(x, x[1:7, ], k = 4, metric = "euclidean",
                               device = "cpu")[c("index", "distance")])
    skip_if_not_installed("SummarizedExperiment")
    se <- SummarizedExperiment::SummarizedExperiment(
        list(counts = h5, logcounts = log1p(h5)))
    expect_identical(denseEdges(se, k = 5, assay = "logcounts"),
                     denseEdges(log1p(x), k = 5))
    ## With workers: each reads the file itself.
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    expect_true(knngpu:::.fileBacked(knngpu:::.nodeSource(h5, "rows")))
    expect_identical(
        denseEdges(h5, k = 5, BPPARAM = BiocParallel::SnowParam(2)),
        denseEdges(x, k = 5))
})

test_that("sparse matrices give the dense result", {
    skip_if_not_installed("Matrix")
    set.seed(52)
    sparse <- Matrix::rsparsematrix(300, 2000, 0.05)
    rownames(sparse) <- paste0("r", 1:300)
    dense <- as.matrix(sparse)
    expect_identical(denseEdges(sparse, k = 5, metric = "cosine"),
                     denseEdges(dense, k = 5, metric = "cosine"))
    expect_identical(denseEdges(sparse, k = 5, by = "columns",
                                metric = "euclidean"),
                     denseEdges(dense, k = 5, by = "columns",
                                metric = "euclidean"))
})

test_that("unreadable or unallocatable inputs name the argument", {
    skip_if_not_installed("HDF5Array")
    x <- tiedMatrix(50, 5, 53)
    path <- tempfile(fileext = ".h5")
    h5 <- HDF5Array::writeHDF5Array(x, path, "x")
    unlink(path)
    expect_error(knnGraph(h5, k = 3, device = "cpu"),
                 "could not read 'x': .*does not exist")
    expect_error(knngpu:::.allocLayout(list(arg = "x", p = 1e5), 1e9),
                 "'x' needs 727.6 TB of memory as the engine's dense")
    h5na <- HDF5Array::writeHDF5Array(rbind(x, NA), tempfile(fileext = ".h5"),
                                      "x")
    expect_error(knnGraph(h5na, k = 3, device = "cpu"),
                 "'x' has NA, NaN or Inf values in rows: 51")
    expect_error(knnGraph(Matrix::Matrix(x > 1, sparse = TRUE), k = 3),
                 "'x' must be a numeric matrix")
})

test_that("a large matrix's node layout (several threads) is its transpose", {
    ## Above the size where the layout's transpose goes parallel, with
    ## sides that are not multiples of its 32 x 32 blocks.
    x <- randomMatrix(1001, 301, 54)
    expect_identical(.Call(knngpu:::C_knn_nodes, x, TRUE, 3L), t(x))
    counts <- matrix(rpois(1001 * 301, 3), 1001)
    expect_identical(.Call(knngpu:::C_knn_nodes, counts, TRUE, 0L),
                     t(counts) * 1.0)
    expect_identical(
        knnSearch(x, k = 4, device = "cpu")[c("index", "distance")],
        knnSearch(t(x), k = 4, by = "columns",
                  device = "cpu")[c("index", "distance")])
})
