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

test_that("every selection path gives identical edges", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(3000, 20, 23)
    t <- tiedMatrix(1500, 10, 22)
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    for (k in c(1, 7, 16, 32)) for (metric in c("euclidean", "pearson")) {
        got <- lapply(c(warp = "warp", radix = "radix", fused = "fused"),
                      function(algo) {
            Sys.setenv(KNNGPU_SELECT = algo)
            lapply(list(x, t), function(m) {
                nn <- knnSearch(m, k = k, metric = metric, device = "gpu",
                                progress = FALSE)
                nn[c("index", "distance")]
            })
        })
        expect_identical(got$radix, got$warp,
                         label = sprintf("k=%d %s", k, metric))
        expect_identical(got$fused, got$warp,
                         label = sprintf("fused k=%d %s", k, metric))
    }
})

test_that("the fused kernel gives the CPU's bits on every data kind", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    Sys.setenv(KNNGPU_SELECT = "fused")
    metrics <- c("pearson", "cosine", "euclidean", "abspearson",
                 "sqeuclidean")
    ## Row counts that leave a partial block of 128 rows and of 128
    ## columns; k up to the kernel's largest (128) and one past it (the
    ## panel path then runs); features across one and several stages.
    for (kind in hardKinds) {
        x <- hardMatrix(kind, 1300, 48)
        q <- hardMatrix(kind, 300, 49)
        for (metric in metrics) {
            expectGpuIdentical(x, 10, metric, label = paste(kind, "fused"),
                               gpuPrecision = "tf32")
            expectGpuIdentical(x, 10, metric, query = q,
                               label = paste(kind, "fused query"),
                               gpuPrecision = "tf32")
        }
    }
    x <- randomMatrix(1000, 70, 50)
    for (k in c(1, 37, 128, 129)) {
        expectGpuIdentical(x, k, "euclidean", label = "fused k")
        expectGpuIdentical(x, k, "pearson", label = "fused k")
    }
    ## The fused products take fp16 inputs: features over three fp16
    ## stages with a half-filled last step (150), values under fp16's
    ## normal range (2^-14) or zero in it after the rows' scaling, and
    ## (distances: each node scaled by its own power of two) nodes at very
    ## different levels, some far under the others.
    tiny <- randomMatrix(900, 150, 52)
    tiny[, 1:40] <- tiny[, 1:40] * 1e-7
    tiny[1:50, 1] <- 1e4
    tiny[51:120, ] <- tiny[51:120, ] * 10^-(1:70 %% 35)
    for (metric in c("pearson", "cosine", "abspearson", "euclidean",
                     "sqeuclidean")) {
        got <- expectGpuIdentical(tiny, 12, metric, label = "fp16 range",
                                  gpuPrecision = "tf32")
        expect_match(attr(got$gpu, "precision"), "fp16 fused products",
                     label = metric)
    }
    ## Many tiles, and rows whose survivors overflow their slots (ties).
    t <- tiedMatrix(1500, 10, 51)
    withOptions(list(knngpu.gpu.memory = 2e6), {
        for (metric in metrics) {
            expectGpuIdentical(t, 40, metric, label = "fused tiles, ties")
        }
    })
})

