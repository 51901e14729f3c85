## Internal: running the engine once, and what its answer means.

## Runs one search. ref, query: results of .asNodes() (query may be NULL);
## precision already checked by the verb (.checkPrecision), here only
## against the backend that runs.
## Returns the engine's list(index, distance, weight, info) of n x k
## matrices, or with edges = TRUE (self search) the directed edge list
## list(from, to, weight, distance, rank, info); info is extended with the
## metric, sizes and elapsed seconds.
.runEngine <- function(ref, query, k, metric, device, threads, progress,
                       verbose, devices, edges = FALSE, precision = "auto",
                       use = "everything", min.shared = 1L) {
    pairwise <- use == "pairwise"
    backend <- .resolveDevice(device)
    if (!pairwise) precision <- .checkRung(precision, backend)
    devices <- .checkDevices(devices, backend)
    threads <- .checkThreads(threads)
    progress <- .checkFlag(progress, "progress")
    verbose <- .checkFlag(verbose, "verbose")
    start <- .wallSeconds()
    res <- if (pairwise) {
        .runPairwise(ref, query, k, threads, progress, edges, metric,
                     min.shared, backend, devices)
    } else {
        .runComplete(ref, query, k, metric, backend, threads, progress,
                     devices, edges, precision)
    }
    .describeRun(res, start, backend, metric, k, ref, verbose)
}

## The engine's search of .runEngine() on complete data (every use but a
## pairwise-complete one), its arguments checked there.
.runComplete <- function(ref, query, k, metric, backend, threads, progress,
                         devices, edges, precision) {
    algorithm <- .checkChoice(getOption("knngpu.algorithm", "auto"),
                              .algorithms, "knngpu.algorithm")
    if (metric == "bicor") {
        ref <- .bicorNodes(ref, threads)
        query <- .bicorNodes(query, threads)
    }
    res <- .engineSearch(ref$values, query$values, k, .engineMetric(metric),
                         gpu = backend == "gpu", threads = threads,
                         memory = .memoryBudget(backend), devices = devices,
                         progress = progress, edges = edges,
                         algorithm = algorithm, precision = precision,
                         select = .envChoice("KNNGPU_SELECT", .gpuSelects),
                         rowsApart = .envChoice("KNNGPU_ROWS_APART",
                                                .rowsApart),
                         block = .blockNodes(),
                         duplicates = .duplicatesChoice())
    if (!is.null(res$problem)) {
        .stopProblem(res$problem, ref, query, .engineMetric(metric))
    }
    res
}

## res with its info completed: elapsed seconds since start, backend,
## metric, k and sizes; printed when verbose.
.describeRun <- function(res, start, backend, metric, k, ref, verbose) {
    res$info$elapsed <- .wallSeconds() - start
    res$info$backend <- backend
    res$info$metric <- metric
    res$info$k <- k
    res$info$nodes <- ncol(ref$values)
    res$info$features <- nrow(ref$values)
    if (verbose) .reportRun(res$info)
    res
}

## Nodes per block of a search streamed in blocks (src/engine/knn_stream.c),
## getOption("knngpu.block.nodes"): 0, the default, streams only what the
## GPU cannot hold; a positive number forces blocks of that many nodes on
## either device (the bits are the same; for tests and tuning).
.blockNodes <- function() {
    nodes <- getOption("knngpu.block.nodes", 0L)
    if (!.isWholeNumber(nodes) || nodes < 0 || nodes > .Machine$integer.max) {
        stop("option 'knngpu.block.nodes' must be 0 or a number of nodes",
             call. = FALSE)
    }
    as.integer(nodes)
}

## How exact copies among the reference nodes are searched
## (src/engine/knn.h, knn_duplicates, in this order): "auto" searches the
## distinct nodes once where copies are many, "once" always, "each" never
## (the bits are the same; for tests and tuning),
## getOption("knngpu.duplicates").
.duplicates <- c("auto", "once", "each")

.duplicatesChoice <- function() {
    .checkChoice(getOption("knngpu.duplicates", "auto"), .duplicates,
                 "knngpu.duplicates")
}

## How the CPU searches (src/engine/knn.h, knn_algorithm, in this order):
## "auto" chooses by measured cost; "products" scans every pair through
## matrix products; "tree" uses a k-d tree (distance metrics only);
## "clusters" prunes cluster pairs of a k-means partition (Euclidean,
## squared Euclidean, Pearson, Spearman and cosine).
.algorithms <- c("auto", "products", "tree", "clusters")

## The GPU's selection kernel, chosen by measured cost ("auto") or forced
## (knn_select_force, in order).
.gpuSelects <- c("auto", "warp", "radix", "fused", "fused_rows")

## Whether the GPU sets a tile's crowded rows apart where few ("auto") or
## always runs the tile again for them ("never"; knn_knobs'
## keep_rows_in_tiles), for the tests of that path.
.rowsApart <- c("auto", "never")

## The rungs of the candidate arithmetic (knn_precision, in order): "auto"
## climbs from the cheapest as the data asks; the others force one.
.precisions <- c("auto", "tf32", "fp32", "fp64", "tf32x3")

## What an environment variable forces among `choices`; "auto" when unset
## or unknown. Read once per search, never by the engine.
.envChoice <- function(name, choices) {
    value <- Sys.getenv(name, "auto")
    if (value %in% choices) value else "auto"
}

## One engine call with its arguments by name: ref and query are p x n
## double matrices (query NULL for a self search); the rest as the engine
## takes them (src/glue.c, C_knn_search), checked by the caller. The one
## place that knows the .Call's arguments, for the verbs and the benchmark
## scripts. select, rowsApart, block, stagePeers and duplicates are the
## engine's test and tuning knobs (knn_knobs in src/engine/knn.h), apart
## from the search's own arguments: the GPU's selection forced
## (.gpuSelects), whether it sets crowded rows apart (.rowsApart), nodes
## per block of a streamed search, (stagePeers, for measurements) several
## GPUs staging each other's arrays as GPUs without peer access do, and
## how exact copies are searched (.duplicates).
.engineSearch <- function(ref, query = NULL, k, metric, gpu = FALSE,
                          threads = 0L, memory = 0, devices = integer(),
                          progress = FALSE, edges = FALSE,
                          algorithm = "auto", precision = "auto",
                          select = "auto", rowsApart = "auto", block = 0L,
                          stagePeers = FALSE, duplicates = "auto") {
    knobs <- c(select = match(select, .gpuSelects) - 1L,
               keep_rows_in_tiles = as.integer(rowsApart == "never"),
               block_nodes = as.integer(block),
               stage_peers = as.integer(stagePeers),
               duplicates = match(duplicates, .duplicates) - 1L)
    .Call(C_knn_search, ref, query, as.integer(k), .metricCode(metric),
          as.integer(gpu), as.integer(threads), as.double(memory),
          as.integer(devices), progress, edges,
          match(algorithm, .algorithms) - 1L,
          match(precision, .precisions) - 1L, knobs)
}

## The engine stopped without a result: the user interrupted it (or an
## error such as setTimeLimit()'s reached its poll), which R raises again
## now that the engine has freed everything; or it refused some nodes,
## which R then names.
.stopProblem <- function(problem, ref, query, metric) {
    if (problem$status == "interrupted") {
        caught <- problem$condition
        if (inherits(caught, "error")) stop(caught)
        .signalInterrupt(caught)
    }
    .stopBadNodes(problem$message, ref, query, metric)
}
