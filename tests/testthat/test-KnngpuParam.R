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

## BiocNeighbors' major version decides some of the interface: 2.x has
## findDistance()/queryDistance(), AsIs k, "transposed" results and
## searches on an index by position; 1.x has `last`, and transposes only
## the query.
bn2 <- function() packageVersion("BiocNeighbors") >= "2.0.0"

## An exact range search to compare with: 1.x's ExhaustiveParam has no
## findNeighbors(), its KmknnParam (exact too) has.
rangeParam <- function(distance = "Euclidean") {
    if (bn2()) BiocNeighbors::ExhaustiveParam(distance = distance)
    else BiocNeighbors::KmknnParam(distance = distance)
}

expectSameKnn <- function(got, ref, label = "") {
    expect_identical(names(got), names(ref), label = label)
    expect_identical(got$index, ref$index, label = label)
    expect_equal(got$distance, ref$distance, tolerance = 1e-12, label = label)
}

## 1.x's range results come in its backend's own order (each point among
## its own neighbours); 2.x's closest first. Sorted by index, they compare
## on both.
expectSameRange <- function(got, ref, label = "") {
    byIndex <- function(res) {
        lapply(seq_along(res$index), function(i) {
            o <- order(res$index[[i]])
            list(res$index[[i]][o], res$distance[[i]][o])
        })
    }
    expect_identical(lengths(got$index), lengths(ref$index), label = label)
    expect_equal(byIndex(got), byIndex(ref), tolerance = 1e-12,
                 label = label)
    if (bn2()) expect_identical(got$index, ref$index, label = label)
}

test_that("BiocNeighbors' arguments are honoured", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(800, 6, 42)
    rownames(x) <- paste0("cell", seq_len(nrow(x)))
    mine <- KnngpuParam(device = "cpu")
    theirs <- BiocNeighbors::ExhaustiveParam()
    both <- function(fun, ...) {
        list(got = fun(..., BNPARAM = mine), ref = fun(..., BNPARAM = theirs))
    }
    cases <- list(list(subset = c(10, 3, 700)),
                  list(subset = c("cell5", "cell2")),
                  list(subset = seq_len(800) %% 3 == 0),
                  list(get.index = FALSE), list(get.distance = FALSE))
    if (bn2()) {
        cases <- c(cases, list(list(get.index = "transposed"),
                               list(get.distance = "transposed",
                                    subset = 4:9),
                               list(num.threads = 2)))
    } else {
        cases <- c(cases, list(list(last = 2), list(subset = 1:50, last = 1)))
    }
    for (args in cases) {
        r <- do.call(both, c(list(BiocNeighbors::findKNN, x, k = 6), args))
        expectSameKnn(r$got, r$ref, label = paste(names(args)))
    }
    ## 2.x: transposed is both X's and the query's layout; 1.x: the
    ## query's alone.
    r <- both(BiocNeighbors::queryKNN, if (bn2()) t(x) else x, t(x[1:9, ]),
              k = 3, transposed = TRUE, subset = c(2, 9))
    expectSameKnn(r$got, r$ref, label = "transposed query")
    r <- both(BiocNeighbors::findKNN, t(x), k = 4, transposed = TRUE)
    expectSameKnn(r$got, r$ref, label = "transposed")
    ## Anything knnSearch() takes, such as a data.frame, is searched too.
    expect_identical(BiocNeighbors::findKNN(as.data.frame(x), k = 4,
                                            BNPARAM = mine),
                     BiocNeighbors::findKNN(x, k = 4, BNPARAM = mine))
    ## Two workers, blocks of rows: the same bits as one process.
    skip_on_os("windows")
    whole <- BiocNeighbors::findKNN(x, k = 6, BNPARAM = mine)
    split <- BiocNeighbors::findKNN(
        x, k = 6, BNPARAM = mine,
        BPPARAM = BiocParallel::MulticoreParam(2))
    expect_identical(split, whole)
})

test_that("a built index is searched again, by position and as BNINDEX", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(500, 5, 46)
    q <- x[1:7, ] + 0.1
    mine <- KnngpuParam(device = "cpu")
    index <- BiocNeighbors::buildIndex(x, BNPARAM = mine)
    expect_s4_class(index, "BiocNeighborIndex")
    whole <- BiocNeighbors::findKNN(x, k = 6, BNPARAM = mine)
    queried <- BiocNeighbors::queryKNN(x, q, k = 2, BNPARAM = mine)
    expect_identical(BiocNeighbors::findKNN(BNINDEX = index, k = 6), whole)
    expect_identical(BiocNeighbors::queryKNN(BNINDEX = index, query = q,
                                             k = 2), queried)
    near <- BiocNeighbors::findNeighbors(x, threshold = 1, BNPARAM = mine)
    expect_identical(BiocNeighbors::findNeighbors(BNINDEX = index,
                                                  threshold = 1), near)
    ## 2.x searches an index given as X; 1.x takes it only as BNINDEX.
    if (bn2()) {
        expect_identical(BiocNeighbors::findKNN(index, k = 6), whole)
        expect_identical(BiocNeighbors::queryKNN(index, q, k = 2), queried)
        expect_identical(BiocNeighbors::findKNN(index, k = 6,
                                                BNPARAM = mine), whole)
        expect_identical(BiocNeighbors::findDistance(index, k = 6),
                         whole$distance[, 6])
        expect_identical(BiocNeighbors::queryDistance(index, q, k = 2),
                         queried$distance[, 2])
        expect_identical(BiocNeighbors::findNeighbors(index, threshold = 1),
                         near)
    }
})