test_that("a self search on one GPU computes each pair once, same bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    metrics <- c("pearson", "cosine", "euclidean", "abspearson",
                 "sqeuclidean")
    pairsOnce <- function(res) attr(res, "timings")$pairs_once
    ## These searches name GPU 0; the walk that several GPUs share is
    ## checked at the end, where there are several.
    ## Small budgets: tiles of a few hundred rows beside the walk's
    ## per-node arrays (7.6 MB here), whose products with the earlier
    ## tiles' nodes are offered to those nodes; rows past a whole block of
    ## 128; the hard kinds in TF32 (whose lists may overflow, where the
    ## search leaves the shared walk: the same bits either way).
    for (kind in hardKinds) {
        x <- hardMatrix(kind, 1700, 48)
        for (metric in metrics) {
            Sys.setenv(KNNGPU_SELECT = "fused")
            withOptions(list(knngpu.gpu.memory = 1.2e7), {
                got <- expectGpuIdentical(x, 10, metric,
                                          label = paste(kind, "pairs"),
                                          gpuPrecision = "tf32",
                                          devices = 0)
            })
            Sys.setenv(KNNGPU_SELECT = "fused_rows")
            withOptions(list(knngpu.gpu.memory = 1.2e7), {
                rows <- knnSearch(x, k = 10, metric = metric,
                                  device = "gpu", precision = "tf32",
                                  devices = 0, progress = FALSE)
            })
            expect_false(pairsOnce(rows))
            expect_identical(rows$index, got$gpu$index)
            expect_identical(rows$distance, got$gpu$distance)
        }
    }
    ## k up to the walk's limit (128: four entries a lane in the merge,
    ## the rows' k smallest in device memory past 32) and beyond it (the
    ## panel path); features over several stages. 3.1e7 bytes hold the
    ## per-node arrays (10 to 22 MB) and tiles of 270 to 1700 rows, and
    ## keep the nodes on the device (not streamed in blocks).
    Sys.setenv(KNNGPU_SELECT = "fused")
    x <- randomMatrix(2500, 70, 62)
    for (k in c(1, 16, 32, 33, 100, 128, 129)) {
        withOptions(list(knngpu.gpu.memory = 3.1e7), {
            got <- expectGpuIdentical(x, k, "euclidean", label = "pairs k",
                                      devices = 0)
            expectGpuIdentical(x, k, "pearson", label = "pairs k",
                               devices = 0)
        })
        expect_identical(pairsOnce(got$gpu), k <= 128, label = paste("k", k))
    }
    ## A budget that holds the per-node arrays (13 MB at k = 32) but not
    ## a block of rows beside them: the walk takes lists of half as many
    ## entries (7 MB). One that holds not even the shortest lists (4 MB):
    ## the search walks plain.
    withOptions(list(knngpu.gpu.memory = 1.4e7), {
        got <- expectGpuIdentical(x, 32, "euclidean", label = "pairs halved",
                                  devices = 0)
    })
    expect_true(pairsOnce(got$gpu))
    withOptions(list(knngpu.gpu.memory = 4e6), {
        got <- expectGpuIdentical(x, 32, "euclidean", label = "pairs budget",
                                  devices = 0)
    })
    expect_false(pairsOnce(got$gpu))
    ## Ties everywhere, k large against them: lists full of tied
    ## candidates; the same bits whether or not a list overflowed.
    t <- tiedMatrix(1500, 10, 63)
    withOptions(list(knngpu.gpu.memory = 1.8e7), {
        for (metric in metrics) {
            expectGpuIdentical(t, 100, metric, label = "pairs ties",
                               devices = 0)
        }
    })
    ## A query search never shares pairs.
    q <- randomMatrix(300, 70, 64)
    withOptions(list(knngpu.gpu.memory = 6e6), {
        got <- expectGpuIdentical(x, 10, "euclidean", query = q,
                                  label = "pairs query", devices = 0)
    })
    expect_false(pairsOnce(got$gpu))
    ids <- gpuInfo()$devices$id
    if (length(ids) > 1L) {
        withOptions(list(knngpu.gpu.memory = 3.1e7), {
            one <- knnSearch(x, k = 10, device = "gpu", devices = ids[1L],
                             progress = FALSE)
            all <- knnSearch(x, k = 10, device = "gpu", devices = ids,
                             progress = FALSE)
        })
        ## Several GPUs share the walk: each walks its share of every
        ## tile's rows, then takes the others' lists of its rows' nodes.
        expect_true(pairsOnce(one))
        expect_true(pairsOnce(all))
        expect_identical(all$index, one$index)
        expect_identical(all$distance, one$distance)
        ## A search on all the GPUs that shares one walk, with the CPU's
        ## bits.
        expectWalkedAsCpu <- function(x, k, memory = NULL) {
            withOptions(list(knngpu.gpu.memory = memory), {
                gpu <- knnSearch(x, k = k, device = "gpu", devices = ids,
                                 progress = FALSE)
            })
            cpu <- knnSearch(x, k = k, device = "cpu", progress = FALSE)
            expect_true(pairsOnce(gpu))
            expect_identical(gpu$index, cpu$index)
            expect_identical(gpu$distance, cpu$distance)
        }
        ## Lists of half as many entries, alike on every GPU.
        expectWalkedAsCpu(x, 32, memory = 1.4e7)
        ## Nodes far out among heavy tails, whose lists overflow on one
        ## GPU: the walk goes on. On several each GPU's lists take a
        ## share of the offers between merges, and a node lost on any
        ## is lost on its rows' GPU too (the marks go with the lists).
        set.seed(73)
        h <- matrix(rt(30000 * 20, df = 2), 30000)
        h[c(2, 15000, 29999), ] <- h[c(2, 15000, 29999), ] * 1000
        expectWalkedAsCpu(h, 10)
    }
})

test_that("a fused search that must climb goes on in split TF32", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    Sys.setenv(KNNGPU_SELECT = "fused")
    ## As in the correlations' test below: TF32 admits every node of the
    ## levels data under cosine; the fused tile that shows it is dropped
    ## and the search starts again from it on the panel path.
    x <- hardMatrix("levels", 20000, 47)
    withOptions(list(knngpu.gpu.memory = 5e7), {
        got <- expectGpuIdentical(x, 10, "cosine", label = "fused climb")
    })
    expect_match(attr(got$gpu, "precision"), "^tf32, then tf32x3")
    ## No candidate of the result came from the dropped tile's fp16
    ## products, so the precision does not name them.
    expect_false(grepl("fp16", attr(got$gpu, "precision")))
})

