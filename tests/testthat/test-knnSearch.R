test_that("every metric, by and k equals the float64 reference", {
    data <- list(random = randomMatrix(60, 40, 1), tied = tiedMatrix(60, 40, 2))
    for (name in names(data)) for (by in c("rows", "columns")) {
        x <- data[[name]]
        nodes <- asRows(x, by)
        for (metric in allMetrics) for (k in c(1, 2, 33, nrow(nodes) - 1)) {
            got <- knnSearch(x, k = k, metric = metric, by = by,
                             device = "cpu")
            ref <- refKnn(nodes, k, metric)
            label <- sprintf("%s %s %s k=%d", name, by, metric, k)
            expect_identical(got$index, ref$index, label = label)
            expect_equal(got$distance, ref$distance, tolerance = 1e-10,
                         label = label)
        }
    }
})

test_that("duplicated nodes are neighbours at distance 0, ties by index", {
    x <- rbind(c(1, 2, 3, 4), c(1, 2, 3, 4), c(4, 3, 2, 1), c(1, 2, 3, 4),
               c(2, 2, 3, 5))
    for (metric in allMetrics) {
        got <- knnSearch(x, k = 2, metric = metric, device = "cpu")
        # |r| = 1 for the reversed node 3 too, and 3 < 4.
        other <- if (metric == "abspearson") 3L else 4L
        expect_identical(got$index[1, ], c(2L, other), label = metric)
        expect_identical(got$index[2, ], c(1L, other), label = metric)
        expect_identical(got$distance[1, ], c(0, 0), label = metric)
    }
})

test_that("query search equals the reference and BiocNeighbors", {
    x <- randomMatrix(300, 12, 3)
    q <- randomMatrix(40, 12, 4)
    for (metric in allMetrics) {
        got <- knnSearch(x, q, k = 7, metric = metric, device = "cpu")
        ref <- refKnn(x, 7, metric, query = q)
        expect_identical(got$index, ref$index, label = metric)
        expect_equal(got$distance, ref$distance, tolerance = 1e-10)
    }
    skip_if_not_installed("BiocNeighbors")
    bn <- BiocNeighbors::queryKNN(x, q, k = 7)
    got <- knnSearch(x, q, k = 7, metric = "euclidean", device = "cpu")
    expect_identical(got$index, bn$index)
    expect_equal(got$distance, bn$distance, tolerance = 1e-10)
    self <- BiocNeighbors::findKNN(x, k = 9)
    got <- knnSearch(x, k = 9, metric = "euclidean", device = "cpu")
    expect_identical(got$index, self$index)
    expect_equal(got$distance, self$distance, tolerance = 1e-10)
})

test_that("any tile size gives the same bits", {
    x <- randomMatrix(700, 10, 5)
    tied <- tiedMatrix(700, 10, 6)
    for (metric in c("pearson", "euclidean", "manhattan", "abspearson")) {
        for (data in list(x, tied)) {
            whole <- knnSearch(data, k = 15, metric = metric, device = "cpu")
            small <- withOptions(list(knngpu.cpu.memory = 8 * 512 * 64),
                knnSearch(data, k = 15, metric = metric, device = "cpu"))
            expect_identical(small[c("index", "distance")],
                             whole[c("index", "distance")], label = metric)
        }
    }
})

test_that("threads do not change the answer", {
    x <- tiedMatrix(400, 9, 7)
    one <- knnSearch(x, k = 12, metric = "spearman", threads = 1,
                     device = "cpu")
    two <- knnSearch(x, k = 12, metric = "spearman", threads = 2,
                     device = "cpu")
    one_info <- attributes(one)
    expect_identical(one$index, two$index)
    expect_identical(one$distance, two$distance)
    expect_match(one_info$device, "1 threads")
})

test_that("a shared self search gives the same bits on any threads", {
    ## 40 features: each pair's product is computed once for both nodes
    ## (the threads take turns over the column parts); 1, 2, 3 and 5
    ## threads split the rows and columns differently; the small budget
    ## leaves no room for a pool per node, so it searches unshared.
    x <- tiedMatrix(900, 40, 11)
    for (metric in c("pearson", "cosine", "euclidean", "abspearson")) {
        ref <- refKnn(x, 9, metric)
        runs <- lapply(c(1L, 2L, 3L, 5L), function(threads) {
            knnSearch(x, k = 9, metric = metric, device = "cpu",
                      threads = threads, progress = FALSE)
        })
        unshared <- withOptions(list(knngpu.cpu.memory = 2e5),
            knnSearch(x, k = 9, metric = metric, device = "cpu",
                      threads = 2L, progress = FALSE))
        for (run in c(runs, list(unshared))) {
            expect_identical(run$index, ref$index, label = metric)
            expect_identical(run$index, runs[[1L]]$index, label = metric)
            expect_identical(run$distance, runs[[1L]]$distance,
                             label = metric)
        }
        expect_equal(runs[[1L]]$distance, ref$distance, tolerance = 1e-9)
    }
})

test_that("values near the overflow and underflow limits keep the answer", {
    x <- randomMatrix(120, 15, 8)
    for (metric in allMetrics) {
        base <- knnSearch(x, k = 6, metric = metric, device = "cpu")
        for (scale in c(1e200, 1e-200)) {
            got <- knnSearch(x * scale, k = 6, metric = metric,
                             device = "cpu")
            label <- sprintf("%s x %g", metric, scale)
            if (metric != "sqeuclidean") {
                expect_identical(got$index, base$index, label = label)
                expect_true(all(is.finite(got$distance)))
                next
            }
            ## Squared distances overflow to Inf (underflow to 0) in
            ## float64, so every node ties and the smallest indices win.
            expect_true(all(got$distance == if (scale > 1) Inf else 0))
            expect_identical(got$index[1:3, ],
                             rbind(2:7, c(1L, 3:7), c(1:2, 4:7)),
                             label = label)
        }
    }
    big <- knnSearch(x * 1e200, k = 6, metric = "euclidean", device = "cpu")
    base <- knnSearch(x, k = 6, metric = "euclidean", device = "cpu")
    expect_equal(big$distance / 1e200, base$distance, tolerance = 1e-12)
})