test_that("k larger than the points there are is capped with a warning", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(30, 4, 47)
    mine <- KnngpuParam(device = "cpu")
    theirs <- BiocNeighbors::ExhaustiveParam()
    for (param in list(mine, theirs)) {
        expect_warning(BiocNeighbors::findKNN(x, k = 40, BNPARAM = param),
                       "'k' capped at the number of observations minus 1")
        expect_warning(BiocNeighbors::queryKNN(x, x[1:2, ], k = 40,
                                               BNPARAM = param),
                       "'k' capped at the number of observations$")
    }
    got <- suppressWarnings(BiocNeighbors::findKNN(x, k = 40, BNPARAM = mine))
    ref <- suppressWarnings(BiocNeighbors::findKNN(x, k = 40,
                                                   BNPARAM = theirs))
    expectSameKnn(got, ref, "findKNN")
    expect_identical(dim(got$index), c(30L, 29L))
    got <- suppressWarnings(BiocNeighbors::queryKNN(x, x[1:2, ], k = 40,
                                                    BNPARAM = mine))
    ref <- suppressWarnings(BiocNeighbors::queryKNN(x, x[1:2, ], k = 40,
                                                    BNPARAM = theirs))
    expectSameKnn(got, ref, "queryKNN")
    ## bluster clusters small subsets with k above their size.
    skip_if_not_installed("bluster")
    set.seed(1)
    got <- suppressWarnings(bluster::clusterRows(x[1:8, ],
        bluster::NNGraphParam(k = 10, BNPARAM = mine)))
    set.seed(1)
    ref <- suppressWarnings(bluster::clusterRows(x[1:8, ],
        bluster::NNGraphParam(k = 10, BNPARAM = theirs)))
    expect_identical(got, ref)
})

test_that("2.x: AsIs k, findDistance and queryDistance", {
    skip_if_not_installed("BiocNeighbors")
    ## These exist from BiocNeighbors 2.0 on.
    skip_if(!bn2(), "BiocNeighbors 1.x has no AsIs k or findDistance")
    x <- pcaLike(400, 5, 48)
    q <- x[1:5, ] + 0.2
    mine <- KnngpuParam(device = "cpu")
    theirs <- BiocNeighbors::ExhaustiveParam()
    for (metric in c("Euclidean", "Manhattan", "Cosine")) {
        mine <- KnngpuParam(distance = metric, device = "cpu")
        theirs <- BiocNeighbors::ExhaustiveParam(distance = metric)
        k <- I(rep(c(1, 4, 2, 7), 100))
        got <- BiocNeighbors::findKNN(x, k = k, BNPARAM = mine)
        ref <- BiocNeighbors::findKNN(x, k = k, BNPARAM = theirs)
        expect_type(got$index, "list")
        expectSameKnn(got, ref, metric)
        got <- BiocNeighbors::queryKNN(x, q, k = I(1:5), BNPARAM = mine)
        ref <- BiocNeighbors::queryKNN(x, q, k = I(1:5), BNPARAM = theirs)
        expectSameKnn(got, ref, metric)
        expect_equal(BiocNeighbors::findDistance(x, k = 5, BNPARAM = mine),
                     BiocNeighbors::findDistance(x, k = 5, BNPARAM = theirs),
                     tolerance = 1e-12)
        expect_equal(BiocNeighbors::findDistance(x, k = k, subset = NULL,
                                                 BNPARAM = mine),
                     BiocNeighbors::findDistance(x, k = k, BNPARAM = theirs),
                     tolerance = 1e-12)
        expect_equal(BiocNeighbors::queryDistance(x, q, k = 3,
                                                  BNPARAM = mine),
                     BiocNeighbors::queryDistance(x, q, k = 3,
                                                  BNPARAM = theirs),
                     tolerance = 1e-12)
    }
    expect_error(BiocNeighbors::findKNN(x, k = I(1:3), BNPARAM = mine),
                 "'k' \\(AsIs\\) must have one number per point")
    expect_error(BiocNeighbors::findKNN(x, k = 2, get.index = "yes",
                                        BNPARAM = mine),
                 "'get.index' must be TRUE, FALSE or \"transposed\"")
    expect_error(BiocNeighbors::findKNN(x, k = 2, num.threads = 0,
                                        BNPARAM = mine),
                 "'num.threads' must be a whole number")
})

