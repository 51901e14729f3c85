## Several GPUs against one: the Euclidean graph (k = 15) of N(0,1) nodes
## x 50 features on 1, 2, 4, ... of the host's GPUs, with the edges checked
## identical to one GPU's, end to end (R matrix in, edge data.frame out),
## and the engine's phases.
##
## Usage, on a machine with two or more GPUs, from the repository root,
## with knngpu installed in R_LIBS:
##   Rscript inst/bench/multi_gpu.R [--n=1e6,4e6] [--devices=1,2,4]
##   --devices  how many GPUs each run takes (the first ones listed by
##              gpuInfo(); counts beyond the host's are skipped)
##
## Times: the median of 3 runs where one GPU takes under 5 s, else one
## run, after a small search that loads every device. The speed-up is one
## GPU's time over that count's; "each pair once" says whether the search
## computed each pair once (on one GPU, or in the walk the GPUs share).
## Phases (milliseconds, from the last run's timings): setup, prepare
## (upload and node preparation), search (candidates), re-rank and
## copy-out; "R" is what the end-to-end time adds to the engine's.

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")

sizes <- as.numeric(strsplit(argValue("n", "1e6,4e6"), ",")[[1L]])
ids <- gpuInfo()$devices$id
counts <- as.integer(strsplit(argValue("devices", "1,2,4"), ",")[[1L]])
if (anyNA(counts) || any(counts < 1L)) {
    stop("--devices must be positive whole numbers, e.g. --devices=1,2,4")
}
counts <- counts[counts <= length(ids)]
stopifnot(length(ids) >= 2L, 1L %in% counts)

## `reps` graphs on `devices`: the median seconds and the last graph.
timeGraph <- function(x, devices, reps) {
    graph <- NULL
    seconds <- vapply(seq_len(reps), function(r) {
        system.time(graph <<- knnGraph(x, k = 15, metric = "euclidean",
                                       by = "columns", device = "gpu",
                                       devices = devices,
                                       progress = FALSE))[["elapsed"]]
    }, numeric(1))
    list(seconds = stats::median(seconds), graph = graph)
}

## The phases of a graph's search, milliseconds.
phases <- function(graph, seconds) {
    tm <- attr(graph, "timings")
    engine <- tm$seconds_setup + tm$seconds_prepare + tm$seconds_search +
        tm$seconds_rerank + tm$seconds_collect
    sprintf("%.0f / %.0f / %.0f / %.0f / %.0f / %.0f",
            1000 * tm$seconds_setup, 1000 * tm$seconds_prepare,
            1000 * tm$seconds_search, 1000 * tm$seconds_rerank,
            1000 * tm$seconds_collect, 1000 * (seconds - engine))
}

set.seed(11)
cat(sprintf("%s; %s\n", paste(gpuInfo()$devices$name, collapse = ", "),
            format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")))
cat("| n | GPUs | s | speed-up | edges identical | each pair once |",
    "setup / prepare / search / re-rank / copy-out / R, ms |\n")
cat("|---:|---:|---:|---:|---|---|---|\n")
columns <- c("from", "to", "weight", "distance", "rank")
for (n in sizes) {
    x <- matrix(rnorm(50 * n), 50)
    invisible(knnSearch(x[, seq_len(5000)], k = 15, by = "columns",
                        device = "gpu", devices = ids, progress = FALSE))
    one <- timeGraph(x, ids[1L], 1L)
    reps <- if (one$seconds < 5) 3L else 1L
    for (count in counts) {
        run <- if (count == 1L && reps == 1L) one
               else timeGraph(x, ids[seq_len(count)], reps)
        if (count == 1L) one <- run
        same <- identical(unclass(one$graph)[columns],
                          unclass(run$graph)[columns])
        cat(sprintf("| %g | %d | %.3f | %.2f | %s | %s | %s |\n", n, count,
                    run$seconds, one$seconds / run$seconds, same,
                    isTRUE(attr(run$graph, "timings")$pairs_once),
                    phases(run$graph, run$seconds)))
    }
    rm(x, one, run)
    invisible(gc())
}
