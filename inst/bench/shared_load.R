## Threads on a shared machine: the CPU search on 1 thread and on 2 while
## other processes keep the cores busy, as on a login node or a shared
## workstation. With waits that spin, a thread that the scheduler has
## parked holds every other one; two threads then take longer than one.
##
## Under the load, the engine lowers the threads to the free cores
## (src/engine/knn_threads.c), so threads = 2 runs on 1 there; where
## OpenMP's waits sleep, it keeps the 2 asked for, which the second form
## measures:
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript inst/bench/shared_load.R [--reps=N] [--load=N]
##   OMP_WAIT_POLICY=passive Rscript inst/bench/shared_load.R [--reps=N]
##
##   --reps=N  runs per thread count (median reported; default 7)
##   --load=N  busy processes beside the search (default: one per core)
##
## Data: 3000 x 20 random (set.seed(42)), k = 10, Euclidean, the case of
## issue 42; then the same without the load, for comparison. Prints one
## line per (load, threads): the median seconds and the runs.

source(file.path("tools", "args.R"))
suppressPackageStartupMessages(library(knngpu))
reps <- as.integer(argValue("reps", "7"))
load <- as.integer(argValue("load", as.character(parallel::detectCores())))

set.seed(42)
x <- matrix(rnorm(3000 * 20), 3000)

timeRuns <- function(threads) {
    vapply(seq_len(reps), function(i) {
        system.time(knnSearch(x, k = 10, metric = "euclidean",
                              device = "cpu", threads = threads,
                              progress = FALSE))[["elapsed"]]
    }, numeric(1))
}

report <- function(label) {
    for (threads in c(1L, 2L)) {
        t <- timeRuns(threads)
        cat(sprintf("%-9s threads = %d: median %.3f s (runs %s)\n", label,
                    threads, stats::median(t),
                    paste(sprintf("%.3f", t), collapse = " ")))
    }
}

## Busy processes: each spins on arithmetic until killed.
busy <- lapply(seq_len(load), function(i) {
    parallel::mcparallel({
        s <- 0
        repeat s <- s + sqrt(stats::runif(1e5))
    })
})
Sys.sleep(0.5)
report(sprintf("load %d", load))
tools::pskill(vapply(busy, `[[`, 0L, "pid"))
invisible(parallel::mccollect(busy, wait = TRUE))
report("no load")
