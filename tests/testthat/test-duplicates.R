## Exact copies among the reference nodes searched once
## (src/engine/knn_dedup.c): the same bits as searching every copy, on
## data where copies are many, few, or tie across groups.

## Profiles repeated many times each (replicates of few states).
replicateMatrix <- function(n, p, profiles, seed) {
    set.seed(seed)
    base <- matrix(rnorm(profiles * p), profiles)
    base[sample(profiles, n, replace = TRUE), ]
}

## Points of a small integer lattice, each copied one to three times and
## shuffled: groups at equal distances everywhere, so rows end their k in
## runs of tied groups (the rounds that search again).
latticeMatrix <- function(seed) {
    set.seed(seed)
    grid <- as.matrix(expand.grid(-3:3, -3:3, 0:1))
    grid <- grid[rep(seq_len(nrow(grid)), sample(3, nrow(grid), TRUE)), ]
    grid[sample(nrow(grid)), ] + 0
}

searchWays <- function(x, ..., query = NULL) {
    lapply(c(each = "each", once = "once", auto = "auto"), function(way) {
        withOptions(list(knngpu.duplicates = way),
                    knnSearch(x, query = query, progress = FALSE, ...))
    })
}

expectSameBits <- function(got, label) {
    for (way in c("once", "auto")) {
        expect_identical(got[[way]]$index, got$each$index,
                         label = paste(label, way, "index"))
        expect_identical(got[[way]]$distance, got$each$distance,
                         label = paste(label, way, "distance"))
        expect_identical(got[[way]]$weight, got$each$weight,
                         label = paste(label, way, "weight"))
    }
}

test_that("replicates of few profiles give the bits of every copy searched", {
    x <- replicateMatrix(1500, 6, 12, 1)
    for (metric in c("euclidean", "pearson", "cosine", "manhattan")) {
        got <- searchWays(x, k = 20, metric = metric)
        expectSameBits(got, metric)
        expect_match(attr(got$auto, "precision"), "copies searched once")
        expect_no_match(attr(got$each, "precision"), "copies searched once")
    }
    ref <- refKnn(x, 20, "euclidean")
    got <- searchWays(x, k = 20, metric = "euclidean")
    expect_equal(unname(got$once$index), ref$index)
})

test_that("more neighbours than a group holds, and k past the groups", {
    x <- replicateMatrix(300, 4, 5, 2)
    for (k in c(1L, 59L, 61L, 150L, 299L)) {
        got <- searchWays(x, k = k, metric = "euclidean")
        expectSameBits(got, paste("k =", k))
        expect_equal(unname(got$once$index),
                     refKnn(x, k, "euclidean")$index,
                     label = paste("reference, k =", k))
    }
})

test_that("ties across groups are searched again until exact", {
    x <- latticeMatrix(3)
    for (metric in c("euclidean", "manhattan", "sqeuclidean")) {
        for (k in c(2L, 5L, 9L)) {
            got <- searchWays(x, k = k, metric = metric)
            expectSameBits(got, paste(metric, k))
            expect_equal(unname(got$once$index),
                         refKnn(x, k, metric)$index,
                         label = paste("reference", metric, k))
        }
    }
})

test_that("a query search against copied references, and graphs", {
    x <- latticeMatrix(4)
    q <- rbind(x[1:30, ], matrix(c(0.5, 0.5, 0.5), 5, 3, byrow = TRUE))
    got <- searchWays(x, query = q, k = 7, metric = "euclidean")
    expectSameBits(got, "query")
    expect_equal(unname(got$once$index),
                 refKnn(x, 7, "euclidean", query = q)$index)
    graphs <- lapply(c("each", "once"), function(way) {
        withOptions(list(knngpu.duplicates = way),
                    knnGraph(x, k = 6, metric = "euclidean",
                             progress = FALSE))
    })
    expect_identical(names(graphs[[2L]]), names(graphs[[1L]]))
    for (column in names(graphs[[1L]])) {
        expect_identical(graphs[[2L]][[column]], graphs[[1L]][[column]],
                         label = column)
    }
})

test_that("data without copies and data with a few take the plain search", {
    x <- randomMatrix(400, 5, 5)
    x[2:4, ] <- x[1, ]
    got <- searchWays(x, k = 5, metric = "euclidean")
    expectSameBits(got, "few copies")
    expect_no_match(attr(got$auto, "precision"), "copies searched once")
})

test_that("the sample finds copies among nodes that share leading values", {
    ## Sparse-like nodes: the first features are zero in every node, so
    ## only the whole node tells copies apart (the sample's first look
    ## hashes the leading features only).
    zeros <- matrix(0, 3000, 10)
    copied <- cbind(zeros, replicateMatrix(3000, 6, 40, 5))
    got <- searchWays(copied, k = 5, metric = "euclidean")
    expectSameBits(got, "shared leading values, copies")
    expect_match(attr(got$auto, "precision"), "copies searched once")
    distinct <- cbind(zeros, randomMatrix(3000, 6, 7))
    got <- searchWays(distinct, k = 5, metric = "euclidean")
    expectSameBits(got, "shared leading values, no copies")
    expect_no_match(attr(got$auto, "precision"), "copies searched once")
})

test_that("the duplicates option is checked", {
    expect_error(withOptions(list(knngpu.duplicates = "sometimes"),
                             knnSearch(randomMatrix(20, 3, 6), k = 2)),
                 "knngpu.duplicates")
})

test_that("copies searched once on the GPU give the CPU's bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- replicateMatrix(20000, 10, 20, 7)
    for (metric in c("euclidean", "pearson")) {
        expectGpuIdentical(x, 15, metric, label = "replicates")
    }
    expectGpuIdentical(latticeMatrix(8), 5, "euclidean", label = "lattice")
})
