## Internal: choosing the device and running the engine once.

.state <- new.env(parent = emptyenv())

## "cpu" or "gpu": what device = "auto" | "cpu" | "gpu" means on this machine.
## "auto" falls back to the CPU and says so once per session.
.resolveDevice <- function(device) {
    device <- .checkChoice(device, c("auto", "cpu", "gpu"), "device")
    if (device == "cpu") return("cpu")
    gpu <- .gpuStatus()
    if (device == "gpu" && !gpu$usable) {
        stop("device = \"gpu\" but no GPU can be used: ", gpu$reason,
             call. = FALSE)
    }
    if (gpu$usable) return("gpu")
    if (!isTRUE(.state$toldCpu)) {
        message("knngpu: using the CPU; no GPU: ", gpu$reason)
        .state$toldCpu <- TRUE
    }
    "cpu"
}

## Whether a GPU can be used and how many there are, asked once per
## process: gpuInfo() queries every device's properties and free memory,
## a millisecond or more that a small search would pay on every call. A
## forked child asks again, since CUDA cannot be used there.
.gpuStatus <- function() {
    pid <- Sys.getpid()
    if (!identical(.state$gpuPid, pid)) {
        info <- gpuInfo()
        .state$gpu <- list(usable = .gpuUsable(info), reason = info$reason,
                           count = nrow(info$devices))
        .state$gpuPid <- pid
    }
    .state$gpu
}

.checkDevices <- function(devices, backend) {
    if (is.null(devices) || backend == "cpu") return(integer())
    count <- .gpuStatus()$count
    ok <- is.numeric(devices) && length(devices) >= 1L &&
        all(!is.na(devices)) && all(devices == round(devices)) &&
        all(devices >= 0) && all(devices < count) && !anyDuplicated(devices)
    if (!ok) {
        stop(sprintf(paste("'devices' must be NULL or distinct GPU ids from",
                           "0 to %d (see gpuInfo())"), count - 1L),
             call. = FALSE)
    }
    as.integer(devices)
}

.memoryBudget <- function(backend) {
    budget <- getOption(paste0("knngpu.", backend, ".memory"), 0)
    if (!is.numeric(budget) || length(budget) != 1L || is.na(budget) ||
        budget < 0) {
        stop(sprintf("option 'knngpu.%s.memory' must be a number of bytes",
                     backend), call. = FALSE)
    }
    as.double(budget)
}

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
                         algorithm = algorithm)
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

## One engine call with its arguments by name: ref and query are p x n
## double matrices (query NULL for a self search); the rest as the engine
## takes them (src/glue.c, C_knn_search). The one place that knows the
## .Call's arguments, for the verbs and the benchmark scripts.
.engineSearch <- function(ref, query = NULL, k, metric, gpu = FALSE,
                          threads = 0L, memory = 0, devices = integer(),
                          progress = FALSE, edges = FALSE,
                          algorithm = "auto") {
    .Call(C_knn_search, ref, query, as.integer(k), .metricCode(metric),
          as.integer(gpu), as.integer(threads), as.double(memory),
          as.integer(devices), progress, edges,
          match(algorithm, .algorithms) - 1L)
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

## Wall-clock seconds to the microsecond: proc.time() rounds down to
## milliseconds on Unix, which a small GPU search does not outlast by much.
.wallSeconds <- function() as.numeric(Sys.time())

.reportRun <- function(info) {
    gpu <- info$backend == "gpu"
    message(sprintf(paste0("knngpu: %d nodes x %d features, %s, k = %d on %s",
                           " [%s]\n"), info$nodes, info$features, info$metric,
                    info$k, info$device, info$precision),
            if (gpu) sprintf("knngpu: setup %.3f s, ", info$seconds_setup)
            else "knngpu: ",
            sprintf("prepare %.3f s, search %.3f s, re-rank %.3f s, ",
                    info$seconds_prepare, info$seconds_search,
                    info$seconds_rerank),
            if (gpu) sprintf("copy-out %.3f s, ", info$seconds_collect),
            sprintf(paste0("total %.3f s; %.1f candidates per node; ",
                           "tiles %d x %d"), info$elapsed, info$candidates,
                    info$row_tile, info$col_tile))
}