test_that("the result says which device and precision produced it", {
    got <- knnSearch(randomMatrix(50, 5, 9), k = 3, device = "cpu")
    expect_identical(attr(got, "backend"), "cpu")
    expect_match(attr(got, "device"), "^cpu")
    expect_match(attr(got, "precision"), "fp64 exact direct|BLAS candidates")
    expect_true(attr(got, "elapsed") >= 0)
    phases <- attr(got, "timings")[c("seconds_prepare", "seconds_search",
                                     "seconds_rerank")]
    expect_true(all(vapply(phases, function(s) s >= 0, logical(1))))
    expect_lte(sum(unlist(phases)), attr(got, "elapsed") + 0.01)
    expect_message(knnSearch(randomMatrix(50, 5, 9), k = 3, device = "cpu",
                             verbose = TRUE), "candidates per node")
})

test_that("a search of copies or in blocks reports each phase from zero", {
    ## A search of copies (each distinct node once) and a search streamed
    ## in blocks hand the backend a report of their own: its phases,
    ## which the blocks add up and the GPU takes the longest of over its
    ## devices, started from whatever lay in memory (the GPU's read 2e126
    ## seconds of search on replicated profiles).
    set.seed(81)
    x <- matrix(rnorm(300 * 20), 300)[rep(1:300, 10), ]
    devices <- c("cpu", if (gpuAvailable()) "gpu")
    for (device in devices) {
        search <- function() knnSearch(x, k = 5, metric = "euclidean",
                                       device = device, progress = FALSE)
        copies <- withOptions(list(knngpu.duplicates = "once"), search())
        blocks <- withOptions(list(knngpu.block.nodes = 1100L,
                                   knngpu.duplicates = "each"), search())
        both <- withOptions(list(knngpu.block.nodes = 100L,
                                 knngpu.duplicates = "once"), search())
        expect_match(attr(copies, "precision"), "copies searched once")
        expect_lt(attr(blocks, "timings")$col_tile, 3000L)
        for (got in list(copies, blocks, both)) {
            t <- attr(got, "timings")
            secs <- unlist(t[grep("^seconds_", names(t))])
            expect_true(all(is.finite(secs) & secs >= 0 &
                            secs <= t$elapsed), label = device)
            ## The CPU has no device to set up or to copy back from.
            if (device == "cpu") {
                expect_identical(unname(secs[c("seconds_setup",
                                               "seconds_collect")]),
                                 c(0, 0))
            }
            expect_identical(got$index, copies$index)
        }
    }
})

test_that("an interrupt stops the engine and frees it cleanly", {
    ## Large enough that 16 cores do not finish it within the limit.
    x <- randomMatrix(80000, 60, 10)
    got <- searchUnderTimeLimit(0.3, x, k = 10, metric = "euclidean",
                                device = "cpu")
    expect_match(got$err, "interrupted|time limit")
    ## The instrumented build of tools/sanitize.sh runs several times
    ## slower, so its polls come later.
    if (!nzchar(Sys.getenv("KNNGPU_SANITIZED"))) expect_lt(got$took, 3)
    ## The search by clusters polls by work, also on data it cannot prune.
    clusters <- withOptions(list(knngpu.algorithm = "clusters"),
                            searchUnderTimeLimit(0.3, x, k = 10,
                                                 metric = "euclidean",
                                                 device = "cpu"))
    expect_match(clusters$err, "interrupted|time limit")
    if (!nzchar(Sys.getenv("KNNGPU_SANITIZED"))) {
        expect_lt(clusters$took, 3)
    }
    again <- knnSearch(x[1:200, ], k = 3, metric = "euclidean",
                       device = "cpu")
    expect_identical(dim(again$index), c(200L, 3L))
})

test_that("containers: data.frame, SummarizedExperiment, ExpressionSet", {
    x <- randomMatrix(30, 6, 11)
    base <- knnSearch(x, k = 4, device = "cpu")
    same <- function(a, b) {
        expect_identical(a[c("index", "distance")], b[c("index", "distance")])
    }
    same(knnSearch(as.data.frame(x), k = 4, device = "cpu"), base)
    counts <- round(x * 100)
    as_integer <- counts
    storage.mode(as_integer) <- "integer"
    same(knnSearch(as_integer, k = 4, device = "cpu"),
         knnSearch(counts, k = 4, device = "cpu"))
    skip_if_not_installed("SummarizedExperiment")
    se <- SummarizedExperiment::SummarizedExperiment(
        assays = list(counts = x * 0, logcounts = x))
    same(knnSearch(se, k = 4, assay = "logcounts", device = "cpu"), base)
    skip_if_not_installed("Biobase")
    eset <- Biobase::ExpressionSet(assayData = x)
    same(knnSearch(eset, k = 4, device = "cpu"), base)
})

test_that("hundreds of duplicated nodes: smallest indices, bounded pools", {
    set.seed(12)
    x <- rbind(matrix(rep(c(3, 1, 4, 1, 5), each = 600), 600),
               matrix(rnorm(200 * 5), 200))
    x <- x[sample(nrow(x)), ]
    for (metric in c("euclidean", "pearson", "manhattan")) {
        got <- knnSearch(x, k = 5, metric = metric, device = "cpu")
        ref <- refKnn(x, 5, metric)
        expect_identical(got$index, ref$index, label = metric)
    }
    got <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                     verbose = FALSE)
    dup <- which(rowSums(abs(sweep(x, 2, c(3, 1, 4, 1, 5)))) == 0)
    expect_identical(got$index[dup[1], ], head(dup[-1], 5))
})

