## Co-expression (R/coexpr.R, src/engine/knn_coexpr.c): metric = "bicor"
## and use = "pairwise.complete.obs" against WGCNA's bicor() and
## stats::cor(use = "pairwise.complete.obs") plus order(distance, index).

## Neighbours of each row by the n x n similarity matrix s (NA: no pair),
## as knnSearch() returns them: n x k index and distance, NA-filled.
refFromSimilarity <- function(s, k, self = TRUE, digits = 10) {
    d <- 1 - s
    dimnames(d) <- NULL
    if (self) diag(d) <- NA
    index <- t(apply(d, 1, function(row) {
        ok <- which(!is.na(row))
        picked <- ok[order(round(row[ok], digits), ok)]
        c(picked, rep(NA_integer_, k))[seq_len(k)]
    }))
    distance <- matrix(d[cbind(rep(seq_len(nrow(d)), k), as.vector(index))],
                       ncol = k)
    list(index = index, distance = distance)
}

expectNeighbours <- function(found, reference) {
    expect_identical(found$index, reference$index)
    expect_equal(found$distance, reference$distance, tolerance = 1e-12)
}

test_that("bicor equals WGCNA's, its zero-MAD fallback included", {
    skip_if_not_installed("WGCNA")
    x <- randomMatrix(150, 30, 61)
    x[1:5, ] <- x[1:5, ] * 5 + 3
    x[7, ] <- c(rep(2, 20), rnorm(10))  # MAD 0: Pearson for this node
    x[9, 3] <- 40                        # an outlier the weights suppress
    s <- suppressWarnings(WGCNA::bicor(t(x)))
    found <- knnSearch(x, k = 6, metric = "bicor", device = "cpu")
    expectNeighbours(found, refFromSimilarity(s, 6))
    edges <- knnGraph(x, k = 6, metric = "bicor", device = "cpu")
    expect_equal(edges$weight, 1 - edges$distance, tolerance = 1e-15)
    q <- randomMatrix(4, 30, 62)
    near <- knnSearch(x, q, k = 3, metric = "bicor", device = "cpu")
    cross <- suppressWarnings(WGCNA::bicor(t(q), t(x)))
    expectNeighbours(near, refFromSimilarity(cross, 3, self = FALSE))
    constant <- rbind(x, 1)
    expect_error(knnSearch(constant, k = 3, metric = "bicor",
                           device = "cpu"),
                 "1 constant rows, for which the bicor metric is undefined")
    with_na <- x
    with_na[3, 3] <- NA
    expect_error(knnSearch(with_na, k = 3, metric = "bicor", device = "cpu"),
                 "NA, NaN or Inf values in rows: 3")
})

test_that("pairwise-complete correlations equal cor() and WGCNA's bicor()", {
    skip_if_not_installed("ALL")
    skip_if_not_installed("WGCNA")
    for (share in c(0.005, 0.05)) {
        x <- allWithMissing(300, share, 63)
        x[11, 1:100] <- NA  # fewer shared samples than most pairs
        r <- stats::cor(t(x), use = "pairwise.complete.obs")
        found <- knnSearch(x, k = 10, use = "pairwise.complete.obs",
                           device = "cpu", min.shared = 1)
        expectNeighbours(found, refFromSimilarity(r, 10))
        expect_identical(attr(found, "backend"), "cpu")
        expect_match(attr(found, "precision"), "pairwise-complete")
        abs <- knnSearch(x, k = 10, metric = "abspearson",
                         use = "pairwise.complete.obs", device = "cpu",
                         min.shared = 1)
        expectNeighbours(abs, refFromSimilarity(abs(r), 10))
        b <- suppressWarnings(WGCNA::bicor(t(x), use = "p"))
        robust <- knnSearch(x, k = 10, metric = "bicor",
                            use = "pairwise.complete.obs", device = "cpu",
                            min.shared = 1)
        expectNeighbours(robust, refFromSimilarity(b, 10))
    }
    ## Cosine over the shared samples, and query nodes.
    y <- x[1:40, ]
    shared <- !is.na(y)
    z <- ifelse(shared, y, 0)
    cosine <- crossprod(t(z)) /
        sqrt(tcrossprod(z^2, shared + 0) * t(tcrossprod(z^2, shared + 0)))
    expectNeighbours(knnSearch(y, k = 5, metric = "cosine",
                               use = "pairwise.complete.obs", device = "cpu"),
                     refFromSimilarity(cosine, 5))
    q <- x[41:45, ]
    near <- knnSearch(y, q, k = 4, use = "pairwise.complete.obs",
                      device = "cpu")
    cross <- stats::cor(t(q), t(y), use = "pairwise.complete.obs")
    expectNeighbours(near, refFromSimilarity(cross, 4, self = FALSE))
})

