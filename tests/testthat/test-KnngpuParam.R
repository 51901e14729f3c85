## KnngpuParam through BiocNeighbors' generics and the tools that use them:
## the same neighbours as ExhaustiveParam(), and the same graphs and
## clusters in bluster and scran.

pcaLike <- function(n, p, seed) {
    set.seed(seed)
    centers <- matrix(rnorm(20 * p, sd = 4), 20)
    centers[sample(20, n, TRUE), ] + matrix(rnorm(n * p), n)
}

bnDevices <- function() if (gpuAvailable()) c("cpu", "gpu") else "cpu"

test_that("findKNN and queryKNN equal ExhaustiveParam for each distance", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(1500, 12, 41)
    q <- x[1:60, ] + 0.05
    for (device in bnDevices()) for (metric in c("euclidean", "manhattan",
                                                  "cosine")) {
        mine <- KnngpuParam(metric, device = device)
        theirs <- BiocNeighbors::ExhaustiveParam(
            distance = tools::toTitleCase(metric))
        expect_identical(BiocNeighbors::bndistance(mine),
                         BiocNeighbors::bndistance(theirs))
        got <- BiocNeighbors::findKNN(x, k = 10, BNPARAM = mine)
        ref <- BiocNeighbors::findKNN(x, k = 10, BNPARAM = theirs)
        label <- paste(device, metric)
        expect_identical(got$index, ref$index, label = label)
        expect_equal(got$distance, ref$distance, tolerance = 1e-12,
                     label = label)
        got <- BiocNeighbors::queryKNN(x, q, k = 4, BNPARAM = mine)
        ref <- BiocNeighbors::queryKNN(x, q, k = 4, BNPARAM = theirs)
        expect_identical(got$index, ref$index, label = label)
        expect_equal(got$distance, ref$distance, tolerance = 1e-12)
    }
})

test_that("BiocNeighbors' arguments are honoured", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(800, 6, 42)
    rownames(x) <- paste0("cell", seq_len(nrow(x)))
    mine <- KnngpuParam(device = "cpu")
    theirs <- BiocNeighbors::ExhaustiveParam()
    both <- function(fun, ...) {
        list(got = fun(..., BNPARAM = mine), ref = fun(..., BNPARAM = theirs))
    }
    for (args in list(list(subset = c(10, 3, 700)),
                      list(subset = c("cell5", "cell2")),
                      list(subset = seq_len(800) %% 3 == 0),
                      list(last = 2), list(get.index = FALSE),
                      list(get.distance = FALSE),
                      list(subset = 1:50, last = 1))) {
        r <- do.call(both, c(list(BiocNeighbors::findKNN, x, k = 6), args))
        expect_identical(names(r$got), names(r$ref))
        expect_identical(r$got$index, r$ref$index)
        expect_equal(r$got$distance, r$ref$distance, tolerance = 1e-12)
    }
    r <- both(BiocNeighbors::queryKNN, x, t(x[1:9, ]), k = 3,
              transposed = TRUE, subset = c(2, 9))
    expect_identical(r$got$index, r$ref$index)
    ## Two workers, blocks of rows: the same bits as one process.
    skip_on_os("windows")
    whole <- BiocNeighbors::findKNN(x, k = 6, BNPARAM = mine)
    split <- BiocNeighbors::findKNN(
        x, k = 6, BNPARAM = mine,
        BPPARAM = BiocParallel::MulticoreParam(2))
    expect_identical(split, whole)
    ## A built index is searched again as it is.
    index <- BiocNeighbors::buildIndex(x, BNPARAM = mine)
    expect_s4_class(index, "BiocNeighborIndex")
    expect_identical(BiocNeighbors::findKNN(BNINDEX = index, k = 6), whole)
    expect_identical(BiocNeighbors::queryKNN(BNINDEX = index, query = x[1:5, ],
                                             k = 2),
                     BiocNeighbors::queryKNN(x, x[1:5, ], k = 2,
                                             BNPARAM = mine))
})

