## Internal: running the engine once, and what its answer means.

## Runs one search. ref, query: results of .asNodes() (query may be NULL).
## Returns the engine's list(index, distance, weight, info) of n x k
## matrices, or with edges = TRUE (self search) the directed edge list
## list(from, to, weight, distance, rank, info); info is extended with the
## metric, sizes and elapsed seconds.
.runEngine <- function(ref, query, k, metric, device, threads, progress,
                       verbose, devices, edges = FALSE) {
    backend <- .resolveDevice(device)
    devices <- .checkDevices(devices, backend)
    threads <- .checkThreads(threads)
    progress <- .checkFlag(progress, "progress")
    verbose <- .checkFlag(verbose, "verbose")
    algorithm <- .checkChoice(getOption("knngpu.algorithm", "auto"),
                              .algorithms, "knngpu.algorithm")
    start <- .wallSeconds()
    res <- .engineSearch(ref$values, query$values, k, metric,
                         gpu = backend == "gpu", threads = threads,
                         memory = .memoryBudget(backend), devices = devices,
                         progress = progress, edges = edges,
                         algorithm = algorithm,
                         select = .envChoice("KNNGPU_SELECT", .gpuSelects),
                         gemm = .envChoice("KNNGPU_GEMM", .gpuGemms))
    if (!is.null(res$problem)) .stopProblem(res$problem, ref, query, metric)
    res$info$elapsed <- .wallSeconds() - start
    res$info$backend <- backend
    res$info$metric <- metric
    res$info$k <- k
    res$info$nodes <- ncol(ref$values)
    res$info$features <- nrow(ref$values)
    if (verbose) .reportRun(res$info)
    res
}

## How the CPU searches (src/engine/knn.h, knn_algorithm, in this order):
## "auto" chooses by measured cost; "products" scans every pair through
## matrix products; "tree" uses a k-d tree (distance metrics only).
.algorithms <- c("auto", "products", "tree")

## The GPU's selection kernel and product arithmetic, chosen by measured
## cost ("auto") or forced (knn_select_force, knn_gemm_force, in order).
.gpuSelects <- c("auto", "warp", "radix")
.gpuGemms <- c("auto", "tf32", "fp32")

## What an environment variable forces among `choices`; "auto" when unset
## or unknown. Read once per search, never by the engine.
.envChoice <- function(name, choices) {
    value <- Sys.getenv(name, "auto")
    if (value %in% choices) value else "auto"
}

## One engine call with its arguments by name: ref and query are p x n
## double matrices (query NULL for a self search); the rest as the engine
## takes them (src/glue.c, C_knn_search). The one place that knows the
## .Call's arguments, for the verbs and the benchmark scripts.
.engineSearch <- function(ref, query = NULL, k, metric, gpu = FALSE,
                          threads = 0L, memory = 0, devices = integer(),
                          progress = FALSE, edges = FALSE,
                          algorithm = "auto", select = "auto",
                          gemm = "auto") {
    controls <- c(match(algorithm, .algorithms), match(select, .gpuSelects),
                  match(gemm, .gpuGemms)) - 1L
    .Call(C_knn_search, ref, query, as.integer(k), .metricCode(metric),
          as.integer(gpu), as.integer(threads), as.double(memory),
          as.integer(devices), progress, edges, controls)
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