test_that("inputs larger than the staging ring arrive intact", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## 120000 x 37 doubles are 35.5 MB, more than the 32 one-megabyte
    ## slots, and the parts end mid-slot; one upload thread and several.
    x <- randomMatrix(120000, 37, 27)
    q <- randomMatrix(60, 37, 28)
    for (threads in c(1L, 0L)) {
        withOptions(list(knngpu.threads = threads), {
            expectGpuIdentical(x, 7, "euclidean", query = q,
                               label = sprintf("threads=%d", threads))
            expectGpuIdentical(x, 7, "pearson", query = q,
                               label = sprintf("threads=%d", threads))
        })
    }
})

test_that("results made resident during the search arrive intact", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## 180000 rows x 20 neighbours are 72 MB of results, over the 64 MB
    ## from which a thread populates their pages while the device searches
    ## (src/cuda/knn_gpu_pages.cu); a budget of 100 MB keeps the nodes on
    ## the device and gives several tiles, whose copy-outs write while it
    ## populates. A search's matrices (by query) and a graph's edges (in
    ## edge order), against the CPU's bits.
    x <- randomMatrix(180000, 6, 30)
    withOptions(list(knngpu.gpu.memory = 1e8), {
        got <- expectGpuIdentical(x, 20, "euclidean", label = "resident")
        edges <- knnGraph(x, k = 20, metric = "euclidean", device = "gpu",
                          progress = FALSE)
    })
    expect_identical(edges$from, rep(seq_len(180000), each = 20))
    expect_identical(edges$to, as.vector(t(got$cpu$index)))
    expect_identical(edges$distance, as.vector(t(got$cpu$distance)))
    expect_identical(edges$rank, rep(1:20, 180000))
})

test_that("values that are not finite are found while uploading", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(120000, 37, 35)
    q <- randomMatrix(60, 37, 36)
    before <- gpuFreeBytes()
    x[119999, 37] <- NaN
    expect_error(knnSearch(x, q, k = 3, device = "gpu"),
                 "'x' has NA, NaN or Inf values in rows: 119999$")
    x[119999, 37] <- 0
    q[c(40, 3), 1] <- c(Inf, NA)
    expect_error(knnSearch(x, q, k = 3, device = "gpu"),
                 "'query' has NA, NaN or Inf values in rows: 3, 40$")
    expect_error(knnGraph(q, k = 3, device = "gpu"),
                 "'x' has NA, NaN or Inf values in rows: 3, 40$")
    expect_identical(gpuFreeBytes(), before)
})

test_that("searches in a row leave device memory where the first left it", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(5000, 30, 29)
    ## The first search may keep the device's stream, cuBLAS handle and
    ## staging for the next ones; after that, nothing accumulates.
    knnSearch(x, k = 10, device = "gpu", progress = FALSE)
    after <- vapply(1:3, function(i) {
        knnGraph(x, k = 10, metric = "euclidean", device = "gpu",
                 progress = FALSE)
        gpuFreeBytes()
    }, numeric(1))
    expect_identical(after[2:3], after[c(1, 1)])
})

test_that("distance searches give TF32 up where it admits too many", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Nodes at levels over 0..100 with noise of 0.01: neighbours lie close
    ## against the nodes' norms, so TF32 candidates overflow their slots.
    set.seed(30)
    levels <- matrix(runif(3000, 0, 100), 3000, 16) +
        matrix(rnorm(3000 * 16, sd = 0.01), 3000)
    for (metric in c("euclidean", "sqeuclidean")) {
        got <- expectGpuIdentical(levels, 5, metric, label = "levels")
        expect_match(attr(got$gpu, "precision"), "then tf32x3")
        withOptions(list(knngpu.gpu.memory = 2e6), {
            expectGpuIdentical(levels, 5, metric, label = "levels, tiles")
        })
    }
    x <- randomMatrix(3000, 20, 31)
    got <- expectGpuIdentical(x, 10, "euclidean", label = "random")
    expect_match(attr(got$gpu, "precision"), "^tf32 GEMM")
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
    x <- randomMatrix(600000, 64, 25)
    old <- options(knngpu.gpu.memory = 2e8)
    on.exit(options(old))
    expectInterruptFreesDevice(function() {
        searchUnderTimeLimit(1, x, k = 10, metric = "euclidean",
                             device = "gpu", progress = FALSE)
    })
})

