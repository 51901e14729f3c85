## toAdjacency() (R/toAdjacency.R): the graph's sparse adjacency matrix,
## every node named, values as the edges hold them.

test_that("directed edges fill each node's row with its neighbours", {
    skip_if_not_installed("Matrix")
    x <- tiedMatrix(60, 6, 71)
    rownames(x) <- paste0("g", 1:60)
    edges <- knnGraph(x, k = 4, metric = "euclidean", device = "cpu")
    a <- toAdjacency(edges)
    expect_s4_class(a, "dgCMatrix")
    expect_identical(dimnames(a), list(rownames(x), rownames(x)))
    expect_identical(as.vector(table(Matrix::summary(a)$i)), rep(4L, 60))
    expect_identical(as.matrix(a)[cbind(edges$from, edges$to)],
                     edges$weight)
    d <- toAdjacency(edges, value = "distance")
    expect_identical(as.matrix(d)[cbind(edges$from, edges$to)],
                     edges$distance)
    ## Duplicate rows are neighbours at distance 0: an explicit entry.
    expect_identical(length(d@x), nrow(edges))
    expect_true(any(d@x == 0))
})

test_that("symmetrized, mutual and SNN edges give symmetric matrices", {
    skip_if_not_installed("Matrix")
    x <- randomMatrix(80, 7, 72)
    edges <- knnGraph(x, k = 5, device = "cpu")
    for (how in c("union", "mutual")) {
        a <- toAdjacency(edges, symmetrize = how)
        expect_true(Matrix::isSymmetric(a))
        sym <- knnGraph(x, k = 5, symmetrize = how, device = "cpu")
        expect_identical(toAdjacency(sym), a)
        expect_identical(length(a@x), 2L * nrow(sym))
    }
    expect_true(length(toAdjacency(edges, symmetrize = "mutual")@x) <
                length(toAdjacency(edges, symmetrize = "union")@x))
    snn <- knnGraph(x, k = 5, snn = "jaccard", device = "cpu")
    s <- toAdjacency(snn)
    expect_true(Matrix::isSymmetric(s))
    expect_identical(as.matrix(s)[cbind(snn$from, snn$to)], snn$weight)
    expect_identical(dim(s), c(80L, 80L))
})

test_that("toAdjacency() refuses what it cannot build", {
    skip_if_not_installed("Matrix")
    x <- randomMatrix(30, 5, 73)
    snn <- knnGraph(x, k = 3, snn = "rank", device = "cpu")
    expect_error(toAdjacency(snn, value = "distance"),
                 "'edges' has no column \"distance\"")
    expect_error(toAdjacency(snn, symmetrize = "union"),
                 "undirected already")
    expect_error(toAdjacency(data.frame(from = 1, to = 2)),
                 "'edges' must be a data.frame returned by knnGraph")
    expect_error(toAdjacency(knnGraph(x, k = 3, device = "cpu"),
                             value = "rank"), "'value' must be one of")
})