test_that("range searches equal an exact backend's, on every device", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(700, 4, 49)
    q <- x[1:20, ] + 0.3
    for (device in bnDevices()) for (metric in c("Euclidean", "Manhattan",
                                                  "Cosine")) {
        mine <- KnngpuParam(distance = metric, device = device)
        theirs <- rangeParam(metric)
        threshold <- c(Euclidean = 1.5, Manhattan = 2.5, Cosine = 0.3)[[
            metric]]
        label <- paste(device, metric)
        got <- BiocNeighbors::findNeighbors(x, threshold = threshold,
                                            BNPARAM = mine)
        ref <- BiocNeighbors::findNeighbors(x, threshold = threshold,
                                            BNPARAM = theirs)
        expectSameRange(got, ref, label)
        ## Some points have more neighbours than the first search's k
        ## (.bnRange() starts at 16), so the search grew.
        expect_gt(max(lengths(got$index)), 16)
        got <- BiocNeighbors::queryNeighbors(x, q, threshold = threshold,
                                             BNPARAM = mine)
        ref <- BiocNeighbors::queryNeighbors(x, q, threshold = threshold,
                                             BNPARAM = theirs)
        expectSameRange(got, ref, label)
        per <- seq(0.1, 2, length.out = 20) * threshold
        got <- BiocNeighbors::queryNeighbors(x, q, threshold = per,
                                             subset = 1:20, BNPARAM = mine)
        ref <- BiocNeighbors::queryNeighbors(x, q, threshold = per,
                                             subset = 1:20, BNPARAM = theirs)
        expectSameRange(got, ref, paste(label, "per point"))
    }
})

test_that("a point exactly at the threshold is a neighbour", {
    skip_if_not_installed("BiocNeighbors")
    ## A grid: distances 1, sqrt(2), 2 are exact ties in float64.
    grid <- as.matrix(expand.grid(0:5, 0:5, 0:2))
    storage.mode(grid) <- "double"
    d <- as.matrix(stats::dist(grid))
    diag(d) <- Inf
    for (device in bnDevices()) for (threshold in c(1, sqrt(2), 2)) {
        mine <- KnngpuParam(device = device)
        got <- BiocNeighbors::findNeighbors(grid, threshold = threshold,
                                            BNPARAM = mine)
        own <- if (bn2()) 0L else 1L  # 1.x counts the point itself
        expect_identical(lengths(got$index),
                         as.integer(rowSums(d <= threshold)) + own,
                         label = paste(device, threshold))
        expect_true(all(unlist(got$distance) <= threshold))
    }
})

test_that("bluster's DBSCAN and neighbour purity equal an exact backend's", {
    skip_if_not_installed("bluster")
    x <- pcaLike(600, 5, 50)
    mine <- KnngpuParam(device = "cpu")
    theirs <- rangeParam()
    got <- bluster::clusterRows(x, bluster::DbscanParam(BNPARAM = mine))
    ref <- bluster::clusterRows(x, bluster::DbscanParam(BNPARAM = theirs))
    expect_identical(got, ref)
    expect_gt(nlevels(got), 1L)
    clusters <- kmeans(x, 5, nstart = 1)$cluster
    expect_equal(bluster::neighborPurity(x, clusters, BNPARAM = mine),
                 bluster::neighborPurity(x, clusters, BNPARAM = theirs),
                 tolerance = 1e-12)
})

test_that("bad input through the class gets knnSearch()'s errors", {
    skip_if_not_installed("BiocNeighbors")
    x <- pcaLike(100, 5, 43)
    mine <- KnngpuParam(device = "cpu")
    expect_error(BiocNeighbors::findKNN(x, k = 2.5, BNPARAM = mine),
                 "'k' must be a whole number of at least 1")
    expect_error(BiocNeighbors::findKNN(x[1, , drop = FALSE], k = 1,
                                        BNPARAM = mine),
                 "'X' needs at least 2 points")
    expect_error(BiocNeighbors::findNeighbors(x, threshold = -1,
                                              BNPARAM = mine),
                 "'threshold' must be a distance of at least 0")
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
    cases <- list(list(get.index = NA), list(get.distance = "yes"),
                  list(BPPARAM = 2), list(subset = 1.5),
                  list(subset = c(TRUE, FALSE)))
    ## `last` is an argument of 1.x only.
    if (!bn2()) cases <- c(cases, list(list(last = 0), list(last = NA)))
    for (args in cases) {
        arg <- names(args)
        expect_error(do.call(BiocNeighbors::findKNN,
                             c(list(x, k = 3, BNPARAM = mine), args)),
                     sprintf("'%s' must", arg), label = arg)
    }
    expect_error(BiocNeighbors::queryKNN(x, x, k = 3, transposed = NA,
                                         BNPARAM = mine),
                 "'transposed' must be TRUE or FALSE")
    expect_error(KnngpuParam("pearson"), "'metric' must be one of")
    expect_error(KnngpuParam(distance = "euclidean"),
                 "'distance' must be one of \"Euclidean\"")
    expect_identical(KnngpuParam(distance = "Manhattan", device = "cpu"),
                     KnngpuParam("manhattan", device = "cpu"))
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
