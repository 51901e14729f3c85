## Co-expression on a GPU: bicor's transformed nodes search as cosine does,
## with the CPU's bits; a pairwise-complete search with missing values runs
## on the CPU and says so, and device = "gpu" refuses it.

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

test_that("missing values on a GPU machine: the CPU, and it says so", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(500, 30, 91)
    x[sample(length(x), 400)] <- NA
    found <- knnSearch(x, k = 5, use = "pairwise.complete.obs",
                       progress = FALSE)
    expect_identical(attr(found, "backend"), "cpu")
    expect_match(attr(found, "precision"), "\\(CPU only\\)")
    expect_message(knnSearch(x, k = 5, use = "pairwise.complete.obs",
                             verbose = TRUE, progress = FALSE),
                   "pairwise-complete re-rank \\(CPU only\\)")
    expect_error(knnSearch(x, k = 5, use = "pairwise.complete.obs",
                           device = "gpu"), "runs on the CPU only")
    complete <- randomMatrix(500, 30, 92)
    onGpu <- knnSearch(complete, k = 5, use = "pairwise.complete.obs",
                       device = "gpu", progress = FALSE)
    expect_identical(attr(onGpu, "backend"), "gpu")
})