test_that("a result R cannot allocate stops the devices and frees them", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Enough products that the devices search on threads of their own
    ## while R allocates the result (knn_gpu_search.cu, knn_runs_inline).
    x <- t(randomMatrix(50000, 16, 29))
    graphOverVectorLimit(x, metric = "euclidean", device = "gpu")
    before <- gpuFreeBytes()
    got <- graphOverVectorLimit(x, metric = "euclidean", device = "gpu")
    expect_s3_class(got, "error")
    expect_match(conditionMessage(got), "vector memory")
    expect_identical(gpuFreeBytes(), before)
    gpu <- knnGraph(x, k = 10, by = "columns", metric = "euclidean",
                    device = "gpu", progress = FALSE)
    cpu <- knnGraph(x, k = 10, by = "columns", metric = "euclidean",
                    device = "cpu", progress = FALSE)
    expect_identical(gpu$to, cpu$to)
    expect_identical(gpu$distance, cpu$distance)
})

test_that("a large graph's sources and ranks, written as the devices search", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Past 64 MB of results the page threads write them during the search
    ## (knn_gpu_pages.cu), and the result tiles leave on the copy stream.
    n <- 50000L
    k <- 70L
    x <- t(randomMatrix(n, 8, 30))
    gpu <- knnGraph(x, k = k, by = "columns", metric = "euclidean",
                    device = "gpu", progress = FALSE)
    expect_identical(gpu$from, rep(seq_len(n), each = k))
    expect_identical(gpu$rank, rep(seq_len(k), times = n))
    cpu <- knnGraph(x, k = k, by = "columns", metric = "euclidean",
                    device = "cpu", progress = FALSE)
    expect_identical(gpu$to, cpu$to)
    expect_identical(gpu$distance, cpu$distance)
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

test_that("Ctrl-C reaches R as an interrupt and leaves device memory", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    skip_on_os("windows")
    ## The first search in the child takes the interrupted one's path and
    ## tiles (euclidean, several tiles of the budget), so that what CUDA
    ## loads on first use of a kernel (its code, its local memory) is in
    ## place before memory is counted.
    got <- rscriptInterrupted(
        setup = paste(
            "set.seed(1); x <- matrix(rnorm(600000 * 64), 600000);",
            "options(knngpu.gpu.memory = 2e8);",
            "invisible(knnSearch(x[1:200000, ], k = 10, device = 'gpu',",
            "metric = 'euclidean'));",
            "free <- function() .Call(knngpu:::C_knn_gpu_info)$devices$",
            "memory_free[1]; before <- free()"),
        code = paste("knnSearch(x, k = 10, metric = 'euclidean',",
                     "device = 'gpu', progress = FALSE)"),
        report = "format(free() - before)")
    expect_identical(got$lines, c("interrupt", "0"))
    expect_lt(got$took, 1.5)
})

test_that("bad nodes get the CPU's messages on the GPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    x <- randomMatrix(300, 8, 27)
    for (metric in allMetrics) {
        y <- x
        y[7, ] <- if (metric == "cosine") NaN else Inf
        expect_error(knnSearch(y, k = 3, metric = metric, device = "gpu",
                               progress = FALSE),
                     "'x' has NA, NaN or Inf values in rows: 7$")
    }
    y <- x
    y[c(4, 9), ] <- 0
    expect_error(knnSearch(y, k = 3, metric = "cosine", device = "gpu",
                           progress = FALSE), "2 all-zero rows.*4, 9")
    y[11, 1] <- NA
    expect_error(knnSearch(y, k = 3, metric = "cosine", device = "gpu",
                           progress = FALSE),
                 "NA, NaN or Inf values in rows: 11$")
})

test_that("nodes a correlation cannot use are found on the GPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## The GPU backend finds them as it prepares the nodes (the engine's
    ## scan on the host is the CPU backend's only): constant reference and
    ## query nodes for each correlation, all-zero ones for cosine, also
    ## where copies are searched once, and a search right after.
    x <- randomMatrix(300, 8, 32)
    for (metric in c("pearson", "spearman", "abspearson", "cosine")) {
        kind <- if (metric == "cosine") "all-zero" else "constant"
        y <- x
        y[c(5, 12), ] <- if (metric == "cosine") 0 else 3
        expect_error(knnSearch(y, k = 3, metric = metric, device = "gpu",
                               progress = FALSE),
                     sprintf("'x' has 2 %s rows.*: 5, 12;", kind))
        q <- x[1:20, ]
        q[7, ] <- if (metric == "cosine") 0 else -1
        expect_error(knnSearch(x, q, k = 3, metric = metric, device = "gpu",
                               progress = FALSE),
                     sprintf("'query' has 1 %s rows.*: 7;", kind))
    }
    copies <- x[rep(1:10, 30), ]
    copies[17, ] <- 2
    expect_error(withOptions(list(knngpu.duplicates = "once"),
                             knnSearch(copies, k = 3, metric = "pearson",
                                       device = "gpu", progress = FALSE)),
                 "'x' has 1 constant rows.*: 17;")
    expectGpuIdentical(x, 3, "pearson", label = "after refused nodes")
})

test_that("the CUDA backend is opened on first GPU use, not at load", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    maps <- readLines("/proc/self/maps")
    expect_true(any(grepl("knngpu_cuda", maps)))
    expect_true(any(grepl("libcublas", maps)))
})

