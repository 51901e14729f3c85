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

test_that("the nodes' annotation reaches the node table and igraph", {
    skip_if_not_installed("SummarizedExperiment")
    x <- randomMatrix(40, 6, 55)
    dimnames(x) <- list(paste0("g", 1:40), paste0("s", 1:6))
    se <- SummarizedExperiment::SummarizedExperiment(
        list(exprs = x),
        rowData = data.frame(symbol = paste0("SYM", 1:40), name = 1:40,
                             list = I(as.list(1:40))),
        colData = data.frame(group = rep(c("a", "b"), 3)))
    nodes <- attr(knnGraph(se, k = 3, device = "cpu"), "nodes")
    expect_identical(names(nodes), c("name", "symbol", "name.1"))
    expect_identical(nodes$symbol, paste0("SYM", 1:40))
    samples <- attr(knnGraph(se, k = 2, by = "columns", device = "cpu"),
                    "nodes")
    expect_identical(samples$group, rep(c("a", "b"), 3))
    expect_identical(names(attr(knnGraph(x, k = 3, device = "cpu"),
                                "nodes")), "name")
    skip_if_not_installed("igraph")
    g <- toIgraph(knnGraph(se, k = 3, device = "cpu"))
    expect_identical(igraph::V(g)$symbol, paste0("SYM", 1:40))
    skip_if_not_installed("Biobase")
    eset <- Biobase::ExpressionSet(
        x, featureData = Biobase::AnnotatedDataFrame(
            data.frame(chr = rep(1:4, 10), row.names = rownames(x))))
    expect_identical(attr(knnGraph(eset, k = 3, device = "cpu"),
                          "nodes")$chr, rep(1:4, 10))
})

test_that("a samples x genes matrix left to by = \"rows\" gets a message", {
    set.seed(56)
    datExpr <- matrix(rnorm(12 * 200), 12, 200,
                      dimnames = list(paste0("GSM", 1:12),
                                      paste0(1000 + 1:200, "_at")))
    expect_message(knnGraph(datExpr, k = 3, device = "cpu"),
                   "graph of 12 samples.*by = \"columns\"")
    expect_message(knnGraph(as.data.frame(datExpr), k = 3, device = "cpu"),
                   "columns named like genes")
    expect_message(knnSearch(datExpr, k = 3, device = "cpu"),
                   "WGCNA's datExpr")
    symbols <- datExpr
    colnames(symbols) <- paste0(c("TP", "ACT", "GAPD", "Cd"), 1:200)
    expect_message(knnGraph(symbols, k = 3, device = "cpu"), "like genes")
    quiet <- function(...) expect_no_message(knnGraph(..., device = "cpu"))
    quiet(datExpr, k = 3, by = "rows")
    quiet(datExpr, k = 3, by = "columns")
    quiet(t(datExpr), k = 3)                       # genes x samples
    cells <- matrix(rnorm(500 * 10), 500, 10,
                    dimnames = list(paste0("cell", 1:500),
                                    paste0("PC", 1:10)))
    quiet(cells, k = 3)                            # cells x PCs
    wide <- matrix(rnorm(5 * 100), 5, 100,
                   dimnames = list(NULL, paste0("Sample", 1:100)))
    quiet(wide, k = 2)                             # samples as columns
    quiet(unname(datExpr), k = 3)                  # no names to judge
})
