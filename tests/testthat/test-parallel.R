## BPPARAM on knnGraph() and knnSearch() (R/parallel.R): blocks of query
## nodes as BiocParallel tasks give the bits of one process, whatever the
## workers and block count; failures name the block; the data reaches a
## worker once.

edgeColumns <- function(edges) lapply(c(edges), identity)

## expr evaluated with searches streamed in blocks of `block` nodes.
inBlocks <- function(block, expr) {
    withr::with_options(list(knngpu.block.nodes = block), expr)
}

test_that("blocks on workers give the bits of one process", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(700, 10, 41)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    q <- tiedMatrix(90, 10, 42)
    params <- list(BiocParallel::MulticoreParam(2, tasks = 7),
                   BiocParallel::SnowParam(2, tasks = 3))
    for (metric in c("pearson", "euclidean", "cosine")) {
        whole <- knnGraph(x, k = 8, metric = metric, device = "cpu",
                          progress = FALSE)
        near <- knnSearch(x, q, k = 5, metric = metric, device = "cpu")
        for (param in params) {
            split <- knnGraph(x, k = 8, metric = metric, device = "cpu",
                              BPPARAM = param)
            expect_identical(edgeColumns(split), edgeColumns(whole))
            expect_identical(attr(split, "nodes"), attr(whole, "nodes"))
            found <- knnSearch(x, q, k = 5, metric = metric, device = "cpu",
                               BPPARAM = param)
            expect_identical(found[c("index", "distance")],
                             near[c("index", "distance")])
        }
    }
    expect_identical(attr(split, "timings")$blocks, 3L)
    ## Symmetrised and SNN graphs come from the same neighbours.
    param <- BiocParallel::MulticoreParam(2, tasks = 4)
    for (snn in c("rank", "jaccard")) {
        expect_identical(
            edgeColumns(knnGraph(x, k = 6, snn = snn, device = "cpu",
                                 BPPARAM = param)),
            edgeColumns(knnGraph(x, k = 6, snn = snn, device = "cpu")))
    }
    expect_identical(
        edgeColumns(knnGraph(x, k = 6, symmetrize = "mutual",
                             device = "cpu", BPPARAM = param)),
        edgeColumns(knnGraph(x, k = 6, symmetrize = "mutual",
                             device = "cpu")))
})

test_that("BatchtoolsParam runs the blocks as batchtools jobs", {
    skip_if_not_installed("BiocParallel")
    skip_if_not_installed("batchtools")
    skip_on_os("windows")
    x <- tiedMatrix(300, 8, 43)
    param <- BiocParallel::BatchtoolsParam(
        2, cluster = "multicore",
        registryargs = BiocParallel::batchtoolsRegistryargs(
            file.dir = tempfile("registry")))
    split <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                       BPPARAM = param)
    whole <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu")
    expect_identical(split[c("index", "distance")],
                     whole[c("index", "distance")])
})

test_that("a worker's failure names the block and returns nothing", {
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(400, 8, 44)
    rownames(x) <- paste0("g", seq_len(nrow(x)))
    x[c(250, 260), ] <- NA
    ## Every block searches the whole reference, so every worker finds
    ## the rows and the first block is named.
    expect_error(knnGraph(x, k = 5, device = "cpu",
                          BPPARAM = BiocParallel::MulticoreParam(2,
                                                                 tasks = 4)),
                 paste0("worker failed on block 1 of 4 \\('x' rows g1 to ",
                        "g100; 4 block\\(s\\) failed\\): 'x' has NA, NaN or ",
                        "Inf values in rows: g250, g260"))
    expect_error(knnGraph(x, k = 5, BPPARAM = 2), "'BPPARAM' must be NULL")
    expect_error(knnSearch(x, k = 5, BPPARAM = "snow"),
                 "'BPPARAM' must be NULL")
    ## The transfer file is gone once the search ends, failed or not.
    dir <- tempfile("transfer")
    dir.create(dir)
    withr::with_options(list(knngpu.transfer.dir = dir), {
        expect_error(knnGraph(x, k = 5, device = "cpu",
                              BPPARAM = BiocParallel::SnowParam(2)),
                     "worker failed")
    })
    expect_length(list.files(dir), 0L)
})