test_that("nodes beyond the memory budget stream through the GPU", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## 20000 x 50 values are 8 MB in float64 (12 MB on the device with
    ## their float32 copy); a 2 MB budget takes them in blocks of a few
    ## hundred nodes per side.
    x <- randomMatrix(20000, 50, 26)
    q <- randomMatrix(3000, 50, 27)
    for (metric in c("euclidean", "pearson", "cosine")) {
        whole <- knnSearch(x, k = 15, metric = metric, device = "gpu")
        near <- knnSearch(x, q, k = 15, metric = metric, device = "gpu")
        withOptions(list(knngpu.gpu.memory = 2e6), {
            streamed <- knnSearch(x, k = 15, metric = metric, device = "gpu")
            nearStreamed <- knnSearch(x, q, k = 15, metric = metric,
                                      device = "gpu")
        })
        expect_lt(attr(streamed, "timings")$col_tile, 2000L)
        expect_identical(streamed$index, whole$index)
        expect_identical(streamed$distance, whole$distance)
        expect_identical(nearStreamed$index, near$index)
        expect_identical(nearStreamed$distance, near$distance)
        cpu <- knnSearch(x, k = 15, metric = metric, device = "cpu")
        expect_identical(streamed$index, cpu$index)
        expect_identical(streamed$distance, cpu$distance)
    }
    ## Forced blocks on the GPU, a self graph's edges included.
    withOptions(list(knngpu.block.nodes = 3001L), {
        edges <- knnGraph(x, k = 10, metric = "euclidean", device = "gpu")
    })
    expect_identical(lapply(c(edges), identity),
                     lapply(c(knnGraph(x, k = 10, metric = "euclidean",
                                       device = "cpu")), identity))
})

test_that("rows of small norm among large ones keep their candidates few", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Genes at lognormal levels (about 10 to 40000): a bound from the
    ## largest norm made every low-level row a candidate of every other;
    ## the row's own bound (knn_dist_row_bound) keeps them near k.
    set.seed(32)
    level <- rlnorm(4000, meanlog = 6, sdlog = 1.5)
    x <- level * (1 + matrix(rnorm(4000 * 30, sd = 0.05), 4000))
    for (gemm in c("tf32", "tf32x3", "fp32")) {
        for (metric in c("euclidean", "sqeuclidean")) {
            got <- expectGpuIdentical(x, 10, metric,
                                      label = paste("levels", gemm),
                                      gpuPrecision = gemm)
            if (gemm != "tf32") {
                expect_lt(attr(got$gpu, "timings")$candidates, 40)
            }
        }
    }
})

test_that("every GPU rung gives the CPU's bits on hard data", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    for (kind in hardKinds) {
        x <- hardMatrix(kind, 3000, 45)
        for (metric in c("pearson", "cosine", "euclidean", "abspearson")) {
            for (rung in c("auto", "tf32", "tf32x3", "fp32", "fp64")) {
                got <- expectGpuIdentical(x, 10, metric,
                                          label = paste(kind, rung),
                                          gpuPrecision = rung)
                if (rung != "auto") {
                    expect_match(attr(got$gpu, "precision"),
                                 paste0("^", rung, " GEMM"))
                }
            }
        }
    }
})

test_that("a search climbs to float64 where float32 cannot resolve", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Three clusters of 1000 copies of a profile, each copy moved by noise
    ## of sd 1e-4: neighbours differ by some 1e-7 of the norms, inside
    ## split TF32's and float32's margins, far outside float64's. A small
    ## memory budget makes many tiles, so the climbs meet tiles already in
    ## flight and tiles run again.
    set.seed(50)
    centres <- matrix(rnorm(3 * 30), 3)
    x <- centres[rep(1:3, length.out = 3000), ] +
        matrix(rnorm(3000 * 30, sd = 1e-4), 3000)
    for (metric in c("euclidean", "cosine", "pearson")) {
        got <- withOptions(list(knngpu.gpu.memory = 4e6),
                           expectGpuIdentical(x, 10, metric,
                                              label = "clusters auto"))
        ## Distances take local frames before float64 (knn_gpu_local.cu).
        expect_match(attr(got$gpu, "precision"),
                     if (metric == "euclidean")
                         "^tf32, then tf32x3 .*tf32 tiles in local frames"
                     else "^tf32, then tf32x3, then fp64 GEMM",
                     label = metric)
        expect_lt(attr(got$gpu, "timings")$candidates, 30)
        fp64 <- expectGpuIdentical(x, 10, metric, label = "clusters fp64",
                                   gpuPrecision = "fp64")
        expect_match(attr(fp64$gpu, "precision"), "^fp64 GEMM")
        expect_lt(attr(fp64$gpu, "timings")$candidates, 30)
        split <- knnSearch(x, k = 10, metric = metric, device = "gpu",
                           precision = "tf32x3", progress = FALSE)
        expect_identical(split$index, fp64$cpu$index)
        expect_gt(attr(split, "timings")$candidates, 500)
    }
    ## A query search in float64 over several tiles.
    q <- x[c(1, 2, 3, 1500, 2999), ] + 1e-5
    expectGpuIdentical(x, 7, "euclidean", query = q, label = "fp64 query",
                       gpuPrecision = "fp64")
})