test_that("forked children (parallel::mclapply) run and do not hang", {
    skip_on_os("windows")
    x <- randomMatrix(3000, 20, 13)
    parent <- knnSearch(x, k = 5, device = "cpu")
    children <- parallel::mclapply(1:2, function(i) {
        knnSearch(x, k = 5, device = "cpu")$index
    }, mc.cores = 2)
    for (child in children) expect_identical(child, parent$index)
})

## Every row of a result sorted by (reported distance, index), and its
## first k columns those of the full ranking (k = every node), so no node
## outside the k ties the k-th place with a smaller index.
expectTieContract <- function(x, k, metric, label, ...) {
    got <- knnSearch(x, k = k, metric = metric, device = "cpu", ...)
    all <- knnSearch(x, k = nrow(x) - 1L, metric = metric, device = "cpu",
                     ...)
    sorted <- vapply(seq_len(nrow(x)), function(i) {
        identical(order(all$distance[i, ], all$index[i, ]),
                  seq_len(ncol(all$index)))
    }, logical(1))
    expect_true(all(sorted), label = label)
    expect_identical(got$index, all$index[, seq_len(k), drop = FALSE],
                     label = label)
    expect_identical(got$distance, all$distance[, seq_len(k), drop = FALSE],
                     label = label)
}

test_that("ties go to the smaller index in the distances users see", {
    set.seed(36)
    counts <- log1p(matrix(rpois(150 * 30, 0.7), 150))
    counts[seq(2, 150, 10), ] <- counts[seq(1, 149, 10), ]
    near <- matrix(rnorm(150 * 30), 150)
    near <- near + 1e-15 * matrix(rnorm(150 * 30), 150)
    near[76:150, ] <- near[1:75, ] * (1 + 1e-15)
    data <- list(counts = counts, near = near,
                 integers = matrix(sample(0:4, 150 * 30, TRUE), 150),
                 denormal = near * 1e-310, tiny = near * 1e-308,
                 huge = near * 2^1021, offset = near + 1e12,
                 span = near * 10^sample(-150:150, 150 * 30, TRUE))
    for (name in names(data)) for (metric in allMetrics) {
        x <- data[[name]]
        if (undefinedFor(x, metric)) next
        expectTieContract(x, 7, metric, paste(name, metric))
    }
})

test_that("data scaled by an extreme power of two keep their neighbours", {
    ## Scaling by 2^e is exact, so the ranking cannot change while the
    ## distances users see stay finite and nonzero (they are ordered by
    ## those, then by index). With max |x| = 2^1022 the engine's own scale
    ## is out of a multiplication's reach, and ldexp takes over.
    set.seed(47)
    x <- matrix(rnorm(300 * 40), 300)
    x <- x / max(abs(x))
    cases <- list(c("euclidean", 1022), c("euclidean", -1000),
                  c("manhattan", -1000), c("pearson", 1022),
                  c("pearson", -1000), c("cosine", 1022))
    for (case in cases) {
        metric <- case[1]
        e <- as.numeric(case[2])
        want <- knnSearch(x, k = 6, metric = metric, device = "cpu")
        got <- knnSearch(x * 2^e, k = 6, metric = metric, device = "cpu")
        expect_true(all(is.finite(got$distance) & got$distance > 0))
        expect_identical(got$index, want$index, label = paste(metric, e))
    }
})

test_that("an interrupt reaches R as an interrupt, after cleanup", {
    skip_on_os("windows")
    ## A fresh Rscript (rscriptInterrupted, helper-gpu.R), as at a console:
    ## a child forked from this test process would pay, as it raises the
    ## interrupt, for the copies its garbage collector makes of the pages
    ## of the parent's heap, which grows with every test before it (1.2 to
    ## 1.7 s in full runs, never alone), and measure that, not the engine.
    got <- rscriptInterrupted(
        setup = "set.seed(37); x <- matrix(rnorm(1e5 * 50), ncol = 50)",
        code = paste("knnGraph(x, k = 20, metric = 'euclidean',",
                     "device = 'cpu', progress = FALSE)"))
    expect_identical(got$lines, "interrupt")
    ## Not under tools/sanitize.sh, whose instrumented build runs the
    ## engine several times slower.
    skip_if(nzchar(Sys.getenv("KNNGPU_SANITIZED")), "sanitizer build")
    expect_lt(got$took, 1)
})

test_that("few features: the k-d tree gives the bits of the product scan", {
    set.seed(38)
    for (p in 1:4) for (metric in c("euclidean", "manhattan",
                                     "sqeuclidean")) {
        data <- list(normal = matrix(rnorm(2500 * p), ncol = p),
                     ties = matrix(sample(0:3, 2500 * p, TRUE), ncol = p),
                     tiny = matrix(rnorm(2500 * p), ncol = p) * 1e-310)
        for (name in names(data)) {
            x <- data[[name]]
            q <- x[1:40, , drop = FALSE] + 0.25
            label <- paste(p, metric, name)
            tree <- withOptions(list(knngpu.algorithm = "tree"), list(
                knnSearch(x, k = 9, metric = metric, device = "cpu"),
                knnSearch(x, q, k = 9, metric = metric, device = "cpu")))
            scan <- withOptions(list(knngpu.algorithm = "products"), list(
                knnSearch(x, k = 9, metric = metric, device = "cpu"),
                knnSearch(x, q, k = 9, metric = metric, device = "cpu")))
            for (i in 1:2) {
                expect_identical(tree[[i]][c("index", "distance")],
                                 scan[[i]][c("index", "distance")],
                                 label = label)
            }
            expect_match(attr(tree[[1]], "device"), "k-d tree")
            expect_no_match(attr(scan[[1]], "device"), "k-d tree")
        }
    }
    x <- randomMatrix(300, 2, 39)
    small <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu")
    expect_identical(small$index, refKnn(x, 5, "euclidean")$index)
    auto <- knnSearch(randomMatrix(5000, 3, 40), k = 5, device = "cpu",
                      metric = "euclidean")
    expect_match(attr(auto, "device"), "k-d tree")
    expect_error(withOptions(list(knngpu.algorithm = "tree"),
                             knnSearch(x, k = 5, metric = "pearson",
                                       device = "cpu")),
                 "the k-d tree serves the distance metrics only")
    expect_error(withOptions(list(knngpu.algorithm = "kd"),
                             knnSearch(x, k = 5, device = "cpu")),
                 "'knngpu.algorithm' must be one of")
})

