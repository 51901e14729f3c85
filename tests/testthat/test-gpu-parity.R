## The exactness contract on the GPU: knnSearch(device = "gpu") returns the
## CPU engine's index and distance bit for bit (identical(), not all.equal),
## for every metric and k, by rows and by columns, on random and on tied
## data with duplicated nodes, and for query search.

test_that("random data: every metric and k from 1 to 1000", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(1500, 40, 11)
    for (metric in allMetrics) for (k in c(1, 16, 100, 1000)) {
        expectGpuIdentical(x, k, metric, label = "random")
    }
})

test_that("k = 3000 and k = n - 1", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(3100, 20, 12)
    for (metric in c("pearson", "euclidean", "manhattan", "spearman")) {
        expectGpuIdentical(x, 3000, metric, label = "large k")
        expectGpuIdentical(x, 3099, metric, label = "n - 1")
    }
})

test_that("tied small-integer data with duplicated rows", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- tiedMatrix(1200, 12, 13)
    for (metric in allMetrics) for (k in c(1, 16, 100, 1000)) {
        expectGpuIdentical(x, k, metric, label = "tied")
    }
    ## Nine distinct nodes: tie groups larger than the candidate slots the
    ## GPU plans, so its overflow path runs.
    set.seed(14)
    heavy <- cbind(0, 1, matrix(sample(0:2, 3000 * 2, TRUE), 3000, 2))
    for (metric in allMetrics) for (k in c(1, 16, 500)) {
        expectGpuIdentical(heavy, k, metric, label = "heavy ties")
    }
})

test_that("nodes scaled by powers of two: the CPU's exact ties", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- tiedMatrix(900, 16, 19) * 2^rep(c(-40, -8, 0, 8, 40), 180)
    for (metric in c("pearson", "spearman", "abspearson", "cosine")) {
        expectGpuIdentical(x, 7, metric, label = "scaled")
    }
    expect_identical(knnSearch(x, k = 7, metric = "pearson",
                               device = "gpu")$index,
                     refKnn(x, 7, "pearson")$index)
})

test_that("by columns", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(30, 1200, 15)
    for (metric in allMetrics) for (k in c(1, 16, 100)) {
        expectGpuIdentical(x, k, metric, by = "columns", label = "columns")
    }
})

test_that("query search", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(1000, 30, 16)
    q <- randomMatrix(300, 30, 17) * 3
    for (metric in allMetrics) for (k in c(1, 10, 999)) {
        expectGpuIdentical(x, k, metric, query = q, label = "query")
    }
})

test_that("knnGraph edges and weights are identical on GPU and CPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(800, 25, 18)
    for (metric in allMetrics) {
        cpu <- knnGraph(x, k = 12, metric = metric, device = "cpu",
                        progress = FALSE)
        gpu <- knnGraph(x, k = 12, metric = metric, device = "gpu",
                        progress = FALSE)
        expect_identical(gpu[c("from", "to", "weight", "distance", "rank")],
                         cpu[c("from", "to", "weight", "distance", "rank")],
                         label = metric)
        expect_match(attr(gpu, "precision"), "fp64 exact re-rank")
    }
})

test_that("ties in the reported distance: the GPU orders as the CPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    set.seed(36)
    counts <- log1p(matrix(rpois(1500 * 30, 0.7), 1500))
    counts[seq(2, 1500, 10), ] <- counts[seq(1, 1499, 10), ]
    near <- matrix(rnorm(1500 * 30), 1500)
    near[751:1500, ] <- near[1:750, ] * (1 + 1e-15)
    data <- list(counts = counts, near = near, denormal = near * 1e-310,
                 tiny = near * 1e-308, huge = near * 1e200,
                 offset = near + 1e12,
                 span = near * 10^sample(-150:150, 1500 * 30, TRUE))
    for (name in names(data)) for (metric in allMetrics) {
        x <- data[[name]]
        if (undefinedFor(x, metric)) next
        expectGpuIdentical(x, 7, metric, label = name)
    }
})

test_that("rows from 1e-300 to 1e300: the GPU gives the CPU's exact bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Each pair is scaled on its own (knn_exact.h, knn_dist_sum), so one
    ## huge row changes no other row's distances, on either device.
    set.seed(421)
    one <- rbind(matrix(rnorm(60 * 8), 60), rep(1e200, 8) * c(1, -1))
    level <- 10^rep(seq(-300, 300, by = 50), each = 40)
    span <- matrix(rnorm(length(level) * 6), ncol = 6) * level
    span <- rbind(span, span[1:80, ] * (1 + 1e-9))
    for (metric in c("euclidean", "manhattan", "sqeuclidean")) {
        expectGpuIdentical(one, 3, metric, label = "one huge row")
        expectGpuIdentical(span, 4, metric, label = "span")
        expectGpuIdentical(span, 4, metric, query = span[1:100, ] * 1.5,
                           label = "span query")
    }
})
