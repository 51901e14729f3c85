## Co-expression on a GPU: bicor's transformed nodes search as cosine does,
## with the CPU's bits. A pairwise-complete search with missing values
## keys every pair on the GPU with the CPU's own float64 key and chooses
## each row's best k there (bicor too): the CPU's bits
## whatever the device, its memory and the split, and the attributes say
## what ran where.

test_that("bicor on the GPU equals the CPU (ALL genes and samples)", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_if_not_installed("ALL")
    env <- new.env()
    utils::data("ALL", package = "ALL", envir = env)
    expr <- Biobase::exprs(env$ALL)
    expectGpuIdentical(expr, 10, "bicor", label = "ALL genes")
    expectGpuIdentical(expr, 16, "bicor", by = "columns",
                       label = "ALL samples")
})

## knnSearch() with use = "pairwise.complete.obs" on the CPU and on the
## GPU: the same index and distance. Returns the GPU's result.
expectPairwiseGpu <- function(x, k, metric, query = NULL, label = "", ...) {
    args <- list(x = x, query = query, k = k, metric = metric,
                 use = "pairwise.complete.obs", progress = FALSE, ...)
    cpu <- do.call(knnSearch, c(args, device = "cpu"))
    gpu <- do.call(knnSearch, c(args, device = "gpu"))
    label <- sprintf("%s %s k=%d", label, metric, k)
    expect_identical(gpu$index, cpu$index, label = label)
    expect_identical(gpu$distance, cpu$distance, label = label)
    gpu
}

test_that("pairwise-complete on ALL with 0.5% and 5% NA: the CPU's bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_if_not_installed("ALL")
    for (share in c(0.005, 0.05)) {
        case <- sprintf("ALL %s%% NA", 100 * share)
        all <- allWithMissing(12625, share, 81)
        gpu <- expectPairwiseGpu(all, 10, "pearson", label = case)
        expect_identical(attr(gpu, "backend"), "gpu")
        expect_identical(attr(gpu, "precision"),
                         "fp64 pairwise-complete keys on the GPU")
        expect_match(attr(gpu, "device"), "\\(GPU [0-9]+\\)$")
        top <- allWithMissing(3000, share, 82)
        for (metric in c("cosine", "abspearson")) {
            expectPairwiseGpu(top, 10, metric, label = case)
        }
        robust <- expectPairwiseGpu(allWithMissing(800, share, 83), 10,
                                    "bicor", label = case)
        expect_identical(attr(robust, "backend"), "gpu")
        expect_identical(attr(robust, "precision"),
                         "fp64 pairwise-complete keys on the GPU")
    }
})

test_that("pairwise-complete on random data: searches, a graph, devices", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(2500, 40, 84)
    x[sample(length(x), 0.05 * length(x))] <- NA
    x[1:10, 1:30] <- NA
    for (metric in c("pearson", "cosine", "abspearson", "bicor")) {
        ## A self search this small keeps all its keys on the device,
        ## each pair keyed once.
        expectPairwiseGpu(x, 15, metric, label = "random")
        expectPairwiseGpu(x, 5, metric, min.shared = 20,
                          label = "min.shared 20")
    }
    ## Ties, zero MADs (bicor's Pearson form) and constant stretches.
    steps <- round(x * 2) / 2
    steps[11:20, ] <- rep(c(0, 0, 0, 1), length.out = 400)
    for (metric in c("pearson", "bicor")) {
        expectPairwiseGpu(steps, 12, metric, label = "steps")
    }
    ## Nodes of 1500 features: the reference's tile too large for shared
    ## memory, read from global memory instead.
    wide <- randomMatrix(200, 1500, 89)
    wide[sample(length(wide), 15000)] <- NA
    for (metric in c("pearson", "bicor")) {
        expectPairwiseGpu(wide, 7, metric, label = "wide")
    }
    set.seed(85)
    q <- x[sample(nrow(x), 300), ] + matrix(rnorm(300 * 40, sd = 0.1), 300)
    near <- expectPairwiseGpu(x, 8, "pearson", query = q, label = "query")
    expect_identical(attr(near, "backend"), "gpu")
    expectPairwiseGpu(x, 8, "bicor", query = q, label = "query")
    for (symmetrize in c("none", "union")) {
        args <- list(x = x, k = 6, use = "pairwise.complete.obs",
                     symmetrize = symmetrize, progress = FALSE)
        onCpu <- do.call(knnGraph, c(args, device = "cpu"))
        onGpu <- do.call(knnGraph, c(args, device = "gpu"))
        expect_identical(c(onGpu), c(onCpu), label = symmetrize)
        expect_match(attr(onGpu, "precision"), "keys on the GPU")
    }
    auto <- knnSearch(x, k = 5, use = "pairwise.complete.obs",
                      progress = FALSE)
    expect_identical(attr(auto, "backend"), "gpu")
    expect_message(knnSearch(x, k = 5, use = "pairwise.complete.obs",
                             device = "gpu", progress = FALSE,
                             verbose = TRUE),
                   "fp64 pairwise-complete keys on the GPU")
    count <- nrow(gpuInfo()$devices)
    last <- knnSearch(x, k = 5, use = "pairwise.complete.obs",
                      device = "gpu", devices = count - 1L,
                      progress = FALSE)
    expect_match(attr(last, "device"), sprintf("(GPU %d)", count - 1L),
                 fixed = TRUE)
    expect_identical(last$index, auto$index)
    expect_error(knnSearch(x, k = 5, use = "pairwise.complete.obs",
                           device = "gpu", devices = count),
                 "'devices' must be NULL or distinct GPU ids")
})