test_that("clusters give the bits of the product scan on every shape", {
    ## Each shape class of inst/bench/shapes-data.R, small, with few
    ## features so that the clusters prune; threads and tile budgets vary,
    ## and a query search runs beside each self search.
    kinds <- c("normal", "pca", "cellpcs", "heavy", "levels", "logcounts",
               "binary", "duplicates", "replicates", "clusters", "neardup")
    for (kind in kinds) {
        x <- shapeData(kind, 1200, 12, seed = 41)
        q <- rbind(x[c(3, 500), ], x[7:46, ] * 1.01 + 0.01)
        for (metric in c("euclidean", "sqeuclidean", "pearson", "cosine",
                         "spearman")) {
            label <- paste(kind, metric)
            runs <- lapply(c("clusters", "products"), function(a) {
                withOptions(list(knngpu.algorithm = a), list(
                    knnSearch(x, k = 8, metric = metric, device = "cpu",
                              threads = if (a == "clusters") 1L else 2L),
                    knnSearch(x, q, k = 8, metric = metric, device = "cpu")))
            })
            for (i in 1:2) {
                expect_identical(runs[[1]][[i]][c("index", "distance")],
                                 runs[[2]][[i]][c("index", "distance")],
                                 label = label)
            }
            expect_match(attr(runs[[1]][[1]], "device"), "clusters")
            expect_no_match(attr(runs[[2]][[1]], "device"), "clusters")
            ## The reference rounds distances to 10 decimals, which merges
            ## the near-duplicates' distances (1e-7) into false ties.
            if (kind %in% c("neardup", "clusters")) next
            ref <- refKnn(x, 8, metric)
            expect_identical(runs[[1]][[1]]$index, ref$index, label = label)
            expect_equal(runs[[1]][[1]]$distance, ref$distance,
                         tolerance = 1e-12, label = label)
        }
    }
    ## Hard data at full feature counts (levels, log-counts, near
    ## duplicates) and small integers full of exact ties, on either rung.
    hard <- c(lapply(setNames(hardKinds, hardKinds), hardMatrix, n = 400,
                     seed = 45),
              list(tied = tiedMatrix(400, 9, 46)))
    for (kind in names(hard)) {
        for (metric in c("euclidean", "pearson", "cosine", "spearman")) {
            for (precision in c("auto", "fp64")) {
                runs <- lapply(c("clusters", "products"), function(a) {
                    withOptions(list(knngpu.algorithm = a),
                                knnSearch(hard[[kind]], k = 10,
                                          metric = metric, device = "cpu",
                                          precision = precision))
                })
                expect_identical(runs[[1]][c("index", "distance")],
                                 runs[[2]][c("index", "distance")],
                                 label = paste(kind, metric, precision))
            }
        }
    }
    ## A large k, k = n - 1, and many threads over few nodes.
    x <- shapeData("duplicates", 300, 6, seed = 42)
    for (k in c(1L, 150L, 299L)) {
        got <- withOptions(list(knngpu.algorithm = "clusters"),
                           knnSearch(x, k = k, metric = "euclidean",
                                     device = "cpu", threads = 4L))
        want <- withOptions(list(knngpu.algorithm = "products"),
                            knnSearch(x, k = k, metric = "euclidean",
                                      device = "cpu"))
        expect_identical(got[c("index", "distance")],
                         want[c("index", "distance")], label = k)
    }
    ## Where the clusters prune, the automatic choice keeps them; where
    ## they do not (N(0,1) in many dimensions), it hands over to the scan.
    structured <- knnSearch(shapeData("cellpcs", 4000, 10, seed = 43),
                            k = 10, metric = "euclidean", device = "cpu")
    expect_match(attr(structured, "device"), "clusters")
    flatNodes <- shapeData("normal", 4000, 60, seed = 44)
    flat <- knnSearch(flatNodes, k = 10, metric = "euclidean",
                      device = "cpu")
    expect_no_match(attr(flat, "device"), "clusters")
    ## A query search decides the same way, on its own rows; where k is
    ## too large for the sample to tell (knn_km_sample_share), the pilot
    ## decides.
    flatQuery <- knnSearch(flatNodes, flatNodes[1:600, ] + 0.01, k = 10,
                           metric = "euclidean", device = "cpu")
    expect_no_match(attr(flatQuery, "device"), "clusters")
    expect_identical(flatQuery$index[, 1], 1:600)
    cells <- shapeData("cellpcs", 4600, 10, seed = 43)
    cellQuery <- knnSearch(cells[1:4000, ], cells[4001:4600, ], k = 10,
                           metric = "euclidean", device = "cpu")
    expect_match(attr(cellQuery, "device"), "clusters")
    flatLargeK <- knnSearch(flatNodes, k = 200, metric = "euclidean",
                            device = "cpu")
    expect_no_match(attr(flatLargeK, "device"), "clusters")
    ## Rows that repeat 20 profiles with the period of an even stride over
    ## the node order (2500 nodes, 50 clusters): every profile still gets
    ## clusters of its own, so candidates stay near k.
    periodic <- withOptions(list(knngpu.algorithm = "clusters"),
                            knnSearch(shapeData("clusters", 2500, 12,
                                                seed = 47),
                                      k = 10, metric = "euclidean",
                                      device = "cpu"))
    expect_lt(attr(periodic, "timings")$candidates, 15)
    ## A memory budget the clusters' arrays do not fit: auto searches by
    ## the scan, with the same bits; forced clusters are refused.
    cells <- shapeData("cellpcs", 4000, 10, seed = 43)
    tight <- withOptions(list(knngpu.cpu.memory = 1e6),
                         knnSearch(cells, k = 10, metric = "euclidean",
                                   device = "cpu"))
    expect_no_match(attr(tight, "device"), "clusters")
    expect_match(attr(knnSearch(cells, k = 10, metric = "pearson",
                                device = "cpu"), "device"), "clusters")
    expect_identical(tight[c("index", "distance")],
                     structured[c("index", "distance")])
    expect_error(withOptions(list(knngpu.algorithm = "clusters",
                                  knngpu.cpu.memory = 1e6),
                             knnSearch(cells, k = 10, device = "cpu")),
                 "beyond options\\(knngpu.cpu.memory\\)")
    expect_error(withOptions(list(knngpu.algorithm = "clusters"),
                             knnSearch(x, k = 5, metric = "abspearson",
                                       device = "cpu")),
                 "clusters serve the Euclidean, squared Euclidean, Pearson")
})

