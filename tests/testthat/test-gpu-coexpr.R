## Co-expression on a GPU: bicor's transformed nodes search as cosine does,
## with the CPU's bits. A pairwise-complete search with missing values
## computes its screen's float32 products on the GPU and its exact keys on
## the CPU (bicor, which has no products, runs on the CPU): the CPU's bits
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
        expect_identical(attr(gpu, "precision"), paste(
            "fp32 products on the GPU + fp64 pairwise-complete re-rank",
            "on the CPU"))
        expect_match(attr(gpu, "device"), "\\(GPU [0-9]+\\) \\+ cpu \\(")
        top <- allWithMissing(3000, share, 82)
        for (metric in c("cosine", "abspearson")) {
            expectPairwiseGpu(top, 10, metric, label = case)
        }
        robust <- expectPairwiseGpu(allWithMissing(800, share, 83), 10,
                                    "bicor", label = case)
        expect_identical(attr(robust, "backend"), "cpu")
        expect_match(attr(robust, "precision"),
                     "CPU only: bicor has no products", fixed = TRUE)
    }
})

test_that("pairwise-complete on random data: searches, a graph, devices", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(2500, 40, 84)
    x[sample(length(x), 0.05 * length(x))] <- NA
    x[1:10, 1:30] <- NA
    for (metric in c("pearson", "cosine", "abspearson")) {
        expectPairwiseGpu(x, 15, metric, label = "random")
        expectPairwiseGpu(x, 5, metric, min.shared = 20,
                          label = "min.shared 20")
    }
    set.seed(85)
    q <- x[sample(nrow(x), 300), ] + matrix(rnorm(300 * 40, sd = 0.1), 300)
    near <- expectPairwiseGpu(x, 8, "pearson", query = q, label = "query")
    expect_identical(attr(near, "backend"), "gpu")
    for (symmetrize in c("none", "union")) {
        args <- list(x = x, k = 6, use = "pairwise.complete.obs",
                     symmetrize = symmetrize, progress = FALSE)
        onCpu <- do.call(knnGraph, c(args, device = "cpu"))
        onGpu <- do.call(knnGraph, c(args, device = "gpu"))
        expect_identical(c(onGpu), c(onCpu), label = symmetrize)
        expect_match(attr(onGpu, "precision"), "products on the GPU")
    }
    auto <- knnSearch(x, k = 5, use = "pairwise.complete.obs",
                      progress = FALSE)
    expect_identical(attr(auto, "backend"), "gpu")
    expect_message(knnSearch(x, k = 5, use = "pairwise.complete.obs",
                             device = "gpu", progress = FALSE,
                             verbose = TRUE),
                   "fp32 products on the GPU \\+ fp64 pairwise-complete")
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

test_that("a GPU memory budget of a few rows: many chunks, the same bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(3000, 30, 86)
    x[sample(length(x), 0.05 * length(x))] <- NA
    q <- x[1:200, ] + 0.5
    chunkBudget <- function(rows, nQuery = 0) {
        4 * (ncol(x) * (nrow(x) + nQuery) + rows * nrow(x)) + 1024
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
    ## Nothing fits: a clear error, and the device as it was.
    before <- gpuFreeBytes()
    options(knngpu.gpu.memory = chunkBudget(0.5))
    expect_error(knnSearch(x, k = 10, use = "pairwise.complete.obs",
                           device = "gpu", progress = FALSE),
                 "one row of products do not fit the 0.4 MB of GPU memory")
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
    expect_match(attr(split, "precision"), "products on the GPU")
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
    ## Enough pairs that the CPU's screen outlasts the limit many times.
    x <- randomMatrix(150000, 60, 88)
    x[sample(length(x), 0.05 * length(x))] <- NA
    expectInterruptFreesDevice(function() {
        searchUnderTimeLimit(1, x, k = 10, use = "pairwise.complete.obs",
                             device = "gpu", progress = FALSE)
    })
})