test_that("all keys kept on the device, asked for in two blocks of rows", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## 16000 nodes x 160: every key fits on the device (2 GB), and the
    ## pair visits (knn_coexpr.c's KNN_PW_GPU_VISITS) part the rows into two
    ## blocks, whose later rows take their keys with earlier nodes from
    ## the first block's mirrored writes.
    x <- randomMatrix(16000, 160, 90)
    x[sample(length(x), 0.05 * length(x))] <- NA
    gpu <- expectPairwiseGpu(x, 10, "pearson", label = "two blocks")
    expect_lt(attr(gpu, "timings")$row_tile, nrow(x))
})

test_that("a GPU memory budget of a few rows: many chunks, the same bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(3000, 30, 86)
    x[sample(length(x), 0.05 * length(x))] <- NA
    q <- x[1:200, ] + 0.5
    ## knn_pw_chunk_rows (src/engine/knn_coexpr.h), k = 10.
    chunkBudget <- function(rows, nQuery = 0, bicor = FALSE) {
        perNode <- if (bicor) 12 * ncol(x) + 12 else 8 * ncol(x) + 8
        (2 * nrow(x) + nQuery) * perNode + 4096 +
            rows * (8 * nrow(x) + 24 * 10)
    }
    cpu <- knnSearch(x, k = 10, use = "pairwise.complete.obs",
                     device = "cpu", progress = FALSE)
    near <- knnSearch(x, q, k = 10, use = "pairwise.complete.obs",
                      device = "cpu", progress = FALSE)
    withr::local_options(knngpu.gpu.memory = chunkBudget(7))
    gpu <- knnSearch(x, k = 10, use = "pairwise.complete.obs",
                     device = "gpu", progress = FALSE)
    expect_identical(gpu[c("index", "distance")], cpu[c("index", "distance")])
    expect_identical(attr(gpu, "timings")$row_tile, 7L)
    options(knngpu.gpu.memory = chunkBudget(5, nrow(q)))
    gpuNear <- knnSearch(x, q, k = 10, use = "pairwise.complete.obs",
                         device = "gpu", progress = FALSE)
    expect_identical(gpuNear[c("index", "distance")],
                     near[c("index", "distance")])
    expect_identical(attr(gpuNear, "timings")$row_tile, 5L)
    robust <- knnSearch(x, k = 10, metric = "bicor", progress = FALSE,
                        use = "pairwise.complete.obs", device = "cpu")
    options(knngpu.gpu.memory = chunkBudget(6, bicor = TRUE))
    gpuRobust <- knnSearch(x, k = 10, metric = "bicor", progress = FALSE,
                           use = "pairwise.complete.obs", device = "gpu")
    expect_identical(gpuRobust[c("index", "distance")],
                     robust[c("index", "distance")])
    expect_identical(attr(gpuRobust, "timings")$row_tile, 6L)
    ## Nothing fits: a clear error, and the device as it was.
    before <- gpuFreeBytes()
    options(knngpu.gpu.memory = chunkBudget(0.5))
    expect_error(knnSearch(x, k = 10, use = "pairwise.complete.obs",
                           device = "gpu", progress = FALSE),
                 "one row of keys \\(23.7 KB\\) do not fit the 1.4 MB of GPU")
    expect_identical(gpuFreeBytes(), before)
})

test_that("pairwise-complete through BPPARAM and KnngpuParam on the GPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_if_not_installed("BiocParallel")
    x <- randomMatrix(1200, 20, 87)
    x[sample(length(x), 1200)] <- NA
    whole <- knnGraph(x, k = 6, use = "pairwise.complete.obs",
                      device = "cpu", progress = FALSE)
    split <- knnGraph(x, k = 6, use = "pairwise.complete.obs",
                      device = "gpu", progress = FALSE,
                      BPPARAM = BiocParallel::SerialParam())
    expect_identical(c(split), c(whole))
    expect_match(attr(split, "precision"), "keys on the GPU")
    skip_if_not_installed("BiocNeighbors")
    param <- KnngpuParam("pearson", device = "gpu",
                         use = "pairwise.complete.obs")
    bn <- BiocNeighbors::findKNN(x, k = 5, BNPARAM = param)
    mine <- knnSearch(x, k = 5, device = "cpu",
                      use = "pairwise.complete.obs", progress = FALSE)
    expect_identical(bn$index, mine$index)
})

test_that("an interrupted pairwise-complete search frees the device", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Enough pairs that their keys outlast the limit several times.
    x <- randomMatrix(300000, 60, 88)
    x[sample(length(x), 0.05 * length(x))] <- NA
    expectInterruptFreesDevice(function() {
        searchUnderTimeLimit(1, x, k = 10, use = "pairwise.complete.obs",
                             device = "gpu", progress = FALSE)
    })
})
