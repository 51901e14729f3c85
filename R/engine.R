## Internal: choosing the device and running the engine once.

.state <- new.env(parent = emptyenv())

## "cpu" or "gpu": what device = "auto" | "cpu" | "gpu" means on this machine.
## "auto" falls back to the CPU and says so once per session.
.resolveDevice <- function(device) {
    device <- .checkChoice(device, c("auto", "cpu", "gpu"), "device")
    if (device == "cpu") return("cpu")
    info <- gpuInfo()
    usable <- .gpuUsable(info)
    if (device == "gpu" && !usable) {
        stop("device = \"gpu\" but no GPU can be used: ", info$reason,
             call. = FALSE)
    }
    if (usable) return("gpu")
    if (!isTRUE(.state$toldCpu)) {
        message("knngpu: using the CPU; no GPU: ", info$reason)
        .state$toldCpu <- TRUE
    }
    "cpu"
}

.checkDevices <- function(devices, backend) {
    if (is.null(devices) || backend == "cpu") return(integer())
    count <- nrow(gpuInfo()$devices)
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
## Returns the engine's list(index, distance, weight, info), info extended
## with the metric, sizes and elapsed seconds.
.runEngine <- function(ref, query, k, metric, device, threads, progress,
                       verbose, devices) {
    backend <- .resolveDevice(device)
    devices <- .checkDevices(devices, backend)
    threads <- .checkThreads(threads)
    progress <- .checkFlag(progress, "progress")
    verbose <- .checkFlag(verbose, "verbose")
    start <- proc.time()[["elapsed"]]
    res <- .Call(C_knn_search, ref$values, query$values, k,
                 .metricCode(metric), as.integer(backend == "gpu"), threads,
                 .memoryBudget(backend), devices, progress)
    res$info$elapsed <- proc.time()[["elapsed"]] - start
    res$info$backend <- backend
    res$info$metric <- metric
    res$info$k <- k
    res$info$nodes <- ncol(ref$values)
    res$info$features <- nrow(ref$values)
    if (verbose) .reportRun(res$info)
    res
}

.reportRun <- function(info) {
    message(sprintf(paste0("knngpu: %d nodes x %d features, %s, k = %d on %s",
                           " [%s]\n"), info$nodes, info$features, info$metric,
                    info$k, info$device, info$precision),
            sprintf(paste0("knngpu: prepare %.3f s, search %.3f s, re-rank ",
                           "%.3f s, total %.3f s; %.1f candidates per node; ",
                           "tiles %d x %d"), info$seconds_prepare,
                    info$seconds_search, info$seconds_rerank, info$elapsed,
                    info$candidates, info$row_tile, info$col_tile))
}