test_that("every CPU rung gives the float64 reference on hard data", {
    ## Near-duplicates differ by about 1e-14 in r, below the reference's
    ## rounding to 10 decimals, which ties them: there the distances are
    ## compared, and the order is that of the fp64 rung.
    for (kind in hardKinds) {
        x <- hardMatrix(kind, 400, 41)
        for (metric in c("pearson", "cosine", "euclidean", "sqeuclidean",
                         "abspearson", "spearman")) {
            ref <- refKnn(x, 10, metric)
            got <- lapply(c(auto = "auto", fp32 = "fp32", fp64 = "fp64"),
                          function(precision) {
                knnSearch(x, k = 10, metric = metric, device = "cpu",
                          precision = precision, progress = FALSE)
            })
            for (rung in names(got)) {
                label <- paste(kind, metric, rung)
                if (kind != "neardup") {
                    expect_identical(got[[rung]]$index, ref$index,
                                     label = label)
                }
                expect_equal(got[[rung]]$distance, ref$distance,
                             tolerance = 1e-9, label = label)
                expect_identical(got[[rung]]$index, got$fp64$index,
                                 label = label)
                expect_identical(got[[rung]]$distance, got$fp64$distance,
                                 label = label)
            }
            expect_match(attr(got$fp32, "precision"), "^fp32 BLAS")
            expect_match(attr(got$fp64, "precision"), "^fp64 BLAS")
        }
    }
})

test_that("correlations of nodes scaled by powers of two tie exactly", {
    ## Integer rows and their copies times 2^-40 ... 2^40 (and the whole
    ## matrix over 8, or times 2^20): a correlation does not see the
    ## scale, so copies tie bit for bit and go to the smaller index, as
    ## in R's cor().
    x <- tiedMatrix(600, 24, 17)
    scaled <- x * 2^rep(c(-40, -8, 0, 8, 40), 120)
    for (metric in c("pearson", "spearman", "abspearson")) {
        got <- knnSearch(scaled, k = 6, metric = metric, device = "cpu",
                         progress = FALSE)
        expect_identical(got$index, refKnn(scaled, 6, metric)$index,
                         label = metric)
        plain <- knnSearch(x, k = 6, metric = metric, device = "cpu",
                           progress = FALSE)
        for (s in c(1 / 8, 2^20)) {
            other <- knnSearch(x * s, k = 6, metric = metric,
                               device = "cpu", progress = FALSE)
            expect_identical(other$index, plain$index, label = metric)
            expect_identical(other$distance, plain$distance, label = metric)
        }
    }
})

test_that("the float32 pre-test keeps every neighbour at any norm", {
    ## Rows at norms from 2^-40 to 2^40, with exact ties (integer rows
    ## repeated): each float32 block test sits next to the float64 score
    ## it stands for, on both sides of the shared search; the float64
    ## rung, which has no pre-test, gives the bits to match.
    x <- tiedMatrix(600, 24, 17) * 2^rep(c(-40, -8, 0, 8, 40), 120)
    for (metric in c("euclidean", "sqeuclidean", "pearson", "cosine")) {
        fast <- knnSearch(x, k = 6, metric = metric, device = "cpu",
                          precision = "fp32", progress = FALSE)
        exact <- knnSearch(x, k = 6, metric = metric, device = "cpu",
                           precision = "fp64", progress = FALSE)
        expect_identical(fast$index, exact$index, label = metric)
        expect_identical(fast$distance, exact$distance, label = metric)
        expect_match(attr(fast, "precision"), "^fp32 BLAS")
    }
})

test_that("the float32 rung climbs to float64 where candidates explode", {
    ## Every node at one of 3 points, 1e-9 apart at most: float32's margin
    ## holds every node, so auto gives float32 up after its first tile.
    set.seed(43)
    centres <- matrix(rnorm(3 * 30), 3)
    x <- centres[rep(1:3, length.out = 3000), ] +
        matrix(rnorm(3000 * 30, sd = 1e-9), 3000)
    got <- withOptions(list(knngpu.cpu.memory = 4e6,
                            knngpu.algorithm = "products"), {
        knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                  progress = FALSE)
    })
    expect_match(attr(got, "precision"), "^fp32, then fp64 BLAS")
    forced <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                        precision = "fp64", progress = FALSE)
    expect_identical(got$index, forced$index)
    expect_identical(got$distance, forced$distance)
})