test_that("a worker reads the reference once for all its blocks", {
    x <- tiedMatrix(200, 6, 45)
    source <- knngpu:::.nodeSource(x, "rows")
    runner <- knngpu:::.engineRunner("euclidean", "cpu", 1L, NULL)
    handle <- knngpu:::.shareSources(source, NULL)
    task <- knngpu:::.blockTask(handle, 4L, runner)
    first <- task(1:50)
    ## With the file gone, a second block can only come from what the
    ## first one kept.
    unlink(handle$path)
    second <- task(51:100)
    whole <- knnSearch(x, k = 4, metric = "euclidean", device = "cpu")
    expect_identical(rbind(first$index, second$index), whole$index[1:100, ])
    knngpu:::.workerForget()
})

test_that("a streamed search (blocks of nodes) gives the same bits", {
    x <- tiedMatrix(500, 9, 46)
    q <- tiedMatrix(60, 9, 47)
    for (metric in c("pearson", "spearman", "cosine", "euclidean",
                     "manhattan", "sqeuclidean")) {
        for (k in c(1L, 7L, 120L)) {
            whole <- knnSearch(x, k = k, metric = metric, device = "cpu")
            graph <- knnGraph(x, k = k, metric = metric, device = "cpu")
            near <- knnSearch(x, q, k = k, metric = metric, device = "cpu")
            for (block in c(37L, 499L)) {
                label <- sprintf("%s k=%d block=%d", metric, k, block)
                got <- inBlocks(block, knnSearch(x, k = k, metric = metric,
                                                 device = "cpu"))
                expect_identical(got$index, whole$index, label = label)
                expect_identical(got$distance, whole$distance, label = label)
                edges <- inBlocks(block, knnGraph(x, k = k, metric = metric,
                                                  device = "cpu"))
                expect_identical(edgeColumns(edges), edgeColumns(graph),
                                 label = label)
                got <- inBlocks(block, knnSearch(x, q, k = k,
                                                 metric = metric,
                                                 device = "cpu"))
                expect_identical(got$index, near$index, label = label)
                expect_identical(got$distance, near$distance, label = label)
            }
        }
    }
    ## Blocks of one node: every merge path, on few nodes (each block is
    ## a search of its own).
    small <- x[1:40, ]
    for (metric in c("pearson", "euclidean")) {
        whole <- knnSearch(small, k = 5, metric = metric, device = "cpu")
        got <- inBlocks(1L, knnSearch(small, k = 5, metric = metric,
                                      device = "cpu"))
        expect_identical(got[c("index", "distance")],
                         whole[c("index", "distance")])
    }
    ## One scale for every block: distances that underflow or overflow in
    ## float64 rank as one search ranks them.
    for (scale in c(1e-300, 1e200)) {
        y <- x[1:120, ] * scale
        whole <- knnSearch(y, k = 6, metric = "sqeuclidean", device = "cpu")
        got <- inBlocks(11L, knnSearch(y, k = 6, metric = "sqeuclidean",
                                       device = "cpu"))
        expect_identical(got[c("index", "distance")],
                         whole[c("index", "distance")])
    }
    expect_error(inBlocks(-1, knnSearch(x, k = 3)),
                 "option 'knngpu.block.nodes' must")
})

test_that("every row in another order is a subset, not the whole search", {
    skip_if_not_installed("BiocNeighbors")
    x <- tiedMatrix(150, 6, 48)
    whole <- knnSearch(x, k = 4, metric = "euclidean", device = "cpu")
    got <- BiocNeighbors::findKNN(x, k = 4, subset = 150:1,
                                  BNPARAM = KnngpuParam(device = "cpu"))
    expect_identical(got$index, whole$index[150:1, ])
    expect_identical(got$distance, whole$distance[150:1, ])
})
