## How the GPU backend runs: memory budgets and tiles, devices, interrupts
## that leave no device memory behind, forked children, reported attributes.

test_that("small memory budgets (many tiles) give identical edges", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(2000, 30, 21)
    t <- tiedMatrix(1500, 10, 22)
    for (metric in c("pearson", "euclidean", "manhattan", "abspearson")) {
        full <- knnSearch(x, k = 25, metric = metric, device = "gpu",
                          progress = FALSE)
        tied <- knnSearch(t, k = 40, metric = metric, device = "gpu",
                          progress = FALSE)
        for (budget in c(2e5, 1e6, 2e7)) {
            withOptions(list(knngpu.gpu.memory = budget), {
                small <- knnSearch(x, k = 25, metric = metric,
                                   device = "gpu", progress = FALSE)
                smallTied <- knnSearch(t, k = 40, metric = metric,
                                       device = "gpu", progress = FALSE)
            })
            expect_identical(small$index, full$index)
            expect_identical(small$distance, full$distance)
            expect_identical(smallTied$index, tied$index)
            expect_identical(smallTied$distance, tied$distance)
        }
    }
})

test_that("both selection kernels give identical edges", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(3000, 20, 23)
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    for (k in c(1, 7, 32)) {
        Sys.setenv(KNNGPU_SELECT = "warp")
        warp <- knnSearch(x, k = k, device = "gpu", progress = FALSE)
        Sys.setenv(KNNGPU_SELECT = "radix")
        radix <- knnSearch(x, k = k, device = "gpu", progress = FALSE)
        expect_identical(warp$index, radix$index)
        expect_identical(warp$distance, radix$distance)
    }
})

test_that("explicit devices and the report attributes", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(500, 10, 24)
    a <- knnSearch(x, k = 5, device = "gpu", devices = 0, progress = FALSE)
    b <- knnSearch(x, k = 5, device = "gpu", progress = FALSE)
    expect_identical(a$index, b$index)
    expect_match(attr(a, "device"), gpuInfo()$devices$name[1], fixed = TRUE)
    expect_match(attr(a, "precision"), "GEMM candidates")
    expect_true(attr(a, "timings")$seconds_setup > 0)
    expect_true(attr(a, "timings")$seconds_collect > 0)
    expect_message(knnSearch(x, k = 5, device = "gpu", progress = FALSE,
                             verbose = TRUE), "setup .* copy-out")
    expect_error(knnSearch(x, k = 5, device = "gpu", devices = 99),
                 "devices")
})

test_that("an interrupt stops within a second and frees device memory", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(300000, 64, 25)
    old <- options(knngpu.gpu.memory = 2e8)
    on.exit(options(old))
    ## The elapsed-time limit raises an error at the engine's next interrupt
    ## poll, the path Ctrl-C takes. The first run also loads the kernels,
    ## which stay resident, so the second must leave free memory unchanged.
    interrupted <- function() {
        started <- proc.time()[["elapsed"]]
        setTimeLimit(elapsed = 1, transient = TRUE)
        err <- tryCatch(knnSearch(x, k = 10, metric = "euclidean",
                                  device = "gpu", progress = FALSE),
                        error = conditionMessage)
        setTimeLimit()
        list(err = err, took = proc.time()[["elapsed"]] - started)
    }
    interrupted()
    before <- gpuFreeBytes()
    got <- interrupted()
    expect_match(got$err, "interrupted|time limit")
    expect_lt(got$took, 2.5)
    expect_identical(gpuFreeBytes(), before)
})

test_that("a forked child gets a clear error, not a crash", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_on_os("windows")
    x <- randomMatrix(200, 10, 26)
    knnSearch(x, k = 3, device = "gpu", progress = FALSE)
    got <- parallel::mclapply(1:2, function(i) {
        tryCatch(knnSearch(x, k = 3, device = "gpu", progress = FALSE),
                 error = conditionMessage)
    }, mc.cores = 2)
    for (msg in got) expect_match(msg, "forked|parent")
})
