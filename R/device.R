## Internal: which device a search runs on, and with what memory budget.

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

## GPU ids as a user gives them, checked where the GPUs cannot be counted
## (a BiocParallel worker or a KnngpuParam may run elsewhere): NULL, or
## distinct whole numbers from 0. .checkDevices() checks them against this
## machine's GPUs when the search runs.
.checkDeviceIds <- function(devices) {
    if (is.null(devices)) return(NULL)
    ok <- is.numeric(devices) && length(devices) >= 1L &&
        length(devices) <= 1024L && !anyNA(devices) &&
        all(is.finite(devices)) && all(devices == round(devices)) &&
        all(devices >= 0) && !anyDuplicated(devices)
    if (!ok) {
        stop("'devices' must be NULL or GPU ids (see gpuInfo()): distinct ",
             "whole numbers from 0", call. = FALSE)
    }
    as.integer(devices)
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
