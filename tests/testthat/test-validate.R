test_that("bad input gets a clear error naming the argument and nodes", {
    x <- randomMatrix(20, 6, 31)
    rownames(x) <- paste0("gene", 1:20)
    expect_error(knnGraph(matrix(letters[1:12], 4)),
                 "'x' must be a numeric matrix")
    expect_error(knnGraph(list(1, 2)), "'x' must be a numeric matrix")
    expect_error(knnGraph(data.frame(a = 1:3, b = letters[1:3])),
                 "'x' has non-numeric columns: b")
    bad <- x
    bad[3, 2] <- NA
    bad[7, 1] <- Inf
    bad[9, 4] <- NaN
    expect_error(knnGraph(bad), "NA, NaN or Inf values in rows: gene3, gene7")
    many <- x
    many[1:8, 1] <- NA
    expect_error(knnGraph(many), "gene5 \\(and 3 more\\)")
    ## Large enough for the threaded check: the first bad rows, in order.
    wide <- randomMatrix(3000, 60, 32)
    wide[c(2900, 17, 1500), c(60, 1, 30)] <- c(NaN, -Inf, NA)
    expect_error(knnSearch(wide, k = 2),
                 "NA, NaN or Inf values in rows: 17, 1500, 2900$")
    flat <- x
    flat[c(4, 11), ] <- 1
    expect_error(knnGraph(flat, metric = "pearson"),
                 "2 constant rows.*gene4, gene11.*remove them")
    expect_error(knnGraph(flat, metric = "spearman"), "constant rows")
    zero <- x
    zero[5, ] <- 0
    expect_error(knnGraph(zero, metric = "cosine"), "all-zero rows.*gene5")
    expect_silent(knnGraph(zero, metric = "euclidean", device = "cpu"))
    for (k in list(0, 1.5, 20, -1, NA, "3", c(2, 3))) {
        expect_error(knnGraph(x, k = k),
                     "'k' must be a whole number from 1 to 19")
    }
    expect_error(knnGraph(x[1, , drop = FALSE], k = 1), "at least 2 nodes")
    expect_error(knnGraph(x[, 0]), "zero features")
    expect_error(knnGraph(x, metric = "kendall"), "'metric' must be one of")
    expect_error(knnGraph(x, by = "genes"), "'by' must be one of")
    expect_error(knnGraph(x, symmetrize = "both"), "'symmetrize' must be one")
    expect_error(knnGraph(x, snn = "shared"), "'snn' must be one of")
    expect_error(knnGraph(x, snn = "rank", symmetrize = "union"),
                 "'symmetrize' must be \"none\" when 'snn' is set")
    expect_error(knnSearch(x, x[, 1:3], k = 2),
                 "'query' has 3 features but 'x' has 6")
    expect_error(knnGraph(x, threads = -2), "'threads' must be NULL")
    expect_error(knnGraph(x, device = "tpu"), "'device' must be one of")
    expect_error(knnGraph(x, progress = NA), "'progress' must be TRUE")
})

test_that("device = 'gpu' without a usable GPU says why", {
    skip_if(gpuAvailable())
    x <- randomMatrix(20, 6, 32)
    expect_error(knnGraph(x, device = "gpu"),
                 "device = \"gpu\" but no GPU can be used")
})

test_that("gpuInfo describes the GPU backend", {
    info <- gpuInfo()
    expect_s3_class(info, "knngpu_gpu_info")
    expect_type(info$built_with_cuda, "logical")
    expect_s3_class(info$devices, "data.frame")
    expect_identical(gpuAvailable(), nrow(info$devices) > 0 &&
                         !nzchar(info$reason))
    if (!gpuAvailable()) expect_true(nzchar(info$reason))
    expect_output(print(info), "built with CUDA")
})

test_that("thread counts that OpenMP cannot start are refused, not fatal", {
    x <- randomMatrix(500, 12, 33)
    for (threads in list(1e6, 1e10, 1025, -1, 2.5, NA, "2", c(1, 2))) {
        expect_error(knnSearch(x, k = 7, metric = "pearson", device = "cpu",
                               threads = threads),
                     "'threads' must be NULL or a whole number from 1 to 1024")
    }
    expect_silent(knnSearch(x, k = 7, device = "cpu", threads = 3))
})

test_that("non-finite nodes are reported as such whatever the metric", {
    x <- randomMatrix(40, 8, 34)
    rownames(x) <- paste0("g", 1:40)
    for (metric in allMetrics) for (bad in c(NA, NaN, Inf, -Inf)) {
        y <- x
        y[7, ] <- bad
        expect_error(knnSearch(y, k = 3, metric = metric, device = "cpu"),
                     "'x' has NA, NaN or Inf values in rows: g7$",
                     label = paste(metric, bad))
        expect_error(knnSearch(x, y, k = 3, metric = metric, device = "cpu"),
                     "'query' has NA, NaN or Inf values in rows: g7$")
    }
    ## A constant node and a non-finite one: the non-finite is reported.
    y <- x
    y[3, ] <- 1
    y[9, 2] <- NA
    expect_error(knnGraph(y, k = 3, metric = "pearson", device = "cpu"),
                 "NA, NaN or Inf values in rows: g9$")
    expect_error(knnGraph(y[-9, ], k = 3, metric = "pearson",
                          device = "cpu"), "1 constant rows.*g3")
    ## A constant query node is named in 'query'.
    q <- x[1:4, ]
    q[2, ] <- 5
    expect_error(knnSearch(x, q, k = 3, metric = "spearman", device = "cpu"),
                 "'query' has 1 constant rows.*g2")
})