test_that("local frames: query searches, and crowded local tiles go on", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Twelve tight clusters (noise 1e-4 around profiles of norm 6): split
    ## TF32 is crowded, local frames resolve each cluster's tiles, for the
    ## rows of a query search as for a graph, with several tiles in flight.
    set.seed(51)
    centres <- matrix(rnorm(12 * 36), 12)
    x <- centres[sample(12, 6000, TRUE), ] +
        matrix(rnorm(6000 * 36, sd = 1e-4), 6000)
    q <- x[seq(1, 6000, by = 3), ] + 1e-5
    got <- withOptions(list(knngpu.gpu.memory = 8e6),
                       expectGpuIdentical(x, 9, "euclidean", query = q,
                                          label = "local query"))
    expect_match(attr(got$gpu, "precision"), "tf32 tiles in local frames")
    ## Half the rows a tight cluster (noise 1e-7) inside a scatter of
    ## N(0, 4) rows: tiles of the cluster alone resolve it, a tile that
    ## holds both centres on the scatter and may be crowded even there
    ## (the search then takes its rows again in float64); the same bits
    ## either way.
    y <- rbind(matrix(rnorm(3000 * 24, sd = 2), 3000),
               matrix(rnorm(24, sd = 0.1), 3000, 24, byrow = TRUE) +
                   matrix(rnorm(3000 * 24, sd = 1e-7), 3000))
    y <- y[sample(nrow(y)), ]
    got <- withOptions(list(knngpu.gpu.memory = 8e6),
                       expectGpuIdentical(y, 12, "euclidean",
                                          label = "crowded local"))
    expect_match(attr(got$gpu, "precision"), "fp64 GEMM|local frames")
})

test_that("local frames on the fused path, before split TF32", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Cell types: 4 tight clusters (noise 1e-3 around profiles of norm
    ## 5) of 10000 rows each, as large as the fused path's local tiles
    ## (a quarter of a wave of its blocks and up). TF32 in the global frame
    ## is crowded; local tiles on the fused path resolve them, with no
    ## split TF32 and no float64, for a graph and a query search, over
    ## several tiles in flight.
    set.seed(52)
    centres <- matrix(rnorm(4 * 30), 4)
    x <- centres[rep(1:4, each = 10000), ] +
        matrix(rnorm(40000 * 30, sd = 1e-3), 40000)
    x <- x[sample(nrow(x)), ]
    got <- expectGpuIdentical(x, 15, "euclidean", label = "fused local")
    expect_match(attr(got$gpu, "precision"), "tf32 tiles in local frames")
    expect_false(grepl("tf32x3|fp64 GEMM", attr(got$gpu, "precision")))
    expect_lt(attr(got$gpu, "timings")$candidates, 60)
    q <- x[seq(1, 40000, by = 8), ] + 1e-4
    got <- withOptions(list(knngpu.gpu.memory = 2e8),
                       expectGpuIdentical(x, 10, "sqeuclidean", query = q,
                                          label = "fused local query"))
    expect_match(attr(got$gpu, "precision"), "tf32 tiles in local frames")
    ## Half the rows one cluster far tighter (noise 1e-8) than the
    ## others: local tiles that hold it may be crowded too, and the search
    ## then takes its rows again from the first in split TF32, then
    ## float64; the same bits on every course.
    y <- x
    y[1:20000, ] <- matrix(centres[1, ], 20000, 30, byrow = TRUE) +
        matrix(rnorm(20000 * 30, sd = 1e-8), 20000)
    got <- expectGpuIdentical(y, 15, "euclidean", label = "crowded fused")
    expect_match(attr(got$gpu, "precision"), "fp64 GEMM|local frames")
})

test_that("a pruned walk's ties go to the smaller index", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Local tiles on the fused path visit their column blocks nearest
    ## first, in a k-d order of the nodes, and skip those too far to hold
    ## a neighbour: a row's candidates do not come in node order. Four
    ## cell types whose cells sit on a lattice of step 2^-10 have exact
    ## squared distances, and many rows tie at their k-th; the re-rank
    ## orders ties by node, as the CPU does.
    set.seed(53)
    centres <- round(matrix(rnorm(4 * 30), 4) * 1024) / 1024
    x <- centres[rep(1:4, each = 10000), ] +
        matrix(round(rnorm(40000 * 30)), 40000) / 1024
    x <- x[sample(nrow(x)), ]
    got <- expectGpuIdentical(x, 15, "euclidean", label = "pruned ties")
    expect_match(attr(got$gpu, "precision"), "tf32 tiles in local frames")
    d <- got$cpu$distance
    expect_gt(sum(d[, 15] == d[, 14]), 100)
})

