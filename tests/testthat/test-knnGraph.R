test_that("edges are grouped by node, ranks ascending, named by node", {
    x <- randomMatrix(40, 8, 21)
    rownames(x) <- sprintf("g%02d", seq_len(40))
    e <- knnGraph(x, k = 5, device = "cpu")
    expect_identical(names(e), c("from", "to", "weight", "distance", "rank"))
    expect_identical(nrow(e), 200L)
    expect_identical(e$from, rep(rownames(x), each = 5))
    expect_identical(e$rank, rep(1:5, 40))
    ref <- refKnn(x, 5, "pearson")
    expect_identical(e$to, rownames(x)[as.vector(t(ref$index))])
    expect_equal(e$weight, 1 - e$distance)
    expect_identical(attr(e, "nodes"), data.frame(name = rownames(x)))
    expect_identical(attr(e, "metric"), "pearson")
    expect_identical(attr(e, "k"), 5L)
    expect_match(attr(e, "device"), "^cpu")
})

test_that("unnamed nodes are 1-based integers; by = columns uses columns", {
    x <- randomMatrix(12, 30, 22)
    e <- knnGraph(x, k = 3, by = "columns", metric = "euclidean",
                  device = "cpu")
    expect_identical(e$from, rep(1:30, each = 3))
    ref <- refKnn(t(x), 3, "euclidean")
    expect_identical(e$to, as.vector(t(ref$index)))
    expect_equal(e$weight, 1 / (1 + e$distance))
})

test_that("union and mutual keep each pair once with its better rank", {
    x <- tiedMatrix(80, 12, 23)
    k <- 6
    directed <- knnGraph(x, k = k, device = "cpu")
    key <- function(a, b) paste(pmin(a, b), pmax(a, b))
    pairs <- key(directed$from, directed$to)
    union <- knnGraph(x, k = k, symmetrize = "union", device = "cpu")
    mutual <- knnGraph(x, k = k, symmetrize = "mutual", device = "cpu")
    expect_true(all(union$from < union$to))
    expect_setequal(key(union$from, union$to), unique(pairs))
    expect_false(anyDuplicated(key(union$from, union$to)) > 0)
    twice <- names(which(table(pairs) == 2))
    expect_setequal(key(mutual$from, mutual$to), twice)
    best <- tapply(directed$rank, pairs, min)
    expect_identical(union$rank, as.vector(best[key(union$from, union$to)]))
    w <- tapply(directed$weight, pairs, unique)
    expect_identical(union$weight, as.vector(w[key(union$from, union$to)]))
})

test_that("SNN weights equal bluster's", {
    skip_if_not_installed("bluster")
    skip_if_not_installed("igraph")
    x <- randomMatrix(150, 10, 24)
    for (type in c("rank", "number", "jaccard")) {
        e <- knnGraph(x, k = 8, metric = "euclidean", snn = type,
                      device = "cpu")
        nn <- knnSearch(x, k = 8, metric = "euclidean", device = "cpu")
        g <- bluster::neighborsToSNNGraph(nn$index, type = type)
        ends <- igraph::ends(g, igraph::E(g))
        ref <- data.frame(from = pmin(ends[, 1], ends[, 2]),
                          to = pmax(ends[, 1], ends[, 2]),
                          weight = igraph::E(g)$weight)
        ref <- ref[order(ref$from, ref$to), ]
        rownames(ref) <- NULL
        got <- data.frame(from = e$from, to = e$to, weight = e$weight)
        expect_equal(got, ref, label = type)
    }
})

test_that("toIgraph keeps every node, isolated ones included", {
    skip_if_not_installed("igraph")
    x <- randomMatrix(60, 5, 25)
    mutual <- knnGraph(x, k = 2, symmetrize = "mutual", device = "cpu")
    g <- toIgraph(mutual)
    expect_equal(igraph::vcount(g), 60)
    expect_false(igraph::is_directed(g))
    expect_equal(igraph::ecount(g), nrow(mutual))
    directed <- toIgraph(knnGraph(x, k = 2, device = "cpu"))
    expect_true(igraph::is_directed(directed))
    expect_equal(igraph::ecount(directed), 120)
    expect_equal(igraph::E(directed)$weight,
                 knnGraph(x, k = 2, device = "cpu")$weight)
    plain <- igraph::graph_from_data_frame(mutual,
                                           vertices = attr(mutual, "nodes"))
    expect_equal(igraph::vcount(plain), 60)
})

test_that("progress bars do not change the answer", {
    x <- randomMatrix(600, 6, 26)
    expect_identical(knnGraph(x, k = 4, progress = TRUE, device = "cpu")$to,
                     knnGraph(x, k = 4, progress = FALSE, device = "cpu")$to)
})

test_that("a result R cannot allocate gives R's own error; R goes on", {
    x <- t(randomMatrix(20000, 5, 41))
    got <- graphOverVectorLimit(x, metric = "euclidean", device = "cpu")
    expect_s3_class(got, "error")
    expect_match(conditionMessage(got), "vector memory")
    again <- knnGraph(x[, 1:300], k = 3, by = "columns", device = "cpu",
                      progress = FALSE)
    expect_identical(nrow(again), 900L)
})