test_that("bad input through the class gets knnSearch()'s errors", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(100, 5, 43)
    mine <- KnngpuParam(device = "cpu")
    expect_error(BiocNeighbors::findKNN(x, k = 100, BNPARAM = mine),
                 "'k' must be a whole number from 1 to 99")
    bad <- x
    bad[c(7, 9), 2] <- NA
    expect_error(BiocNeighbors::findKNN(bad, k = 3, BNPARAM = mine),
                 "'X' has NA, NaN or Inf values in rows: 7, 9$")
    expect_error(BiocNeighbors::queryKNN(x, bad, k = 3, BNPARAM = mine),
                 "'query' has NA, NaN or Inf values in rows: 7, 9$")
    expect_error(BiocNeighbors::findKNN(matrix(letters[1:20], 10), k = 3,
                                        BNPARAM = mine),
                 "'X' must be a numeric matrix")
    expect_error(BiocNeighbors::queryKNN(x, x[, 1:3], k = 3, BNPARAM = mine),
                 "'query' has 3 dimensions but 'X' has 5")
    expect_error(BiocNeighbors::findKNN(x, k = 3, subset = 101,
                                        BNPARAM = mine), "'subset' must pick")
    for (args in list(list(get.index = NA), list(get.distance = "yes"),
                      list(last = 0), list(last = NA), list(BPPARAM = 2),
                      list(subset = 1.5), list(subset = c(TRUE, FALSE)))) {
        arg <- names(args)
        expect_error(do.call(BiocNeighbors::findKNN,
                             c(list(x, k = 3, BNPARAM = mine), args)),
                     sprintf("'%s' must", arg), label = arg)
    }
    expect_error(BiocNeighbors::queryKNN(x, x, k = 3, transposed = NA,
                                         BNPARAM = mine),
                 "'transposed' must be TRUE or FALSE")
    expect_error(KnngpuParam("pearson"), "'metric' must be one of")
    expect_error(KnngpuParam(threads = 1e6), "'threads' must be")
    expect_error(KnngpuParam(precision = "fp16"), "'precision' must be one")
    expect_error(KnngpuParam(device = "cpu", precision = "tf32"),
                 "is not a rung of the CPU")
})

test_that("the precision reaches the engine and keeps the bits", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(800, 10, 44)
    got <- lapply(c("auto", "fp32", "fp64"), function(precision) {
        BiocNeighbors::findKNN(x, k = 8, BNPARAM = KnngpuParam(
            device = "cpu", precision = precision))
    })
    expect_identical(got[[2]], got[[1]])
    expect_identical(got[[3]], got[[1]])
    index <- BiocNeighbors::buildIndex(x, BNPARAM = KnngpuParam(
        device = "cpu", precision = "fp64"))
    expect_identical(index@param@precision, "fp64")
})

test_that("bluster's graphs and clusters equal ExhaustiveParam's", {
    skip_if_not_installed("bluster")
    x <- pcaLike(2000, 20, 44)
    theirs <- BiocNeighbors::ExhaustiveParam()
    for (device in bnDevices()) {
        mine <- KnngpuParam(device = device)
        edges <- function(g) igraph::as_edgelist(g, names = FALSE)
        for (make in list(bluster::makeKNNGraph, bluster::makeSNNGraph)) {
            got <- make(x, k = 10, BNPARAM = mine)
            ref <- make(x, k = 10, BNPARAM = theirs)
            expect_identical(edges(got), edges(ref), label = device)
            expect_identical(igraph::E(got)$weight, igraph::E(ref)$weight)
        }
        set.seed(1)
        got <- bluster::clusterRows(x, bluster::NNGraphParam(
            k = 10, BNPARAM = mine, cluster.fun = "louvain"))
        set.seed(1)
        ref <- bluster::clusterRows(x, bluster::NNGraphParam(
            k = 10, BNPARAM = theirs, cluster.fun = "louvain"))
        expect_identical(got, ref, label = device)
    }
})

test_that("SingleCellExperiment: reducedDim cells, and scran's SNN graph", {
    skip_if_not_installed("SingleCellExperiment")
    pcs <- pcaLike(600, 10, 45)
    counts <- matrix(rpois(600 * 30, 2), 30,
                     dimnames = list(NULL, paste0("cell", 1:600)))
    sce <- SingleCellExperiment::SingleCellExperiment(
        assays = list(counts = counts), reducedDims = list(PCA = pcs))
    got <- knnSearch(sce, k = 5, metric = "euclidean", use.dimred = "PCA",
                     device = "cpu")
    plain <- knnSearch(pcs, k = 5, metric = "euclidean", device = "cpu")
    expect_identical(got[c("index", "distance")],
                     plain[c("index", "distance")])
    edges <- knnGraph(sce, k = 5, use.dimred = "PCA", device = "cpu")
    expect_identical(attr(edges, "nodes")$name, colnames(sce))
    expect_identical(edges$from[1], "cell1")
    expect_error(knnGraph(sce, use.dimred = "UMAP"),
                 "'use.dimred' must name one of the reducedDims of 'x': \"PCA")
    for (bad in list(2, NA, c("PCA", "PCA"), 1.5)) {
        expect_error(knnGraph(sce, use.dimred = bad),
                     "'use.dimred' must name one of the reducedDims")
    }
    expect_error(knnGraph(pcs, use.dimred = "PCA"),
                 "'use.dimred' needs 'x' to be a SingleCellExperiment")
    expect_error(knnGraph(sce, use.dimred = "PCA", by = "columns"),
                 "'by' must be \"rows\" with 'use.dimred'")
    skip_if_not_installed("scran")
    mine <- scran::buildSNNGraph(sce, use.dimred = "PCA", k = 8,
                                 BNPARAM = KnngpuParam(device = "cpu"))
    ref <- scran::buildSNNGraph(sce, use.dimred = "PCA", k = 8,
                                BNPARAM = BiocNeighbors::ExhaustiveParam())
    expect_identical(igraph::as_edgelist(mine), igraph::as_edgelist(ref))
    expect_identical(igraph::E(mine)$weight, igraph::E(ref)$weight)
})