test_that("fused tiles run again for their slots keep the bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Cell types on falling PC scales: a local tile that holds a few
    ## cells of another type leaves those rows thousands of candidates,
    ## past their uniform slots. Kept in their tiles (the knob of tiles whose many rows
    ## overflow), the tile runs again with each row's exact slots, its
    ## thresholds starting at the bounds of the first run. Its candidates,
    ## and so the bits, are the first run's, for a graph and a query
    ## search.
    ## One GPU: several split the rows, and each device's tiles judge
    ## local frames for themselves.
    old <- Sys.getenv("KNNGPU_ROWS_APART")
    on.exit(Sys.setenv(KNNGPU_ROWS_APART = old))
    Sys.setenv(KNNGPU_ROWS_APART = "never")
    x <- shapeData("cellpcs", 60000, seed = 44)
    got <- expectGpuIdentical(x, 15, "euclidean", label = "local redo",
                              devices = 0)
    expect_match(attr(got$gpu, "precision"), "tf32 tiles in local frames")
    expect_no_match(attr(got$gpu, "precision"), "rows apart")
    q <- x[seq(1, 60000, by = 6), ] + 1e-3
    expectGpuIdentical(x, 15, "euclidean", query = q,
                       label = "local redo query", devices = 0)
})

test_that("a local tile's crowded rows go apart and keep the bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## The same cell types: the few rows of a local tile past their slots
    ## (far from the tile's translation) go apart, searched after the
    ## last tile in float32 in the global frame, and the tile keeps its
    ## other rows' results.
    x <- shapeData("cellpcs", 60000, seed = 44)
    got <- expectGpuIdentical(x, 15, "euclidean", label = "local apart",
                              devices = 0)
    expect_match(attr(got$gpu, "precision"),
                 "tf32 tiles in local frames.*rows apart: fp32")
    q <- x[seq(1, 60000, by = 6), ] + 1e-3
    expectGpuIdentical(x, 15, "euclidean", query = q,
                       label = "local apart query", devices = 0)
})

test_that("TF32 candidates are rescored in float32 before the re-rank", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Log-counts: many near-ties crowd each row's k-th score, so TF32's
    ## margin (10 bits of each input) admits far more nodes than k. The
    ## selection rescores them in float32, whose margin is some 60 times
    ## narrower, so forced TF32 hands the re-rank no more candidates than
    ## split TF32 (whose margin is about three times float32's). 12000
    ## rows make one tile of the radix kernel, which refines.
    x <- shapeData("logcounts", 12000, 200, 48)
    for (metric in c("cosine", "pearson", "euclidean")) {
        tf32 <- expectGpuIdentical(x, 15, metric, label = "refined tf32",
                                   gpuPrecision = "tf32")
        expect_match(attr(tf32$gpu, "precision"), "^tf32 GEMM.*fp32 rescored")
        split <- knnSearch(x, k = 15, metric = metric, device = "gpu",
                           precision = "tf32x3", progress = FALSE)
        expect_identical(split$index, tf32$cpu$index)
        expect_lte(attr(tf32$gpu, "timings")$candidates,
                   attr(split, "timings")$candidates)
    }
    ## 20000 rows take the warp kernel first, which does not refine. Its
    ## crowded tile (some 470 TF32 candidates a row) has the search climb,
    ## not refine: at 20000 nodes, reading those candidates' values costs
    ## more than split TF32's extra products (knn_refine_too_costly).
    x <- shapeData("logcounts", 20000, 200, 49)
    got <- expectGpuIdentical(x, 15, "cosine", label = "crowded warp tile")
    expect_match(attr(got$gpu, "precision"), "^tf32, then tf32x3")
})

test_that("correlations give TF32 up for split TF32 where candidates explode", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Positive data at very different levels: under cosine every r is
    ## within TF32's margin of 1, so auto goes on in split TF32, whose
    ## margin (about float32's) keeps the candidates near k.
    x <- hardMatrix("levels", 20000, 47)
    got <- expectGpuIdentical(x, 10, "cosine", label = "levels auto")
    expect_match(attr(got$gpu, "precision"), "^tf32, then tf32x3")
    expect_lt(attr(got$gpu, "timings")$candidates, 40)
})