test_that("a rung the device lacks is refused by name", {
    x <- randomMatrix(30, 4, 44)
    for (rung in c("tf32", "tf32x3")) {
        expect_error(knnSearch(x, k = 3, device = "cpu", precision = rung),
                     sprintf("'precision = \"%s\"' is not a rung of the CPU",
                             rung))
    }
    expect_error(knnSearch(x, k = 3, device = "cpu", precision = "fp16"),
                 "'precision' must be one of")
    expect_error(knnGraph(x, k = 3, device = "cpu", precision = NA),
                 "'precision' must be one of")
})

test_that("'precision' takes one choice, checked before the data is read", {
    x <- randomMatrix(30, 4, 48)
    for (bad in list(c("fp32", "fp64"), 32, -1, 1e10, TRUE, character())) {
        expect_error(knnSearch(x, k = 3, device = "cpu", precision = bad),
                     "'precision' must be one of", label = deparse(bad))
        expect_error(knnGraph(x, k = 3, device = "cpu", precision = bad),
                     "'precision' must be one of", label = deparse(bad))
    }
    expect_error(knnSearch(list("not", "nodes"), k = 3, precision = NA),
                 "'precision' must be one of")
    default <- knnSearch(x, k = 3, device = "cpu",
                         precision = c("auto", "tf32", "fp32", "fp64",
                                       "tf32x3"))
    auto <- knnSearch(x, k = 3, device = "cpu", precision = "auto")
    expect_identical(default[c("index", "distance")],
                     auto[c("index", "distance")])
    expect_identical(attr(default, "precision"), attr(auto, "precision"))
})

## v * 2^e rounded once (as C's ldexp), for 2^e beyond the doubles too.
ldexpR <- function(v, e) {
    while (e > 1000) {
        v <- v * 2^1000
        e <- e - 1000
    }
    while (e < -2000) {
        v <- v * 2^-1000
        e <- e + 1000
    }
    if (e < -1000) return(v * 2^-1000 * 2^(e + 1000))
    v * 2^e
}

## A pair's distance as knngpu defines it for every finite input: dist()'s
## plain sum in feature order where that is from 2^-900 to the largest
## double; else the differences scaled by a power of two of the largest,
## summed so, scaled back. The bits of dist() where dist() neither
## overflows nor underflows.
scaledDistance <- function(a, b, metric) {
    d <- a - b
    term <- function(v) if (metric == "manhattan") abs(v) else v^2
    s <- 0
    for (v in d) s <- s + term(v)
    if (s >= 2^-900 && s <= .Machine$double.xmax) {
        return(if (metric == "euclidean") sqrt(s) else s)
    }
    top <- max(abs(d))
    if (top == 0) return(0)
    e <- floor(log2(top))
    s <- 0
    for (f in seq_along(d)) s <- s + term(ldexpR(d[f], -e))
    switch(metric, euclidean = ldexpR(sqrt(s), e),
           sqeuclidean = ldexpR(s, 2 * e), manhattan = ldexpR(s, e))
}

scaledKnn <- function(x, k, metric) {
    n <- nrow(x)
    d <- matrix(Inf, n, n)
    for (i in seq_len(n)) for (j in seq_len(n)) if (i != j)
        d[i, j] <- scaledDistance(x[i, ], x[j, ], metric)
    index <- t(apply(d, 1, function(row) order(row, seq_len(n))[seq_len(k)]))
    list(index = index,
         distance = matrix(d[cbind(rep(seq_len(n), k), as.vector(index))], n))
}

test_that("no row's magnitude changes another row's distances", {
    set.seed(421)
    x <- rbind(matrix(rnorm(60 * 8), 60), rep(1e200, 8) * c(1, -1))
    want <- as.matrix(dist(x))[1:60, 1:60]
    diag(want) <- Inf
    for (metric in c("euclidean", "manhattan", "sqeuclidean")) {
        got <- knnSearch(x, k = 3, metric = metric, device = "cpu")
        ref <- switch(metric, euclidean = want, sqeuclidean = want^2,
                      manhattan = {
                          m <- as.matrix(dist(x, "manhattan"))[1:60, 1:60]
                          diag(m) <- Inf
                          m
                      })
        top <- unname(t(apply(ref, 1, order))[, 1:3])
        expect_identical(got$index[1:60, ], top, label = metric)
        expect_equal(got$distance[1:60, ],
                     matrix(ref[cbind(rep(1:60, 3), as.vector(top))], 60),
                     tolerance = 1e-14, label = metric)
    }
    ## Rows from 1e-300 to 1e300, with neighbours at their own level, by
    ## every search path: the scaled exact values, bit for bit.
    level <- 10^rep(seq(-300, 300, by = 50), each = 6)
    span <- matrix(rnorm(length(level) * 3), ncol = 3) * level
    span <- rbind(span, span[1:12, ] * (1 + 1e-9))
    for (metric in c("euclidean", "manhattan", "sqeuclidean")) {
        ref <- scaledKnn(span, 4, metric)
        for (algorithm in c("products", "tree")) {
            got <- withOptions(list(knngpu.algorithm = algorithm),
                               knnSearch(span, k = 4, metric = metric,
                                         device = "cpu"))
            label <- paste(metric, algorithm)
            expect_identical(got$index, ref$index, label = label)
            expect_identical(got$distance, ref$distance, label = label)
        }
    }
})