test_that("the screen keeps every neighbour of tied and hard data", {
    ## Small integers tie everywhere (duplicated rows too); levels and
    ## near-duplicates crowd every node's k-th place: the candidates from
    ## the products must still hold the exact best k, ties included. The
    ## reference rounds distances where exact ties must tie (their keys
    ## are exact: knn_pw_corr_integers); near-duplicates differ by 1e-14,
    ## where cor()'s long double and knngpu's float64 order them each
    ## their own way, so there each node's k best distances are compared.
    cases <- list(tied = tiedMatrix(250, 14, 68),
                  levels = hardMatrix("levels", 250, 69),
                  neardup = hardMatrix("neardup", 250, 70))
    digits <- c(tied = 10, levels = 15, neardup = 15)
    for (name in names(cases)) {
        x <- cases[[name]]
        set.seed(71)
        x[sample(length(x), round(0.08 * length(x)))] <- NA
        for (metric in c("pearson", "abspearson")) {
            ## A few pairs are constant on their shared samples: NA.
            r <- suppressWarnings(stats::cor(t(x),
                                             use = "pairwise.complete.obs"))
            if (metric == "abspearson") r <- abs(r)
            found <- knnSearch(x, k = 7, metric = metric, device = "cpu",
                               use = "pairwise.complete.obs", min.shared = 1)
            reference <- refFromSimilarity(r, 7, digits = digits[[name]])
            if (name == "neardup") {
                expect_lt(max(abs(found$distance - reference$distance)),
                          1e-13, label = paste(name, metric))
            } else {
                expect_identical(found$index, reference$index,
                                 label = paste(name, metric))
            }
        }
    }
})

test_that("pairs sharing fewer than min.shared features are no neighbours", {
    x <- randomMatrix(60, 12, 64)
    x[1, 1:8] <- NA        # 4 samples left
    x[2, 4:12] <- NA       # 3 samples left, none shared with node 1
    x[3, ] <- c(rep(1, 6), 2, rep(1, 5))
    x[3, 7] <- NA          # constant on the samples it has
    found <- knnSearch(x, k = 59, use = "pairwise.complete.obs",
                       device = "cpu", min.shared = 4)
    expect_true(all(is.na(found$index[2:3, ])))
    expect_true(all(is.na(found$distance[2:3, ])))
    expect_identical(sum(is.na(found$index[1, ])), 2L)
    expect_false(any(found$index %in% 2:3))
    fewer <- knnSearch(x, k = 59, use = "pairwise.complete.obs",
                       device = "cpu", min.shared = 5)
    expect_true(all(is.na(fewer$index[1, ])))
    expect_false(any(fewer$index %in% 1:3))
    edges <- knnGraph(x, k = 5, use = "pairwise.complete.obs",
                      device = "cpu", min.shared = 4)
    expect_identical(nrow(edges), 58L * 5L)
    expect_false(any(c(edges$from, edges$to) %in% 2:3))
    expect_identical(nrow(attr(edges, "nodes")), 60L)
    expect_identical(attr(edges, "use"), "pairwise.complete.obs")
    expect_false(anyNA(edges))
    expect_error(knnGraph(x, k = 5, use = "pairwise.complete.obs",
                          snn = "rank", device = "cpu"),
                 "'snn' needs k neighbours of every node")
    union <- knnGraph(x, k = 5, use = "pairwise.complete.obs",
                      symmetrize = "union", device = "cpu")
    expect_true(all(union$from < union$to))
})