test_that("rows of tens of thousands of candidates keep the bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## Heavy tails and five nodes a thousand times further out: in TF32
    ## those nodes' margins hold every node, 40000 candidates a row, past
    ## their lists in the shared walk and their tiles' uniform slots on
    ## the plain walk. They go apart: the walk goes on, the tiles keep the
    ## other rows' results, and the five are searched on their own in
    ## float32, whose margins are 2^-13 of TF32's.
    set.seed(71)
    x <- matrix(rt(40000 * 20, df = 2), 40000)
    x[c(1, 777, 20000, 39999, 40000), ] <-
        x[c(1, 777, 20000, 39999, 40000), ] * 1000
    got <- expectGpuIdentical(x, 10, "euclidean", label = "outliers",
                              devices = 0)
    expect_match(attr(got$gpu, "precision"), "rows apart: fp32",
                 fixed = TRUE)
    expect_true(attr(got$gpu, "timings")$pairs_once)
    ## The plain walk (each pair twice): their tiles' rows go apart.
    old <- Sys.getenv("KNNGPU_SELECT")
    on.exit(Sys.setenv(KNNGPU_SELECT = old))
    Sys.setenv(KNNGPU_SELECT = "fused_rows")
    got <- expectGpuIdentical(x, 10, "sqeuclidean", label = "outliers",
                              devices = 0)
    Sys.setenv(KNNGPU_SELECT = old)
    expect_false(attr(got$gpu, "timings")$pairs_once)
    expect_match(attr(got$gpu, "precision"), "rows apart: fp32",
                 fixed = TRUE)
    ## A query search with query rows far out (a row apart there is a
    ## query node, after the reference's).
    q <- matrix(rt(3000 * 20, df = 2), 3000)
    q[c(1, 1500, 3000), ] <- q[c(1, 1500, 3000), ] * 1000
    expectGpuIdentical(x, 10, "euclidean", query = q,
                       label = "outlier queries", devices = 0)
    ## Forced TF32 keeps every row in TF32: the tiles run again.
    got <- expectGpuIdentical(x, 10, "euclidean", label = "outliers tf32",
                              devices = 0, gpuPrecision = "tf32")
    expect_false(grepl("apart", attr(got$gpu, "precision")))
    expect_gt(attr(got$gpu, "timings")$candidates, 15)
    expectGpuIdentical(x, 10, "pearson", label = "outliers", devices = 0)
})

test_that("a long row's re-rank takes its k first, ties to the smaller index", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## A node with shells around it at squared distances 1, 2 and 3 (one,
    ## two or three of 12 coordinates +-1 off it: 24, 264 and 1760 nodes),
    ## far from 20000 N(0,1) nodes. In forced TF32 its margin holds all
    ## three shells, past 1024 candidates. With k = 30 its k-th lies in
    ## the second shell: the re-rank selects the slots up to that shell
    ## and sorts them alone, ties by node. With k = 300 the k-th ties with
    ## 1760 nodes, more than one block sorts: the row goes to the
    ## segmented sort, ties by node again.
    set.seed(73)
    shell <- function(m) {
        do.call(rbind, lapply(combn(12, m, simplify = FALSE), function(at) {
            signs <- as.matrix(expand.grid(rep(list(c(-1, 1)), m)))
            x <- matrix(0, nrow(signs), 12)
            x[, at] <- signs
            x
        }))
    }
    centre <- c(50, rep(0, 11))
    x <- unname(rbind(matrix(rnorm(20000 * 12), 20000),
                      sweep(rbind(shell(1), shell(2), shell(3)), 2, centre,
                            "+"),
                      centre))
    x <- x[sample(nrow(x)), ]
    at <- which(x[, 1] == 50 & rowSums(x[, -1] != 0) == 0)
    for (k in c(30, 300)) {
        got <- expectGpuIdentical(x, k, "euclidean", label = "shells",
                                  devices = 0, gpuPrecision = "tf32")
        shells <- round(got$cpu$distance[at, ]^2)
        expect_identical(shells[k], if (k == 30) 2 else 3)
    }
})

test_that("a row apart whose ties crowd float32 too keeps the bits", {
    skip_if_not(gpuAvailable(), "no usable GPU")
    ## One node at the centre of 448 nodes at exactly sqrt(3) from it
    ## (three of eight coordinates +-1 off it), far from 20000 N(0,1)
    ## nodes: its 448 tied candidates pass its tile's uniform slots in
    ## every arithmetic, so it goes apart and its tile of rows apart runs
    ## again with its exact slots. Ties go to the smaller index.
    set.seed(72)
    shell <- do.call(rbind, lapply(combn(8, 3, simplify = FALSE),
                                   function(at) {
        signs <- as.matrix(expand.grid(rep(list(c(-1, 1)), 3)))
        m <- matrix(0, nrow(signs), 8)
        m[, at] <- signs
        m
    }))
    centre <- c(50, rep(0, 7))
    x <- rbind(matrix(rnorm(20000 * 8), 20000),
               sweep(shell, 2, centre, "+"), centre)
    x <- x[sample(nrow(x)), ]
    got <- expectGpuIdentical(x, 5, "euclidean", label = "tied shell",
                              devices = 0)
    expect_match(attr(got$gpu, "precision"), "rows apart: fp32",
                 fixed = TRUE)
})