test_that("an interrupt stops SNN weights within a second, freeing them", {
    skip_on_os("windows")
    skip_if_not(file.exists("/proc/self/status"))
    ## Random neighbour lists: some 5e8 steps of SNN work (several seconds).
    ## The memory the child holds after the interrupt is what it held
    ## before the call, not the edges built so far.
    rss <- paste("rss <- function() as.numeric(sub('VmRSS:\\\\s*', '',",
                 "sub(' kB', '', grep('^VmRSS:',",
                 "readLines('/proc/self/status'), value = TRUE)))) * 1024")
    got <- rscriptInterrupted(
        setup = paste(rss, "; set.seed(42); n <- 4e5; k <- 40L;",
                      "index <- matrix(sample.int(n, n * k, TRUE), n);",
                      "invisible(gc()); before <- rss()"),
        code = ".Call(knngpu:::C_knn_snn, index, 0L)",
        report = "format(rss() - before)", after = 1)
    expect_identical(got$lines[1L], "interrupt")
    ## Not under tools/sanitize.sh, whose instrumented build runs several
    ## times slower and holds freed memory in quarantine.
    skip_if(nzchar(Sys.getenv("KNNGPU_SANITIZED")), "sanitizer build")
    expect_lt(as.numeric(got$lines[2L]), 64 * 2^20)
    expect_lt(got$took, 1)
})

test_that("SNN weights refuse malformed neighbour lists", {
    index <- matrix(c(2L, 3L, 1L, 3L, 1L, 2L), 3)
    expect_identical(.Call(knngpu:::C_knn_snn, index, 1L)$weight, c(3, 3, 3))
    for (bad in list(0L, NA_integer_, 4L, -5L)) {
        x <- index
        x[2L] <- bad
        expect_error(.Call(knngpu:::C_knn_snn, x, 0L),
                     "node numbers from 1 to 3; entry 2 is")
    }
    expect_error(.Call(knngpu:::C_knn_snn, index * 1.0, 0L), "integer matrix")
    expect_error(.Call(knngpu:::C_knn_snn, index, 7L), "unknown SNN")
})

test_that("symmetrising holds no more than the edges in R's memory", {
    ## The pairs are found in C, in the memory of the edge list itself;
    ## R holds the result, at most as large as the directed edges.
    set.seed(43)
    x <- matrix(rnorm(5000 * 5), ncol = 5)
    edges <- knnGraph(x, k = 200, metric = "euclidean", device = "cpu",
                      progress = FALSE)
    directed <- list2DF(unclass(edges)[c("from", "to", "weight", "distance",
                                         "rank")])
    size <- as.numeric(object.size(directed)) / 2^20
    invisible(gc(reset = TRUE))
    base <- sum(gc()[, 2L])
    union <- knngpu:::.symmetrizeSearch(directed, "union", 200L)
    peak <- sum(gc()[, 6L]) - base
    expect_lt(peak, 1.2 * size)
    expect_true(all(union$from < union$to))
    expect_false(anyDuplicated(paste(union$from, union$to)) > 0)
})

test_that("a symmetrised graph's search holds less than its directed list", {
    ## The engine's `from` and `rank` go before the pairs are made (they
    ## are not needed): R's peak beyond the graph it returns stays within
    ## what the directed graph alone takes (5% for R's own bookkeeping,
    ## which moves with what ran before; keeping them took 8% more).
    set.seed(44)
    x <- matrix(rnorm(4000 * 5), ncol = 5)
    peak <- function(how) {
        invisible(gc(reset = TRUE))
        base <- sum(gc()[, 2L])
        g <- knnGraph(x, k = 250, metric = "euclidean", device = "cpu",
                      symmetrize = how, progress = FALSE)
        c(peak = sum(gc()[, 6L]) - base,
          size = as.numeric(object.size(g)) / 2^20)
    }
    none <- peak("none")
    for (how in c("union", "mutual")) {
        got <- peak(how)
        expect_lt(got[["peak"]] - got[["size"]], 1.05 * none[["peak"]],
                  label = how)
    }
})

test_that("SNN edges come from the engine in (from, to) order", {
    ## R sorts nothing: an order() and a copy of every column were the
    ## largest step of an SNN graph in R's memory.
    set.seed(45)
    x <- matrix(rnorm(600 * 4), ncol = 4)
    index <- knnSearch(x, k = 12, metric = "euclidean", device = "cpu")$index
    for (type in 0:2) {
        g <- .Call(knngpu:::C_knn_snn, index, type)
        expect_identical(order(g$from, g$to), seq_along(g$from))
        expect_true(all(g$from < g$to))
    }
})

test_that("symmetrising in C gives what the general path gives", {
    x <- matrix(rnorm(300 * 6), 300)
    x[7, ] <- x[3, ]
    edges <- knnGraph(x, k = 6, metric = "euclidean", device = "cpu")
    plain <- data.frame(from = edges$from, to = edges$to,
                        weight = edges$weight, distance = edges$distance,
                        rank = edges$rank)
    for (how in c("union", "mutual")) {
        viaC <- knngpu:::.symmetrizeSearch(plain, how, 6L)
        general <- knngpu:::.symmetrize(plain, how, 300L)
        expect_identical(as.list(viaC), as.list(general))
        expect_identical(
            as.list(knnGraph(x, k = 6, metric = "euclidean", device = "cpu",
                             symmetrize = how))[names(viaC)],
            as.list(viaC))
    }
})