## What a fresh Rscript running `code` (R source text, after the package
## loads) prints, with environment variables `env` ("NAME=value").
rscriptOutput <- function(code, env = character()) {
    script <- tempfile("knngpu-child", fileext = ".R")
    on.exit(unlink(script))
    writeLines(c("suppressPackageStartupMessages(library(knngpu))", code),
               script)
    suppressWarnings(system2(
        file.path(R.home("bin"), "Rscript"), script, stdout = TRUE,
        stderr = TRUE,
        env = c(paste0("R_LIBS=", paste(.libPaths(), collapse = ":")), env)))
}

test_that("the threads asked for are the threads used, whatever OpenMP says", {
    skip_if_not(file.exists("/proc/self/status"))
    ## The layout's transpose and the input checks run in parallel at this
    ## size; with threads = 1 no thread may start, OMP_NUM_THREADS or not.
    ## An absurd OMP_NUM_THREADS neither starts threads nor ends R. On the
    ## CPU: a GPU's runtime starts threads of its own.
    code <- c(
        "threads <- function() sub('Threads:\\\\s*', '',",
        "    grep('^Threads:', readLines('/proc/self/status'), value = TRUE))",
        "x <- matrix(rnorm(3000 * 60), 3000)",
        "before <- threads()",
        "r <- knnSearch(x, k = 3, threads = 1, device = 'cpu',",
        "               progress = FALSE)",
        "one <- threads()",
        "r <- knnSearch(x, k = 3, threads = 2, device = 'cpu',",
        "               progress = FALSE)",
        "cat('THREADS', before, one, threads(), '\\n')")
    for (env in c("OMP_NUM_THREADS=8", "OMP_NUM_THREADS=3000")) {
        out <- rscriptOutput(code, env)
        line <- grep("^THREADS", out, value = TRUE)
        expect_length(line, 1L)
        counts <- as.integer(strsplit(line, " ")[[1L]][-1L])
        expect_identical(counts[2L], counts[1L], label = env)
        expect_lte(counts[3L], counts[1L] + 1L)
    }
})

test_that("threads asked for are kept on a busy machine where waits sleep", {
    skip_on_os("windows")
    skip_if_not(file.exists("/proc/loadavg"))
    ## More busy processes than cores: spinning waits make a second thread
    ## cost more than it gains (inst/bench/shared_load.R), so a count left
    ## to the engine, and one asked for where OpenMP spins, is lowered to
    ## the free cores; where OpenMP's waits sleep (OMP_WAIT_POLICY=passive
    ## when R started), the count asked for is the count used.
    code <- c(
        "busy <- lapply(seq_len(parallel::detectCores() + 1L), function(i)",
        "    parallel::mcparallel(repeat NULL))",
        "Sys.sleep(0.5)",
        "x <- matrix(rnorm(3000 * 20), 3000)",
        "asked <- knnSearch(x, k = 3, device = 'cpu', threads = 2,",
        "                   progress = FALSE)",
        "auto <- knnSearch(x, k = 3, device = 'cpu', progress = FALSE)",
        "tools::pskill(vapply(busy, `[[`, 0L, 'pid'))",
        "cat('DEVICE', attr(asked, 'device'), '|', attr(auto, 'device'),",
        "    '\\n')")
    device <- function(env) {
        grep("^DEVICE", rscriptOutput(code, env), value = TRUE)
    }
    expect_identical(device("OMP_WAIT_POLICY=passive"),
                     "DEVICE cpu (2 threads) | cpu (1 threads) ")
    expect_identical(device("OMP_WAIT_POLICY=active"),
                     "DEVICE cpu (1 threads) | cpu (1 threads) ")
})

test_that("the search's own spinning threads do not count as load", {
    skip_on_os("windows")
    skip_if_not(file.exists("/proc/loadavg"))
    cores <- parallel::detectCores()
    skip_if(is.na(cores) || cores < 2L, "one core")
    ## The workers of the input's layout (a parallel region at this size)
    ## spin for ever after it with GOMP_SPINCOUNT=infinite: counted as
    ## other processes' load, they left every search one thread. Other
    ## processes may take the cores at any one search, but not at all ten
    ## on a machine whose load (this test's own process included) leaves a
    ## core.
    load <- as.numeric(strsplit(readLines("/proc/loadavg"), " ")[[1L]][1L])
    skip_if(load >= cores, "a busy machine")
    code <- c(
        "x <- matrix(rnorm(4000 * 50), 4000)",
        "for (i in 1:10) {",
        "    r <- knnSearch(x, k = 3, device = 'cpu', progress = FALSE)",
        "    cat('DEVICE', attr(r, 'device'), '\\n')",
        "}")
    out <- grep("^DEVICE", rscriptOutput(code, "GOMP_SPINCOUNT=infinite"),
                value = TRUE)
    expect_length(out, 10L)
    threads <- as.integer(sub("DEVICE cpu \\(([0-9]+) threads.*", "\\1",
                              out))
    expect_gt(max(threads), 1L)
})

test_that("a count of the search's own threads is not taken again stale", {
    skip_on_os("windows")
    skip_if_not(file.exists("/proc/loadavg"))
    skip_if_not_installed("ALL")
    cores <- parallel::detectCores()
    skip_if(is.na(cores) || cores < 2L, "one core")
    load <- as.numeric(strsplit(readLines("/proc/loadavg"), " ")[[1L]][1L])
    skip_if(load >= cores - 0.5, "a busy machine")
    ## On ALL with missing values the pairwise-complete search counts its
    ## threads just after a parallel region of the R layer: a count of
    ## this process's runnable threads taken before that region, while its
    ## workers slept, left nearly every search one thread once they spun
    ## (at most 2 of 10 had two). Other processes may take a core at some
    ## searches, not at most of them on a machine whose load leaves one.
    code <- c(
        "suppressPackageStartupMessages(library(ALL))",
        "data(ALL, envir = environment())",
        "h <- Biobase::exprs(ALL)",
        "set.seed(20261126)",
        "h[sample(length(h), round(0.05 * length(h)))] <- NA",
        "for (i in 1:10) {",
        "    r <- knnSearch(h, k = 10, device = 'cpu', progress = FALSE,",
        "                   use = 'pairwise.complete.obs')",
        "    cat('PAIRWISE', attr(r, 'device'), '\\n')",
        "}")
    out <- grep("^PAIRWISE", rscriptOutput(code), value = TRUE)
    expect_length(out, 10L)
    threads <- as.integer(sub(".* cpu \\(([0-9]+) threads.*", "\\1", out))
    expect_gte(sum(threads > 1L), 4L)
})