test_that("NA, empty and repeated node names are made unique for igraph", {
    x <- randomMatrix(60, 6, 35)
    rownames(x) <- rep(c("g1", "g2"), 30)
    rownames(x)[c(5, 8)] <- c(NA, "")
    expect_message(edges <- knnGraph(x, k = 5, device = "cpu"),
                   "'x' has 60 NA, empty or repeated row names")
    nodes <- attr(edges, "nodes")$name
    expect_false(anyDuplicated(nodes) > 0)
    expect_identical(nodes[1:8],
                     c("g1", "g2", "g1.1", "g2.1", "5", "g2.2", "g1.2", "8"))
    expect_true(all(c(edges$from, edges$to) %in% nodes))
    skip_if_not_installed("igraph")
    for (args in list(list(), list(symmetrize = "union"),
                      list(symmetrize = "mutual"), list(snn = "rank"))) {
        g <- suppressMessages(toIgraph(do.call(knnGraph, c(list(
            x, k = 5, device = "cpu"), args))))
        expect_identical(igraph::V(g)$name, nodes)
    }
    expect_message(knnSearch(t(x), k = 2, by = "columns", device = "cpu"),
                   "repeated column names")
})

test_that("a graph a data frame cannot hold is refused before the search", {
    ## 5e7 nodes with k = 50 are 2.5e9 edges: refused at once, with the
    ## limit and the alternatives, never searched.
    x <- Matrix::sparseMatrix(i = 1:3, j = 1:3, x = 1, dims = c(5e7, 3))
    took <- system.time(expect_error(
        knnGraph(x, k = 50, device = "cpu"),
        paste0("2500000000 edges, more than a data frame holds ",
               "\\(2147483647.*knnSearch.*filepath")))
    expect_lt(took[["elapsed"]], 5)
})

test_that("invalid sparse matrices and empty data frames get clear errors", {
    set.seed(7)
    m <- Matrix::rsparsematrix(20, 5, 0.5)
    out <- m
    out@i[3] <- 100L
    dup <- m
    dup@i[2] <- dup@i[1]
    pointers <- m
    pointers@p[2] <- 1000L
    for (bad in list(out, dup, pointers)) {
        expect_error(knnSearch(bad, k = 2, device = "cpu"),
                     "'x' is not a valid sparse matrix")
    }
    expect_error(knnSearch(data.frame(), k = 1), "'x' has no rows")
    expect_error(knnSearch(data.frame(a = numeric(0)), k = 1),
                 "'x' has no rows")
    expect_error(knnSearch(data.frame(a = 1:3)[, 0, drop = FALSE], k = 1),
                 "'x' has zero features")
})

test_that("the engine's entry points refuse malformed arguments", {
    r <- matrix(rnorm(50), 5)
    knobs <- c(select = 0L, block_nodes = 0L, stage_peers = 0L)
    search <- function(query = NULL, algorithm = 0L, precision = 0L,
                       knobs. = knobs, devices = integer(), ref = r) {
        .Call(knngpu:::C_knn_search, ref, query, 2L, 2L, 0L, 1L, 0, devices,
              FALSE, FALSE, algorithm, precision, knobs.)
    }
    expect_error(search(matrix(rnorm(20), 2)), "the 5 features of 'ref'")
    expect_error(search(algorithm = 9L), "unknown code")
    expect_error(search(precision = -1L), "unknown code")
    expect_error(search(knobs. = c(select = 99L)), "unknown code")
    expect_error(search(knobs. = 1:2), "named integer vector")
    expect_error(search(knobs. = c(select = 0.5)), "named integer vector")
    expect_error(search(devices = 1.5), "integer vector")
    expect_error(search(ref = as.integer(r)), "double matrix")
    expect_identical(dim(search()$index), c(10L, 2L))
})

test_that("files for workers are private to the user", {
    skip_on_os("windows")
    dir <- tempfile("knngpu-shared")
    dir.create(dir)
    on.exit(unlink(dir, recursive = TRUE))
    ## A name planted in the shared directory is not followed.
    file.symlink(file.path(dir, "elsewhere"), file.path(dir, "planted"))
    handle <- withOptions(list(knngpu.transfer.dir = dir),
                          knngpu:::.shareSources(
                              list(kind = "dense", matrix = matrix(1, 2, 2)),
                              NULL))
    expect_true(file.exists(handle$path))
    expect_identical(format(file.info(handle$path)$mode), "600")
    expect_identical(format(file.info(dirname(handle$path))$mode), "700")
    expect_identical(dirname(dirname(handle$path)), dir)
    expect_false(file.exists(file.path(dir, "elsewhere")))
})
