## Helpers of the GPU tests (test-gpu-*.R): the CPU engine is the reference,
## and the GPU must give the same bits.

## gpuPrecision: the GPU's rung ("tf32" exists there only); the CPU's is
## its default.
gpuSearchBoth <- function(x, k, metric, by = "rows", query = NULL, ...,
                          gpuPrecision = "auto") {
    args <- list(x = x, query = query, k = k, metric = metric, by = by,
                 progress = FALSE, ...)
    list(cpu = do.call(knnSearch, c(args, device = "cpu")),
         gpu = do.call(knnSearch, c(args, device = "gpu",
                                    precision = gpuPrecision)))
}

expectGpuIdentical <- function(x, k, metric, by = "rows", query = NULL,
                               label = "", ...) {
    got <- gpuSearchBoth(x, k, metric, by, query, ...)
    label <- sprintf("%s %s %s k=%d", label, metric, by, k)
    expect_identical(got$gpu$index, got$cpu$index, label = label)
    expect_identical(got$gpu$distance, got$cpu$distance, label = label)
    invisible(got)
}

## Free bytes of GPU 0, unrounded (gpuInfo() rounds to 0.1 GB).
gpuFreeBytes <- function() {
    .Call(knngpu:::C_knn_gpu_info)$devices$memory_free[1L]
}

## Runs search(), a searchUnderTimeLimit() call, twice: the first loads
## what CUDA keeps resident (kernels), and the second must stop within a
## second of its limit and leave GPU 0's free memory as it found it.
expectInterruptFreesDevice <- function(search) {
    search()
    before <- gpuFreeBytes()
    got <- search()
    expect_match(got$err, "interrupted|time limit")
    expect_lt(got$took, 2.5)
    expect_identical(gpuFreeBytes(), before)
}

## Runs `code` (R source text) in a fresh Rscript with a search that it
## starts after writing its pid, sends it SIGINT `after` seconds later (and
## after `ready()`, when given, has returned TRUE) and returns what the
## child wrote: its tryCatch() outcome ("interrupt", "finished" or an error
## message), then whatever `report` (R source text) printed after it, and
## the seconds from the signal to the child's answer.
rscriptInterrupted <- function(setup, code, report = "", after = 0.5,
                               ready = NULL) {
    dir <- tempfile("knngpu-interrupt")
    dir.create(dir)
    pid_file <- file.path(dir, "pid")
    out_file <- file.path(dir, "out")
    answered_file <- file.path(dir, "answered")
    script <- file.path(dir, "run.R")
    writeLines(c(
        "suppressPackageStartupMessages(library(knngpu))", setup,
        sprintf("writeLines(as.character(Sys.getpid()), '%s')", pid_file),
        sprintf(paste("res <- tryCatch({%s; 'finished'}, interrupt =",
                      "function(c) 'interrupt', error = conditionMessage)"),
                code),
        sprintf("writeLines(format(as.numeric(Sys.time()), digits = 15),
                '%s')", answered_file),
        sprintf("writeLines(c(res, %s), '%s')",
                if (nzchar(report)) report else "character()", out_file)),
        script)
    ## Since R 4.4 a child of system2(wait = FALSE) starts with SIGINT
    ## ignored, as a shell's background job does, and an ignored signal
    ## stays ignored across exec: the child would never see ours. env
    ## (coreutils 8.31 on) gives it the default disposition back first.
    system2("env", c("--default-signal=INT",
                     file.path(R.home("bin"), "Rscript"), script),
            wait = FALSE,
            env = paste0("R_LIBS=", paste(.libPaths(), collapse = ":")))
    waitFor <- function(path, seconds) {
        limit <- proc.time()[["elapsed"]] + seconds
        while (!file.exists(path) && proc.time()[["elapsed"]] < limit) {
            Sys.sleep(0.02)
        }
        file.exists(path)
    }
    if (!waitFor(pid_file, 120)) return(list(lines = "no pid", took = NA))
    if (!is.null(ready)) {
        limit <- proc.time()[["elapsed"]] + 120
        while (!ready() && proc.time()[["elapsed"]] < limit) Sys.sleep(0.05)
    }
    Sys.sleep(after)
    pid <- as.integer(readLines(pid_file))
    tools::pskill(pid, tools::SIGINT)
    sent <- as.numeric(Sys.time())
    if (!waitFor(out_file, 30)) return(list(lines = "no answer", took = NA))
    Sys.sleep(0.1)
    list(lines = readLines(out_file),
         took = as.numeric(readLines(answered_file)) - sent)
}