test_that("under an address-space limit a search ends or names what to lower", {
    skip_if_not(file.exists("/proc/self/status"))
    ## The sanitizers' shadow memory cannot live under a limit.
    skip_if(nzchar(Sys.getenv("KNNGPU_SANITIZED")))
    ## A BLAS buffer (128 MB in OpenBLAS) that the limit refused hung the
    ## search (OpenBLAS retries it for ever); the default 64 MB of tiles
    ## failed where smaller tiles fit. The limits are set from what the
    ## child holds before its search: 100 MB more cannot hold the buffer,
    ## 200 MB more holds it and small tiles.
    script <- tempfile("knngpu-limit", fileext = ".R")
    on.exit(unlink(script))
    writeLines(c(
        "suppressPackageStartupMessages(library(knngpu))",
        "set.seed(1); x <- matrix(rnorm(20000 * 50), ncol = 50)",
        "size <- grep('^VmSize', readLines('/proc/self/status'), value = TRUE)",
        "res <- if (nzchar(Sys.getenv('KNNGPU_LIMIT_MEASURE'))) {",
        "    'measured'",
        "} else tryCatch({",
        "    knnSearch(x, k = 10, metric = 'euclidean', device = 'cpu',",
        "              threads = 1, progress = FALSE)",
        "    'done'",
        "}, error = function(e) conditionMessage(e))",
        "cat('OUTCOME', gsub('[^0-9]', '', size), res, '\\n')"), script)
    run <- function(limit_kb, env = "") {
        command <- paste(
            if (limit_kb > 0) sprintf("ulimit -v %.0f &&", limit_kb),
            env, paste0("R_LIBS=", paste(.libPaths(), collapse = ":")),
            "timeout 60", shQuote(file.path(R.home("bin"), "Rscript")),
            shQuote(script))
        start <- proc.time()[["elapsed"]]
        out <- suppressWarnings(system2("sh", c("-c", shQuote(command)),
                                        stdout = TRUE, stderr = TRUE))
        line <- grep("^OUTCOME", out, value = TRUE)
        list(line = if (length(line)) line[1L] else paste(out, collapse = " "),
             seconds = proc.time()[["elapsed"]] - start)
    }
    measured <- run(0, "KNNGPU_LIMIT_MEASURE=1")$line
    held <- as.numeric(strsplit(measured, " ")[[1L]][2L])
    expect_false(is.na(held), label = measured)
    tight <- run(held + 100 * 1024)
    expect_match(tight$line, "'threads'.*knngpu.cpu.memory")
    expect_lt(tight$seconds, 50)
    roomy <- run(held + 200 * 1024)
    expect_match(roomy$line, " done $")
})

test_that("an interrupt reaches R within a second in every long step", {
    skip_on_os("windows")
    ## Each step below ran for seconds without a poll: ranking the values
    ## of Spearman's nodes, building a k-d tree, re-ranking a large k.
    ## The interrupt comes 0.5 s after the call, inside that step.
    cases <- list(
        spearman = c(
            "set.seed(1); x <- matrix(rnorm(20000 * 1000), 20000)",
            paste("knnSearch(x, k = 3, metric = 'spearman', by = 'columns',",
                  "device = 'cpu', threads = 1, progress = FALSE)")),
        tree = c(
            paste("set.seed(2); x <- matrix(rnorm(3e6 * 3), ncol = 3);",
                  "options(knngpu.algorithm = 'tree')"),
            paste("knnSearch(x, k = 1, metric = 'euclidean', device = 'cpu',",
                  "progress = FALSE)")),
        rerank = c(
            paste("set.seed(3); x <- matrix(rnorm(20000 * 10), ncol = 10);",
                  "q <- x[1:4000, ] + 0.01"),
            paste("knnSearch(x, q, k = 5000, metric = 'euclidean',",
                  "device = 'cpu', threads = 1, progress = FALSE)")))
    for (name in names(cases)) {
        got <- rscriptInterrupted(setup = cases[[name]][1L],
                                  code = cases[[name]][2L])
        expect_identical(got$lines, "interrupt", label = name)
        if (nzchar(Sys.getenv("KNNGPU_SANITIZED"))) next
        expect_lt(got$took, 1, label = name)
    }
})

test_that("a k-d tree of more points than one sorted run gives the scan's bits", {
    ## Past 65536 points the tree's sort merges runs (knn_kd_sort_rows);
    ## duplicates group into one point as before.
    set.seed(48)
    x <- matrix(sample(0:300, 70000 * 2, TRUE), ncol = 2) / 7
    q <- x[1:500, ] + 0.01
    run <- function(algorithm) {
        withOptions(list(knngpu.algorithm = algorithm),
                    knnSearch(x, q, k = 6, metric = "euclidean",
                              device = "cpu", progress = FALSE))
    }
    tree <- run("tree")
    scan <- run("products")
    expect_identical(tree$index, scan$index)
    expect_identical(tree$distance, scan$distance)
})