test_that("use = \"pairwise.complete.obs\" on complete data is the search", {
    x <- tiedMatrix(200, 9, 65)
    for (metric in c("pearson", "bicor")) {
        plain <- knnGraph(x, k = 5, metric = metric, device = "cpu")
        pairwise <- knnGraph(x, k = 5, metric = metric, device = "cpu",
                             use = "pairwise.complete.obs")
        expect_identical(c(pairwise), c(plain))
        expect_identical(attr(pairwise, "precision"),
                         attr(plain, "precision"))
    }
})

test_that("missing values: bad requests are refused with clear messages", {
    x <- randomMatrix(40, 10, 66)
    x[2, 2] <- NA
    expect_error(knnSearch(x, k = 3, device = "cpu"),
                 "'x' has NA, NaN or Inf values in rows: 2")
    if (!gpuAvailable()) {
        expect_error(knnSearch(x, k = 3, device = "gpu",
                               use = "pairwise.complete.obs"),
                     "device = \"gpu\" but no GPU can be used")
    }
    expect_error(knnSearch(x, k = 3, metric = "euclidean",
                           use = "pairwise.complete.obs"),
                 "'use = \"pairwise.complete.obs\"' needs a correlation")
    expect_error(knnSearch(x, k = 3, use = "complete"), "'use' must be one")
    expect_error(knnSearch(x, k = 3, use = "pairwise.complete.obs",
                           min.shared = 0), "'min.shared' must be a whole")
    expect_error(knnSearch(randomMatrix(9, 3, 1), k = 3,
                           use = "pairwise.complete.obs"),
                 "'min.shared' \\(4\\) is more than the 3 features")
    x[5, 5] <- Inf
    expect_error(knnSearch(x, k = 3, use = "pairwise.complete.obs",
                           device = "cpu"),
                 "'x' has Inf values in rows: 5; only NA and NaN")
})

test_that("missing values through BPPARAM, HDF5Array and KnngpuParam", {
    skip_if_not_installed("BiocParallel")
    skip_if_not_installed("HDF5Array")
    skip_on_os("windows")
    x <- randomMatrix(300, 20, 67)
    rownames(x) <- paste0("g", 1:300)
    x[sample(length(x), 300)] <- NA
    whole <- knnGraph(x, k = 6, metric = "bicor", device = "cpu",
                      use = "pairwise.complete.obs")
    h5 <- HDF5Array::writeHDF5Array(x, tempfile(fileext = ".h5"), "x",
                                    with.dimnames = TRUE)
    split <- knnGraph(h5, k = 6, metric = "bicor", device = "cpu",
                      use = "pairwise.complete.obs",
                      BPPARAM = BiocParallel::SnowParam(2, tasks = 3))
    expect_identical(c(split), c(whole))
    q <- x[1:7, ] + 1
    near <- knnSearch(x, q, k = 4, device = "cpu",
                      use = "pairwise.complete.obs")
    expect_identical(knnSearch(x, q, k = 4, device = "cpu",
                               use = "pairwise.complete.obs",
                               BPPARAM = BiocParallel::MulticoreParam(2))
                     [c("index", "distance")], near[c("index", "distance")])
    skip_if_not_installed("BiocNeighbors")
    param <- KnngpuParam("cosine", device = "cpu",
                         use = "pairwise.complete.obs")
    bn <- BiocNeighbors::findKNN(x, k = 5, BNPARAM = param)
    mine <- knnSearch(x, k = 5, metric = "cosine", device = "cpu",
                      use = "pairwise.complete.obs")
    expect_identical(bn$index, mine$index)
    expect_identical(bn$distance, sqrt(2 * mine$distance))
    expect_error(KnngpuParam("euclidean", use = "pairwise.complete.obs"),
                 "needs a correlation metric")
})
