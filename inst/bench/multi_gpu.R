## Several GPUs against one: the Euclidean graph (k = 15) of N(0,1) nodes
## x 50 features on the first GPU and on every GPU, with the edges checked
## identical, end to end (R matrix in, edge data.frame out).
##
## Usage, on a machine with two or more GPUs, from the repository root,
## with knngpu installed in R_LIBS:
##   Rscript inst/bench/multi_gpu.R [--n=1e6,4e6]
##
## Times: the median of 3 runs where one GPU takes under 5 s, else one
## run, after a small search that loads every device. The speed-up is one
## GPU's time over all of theirs; "each pair once" says whether each
## search computed each pair once (one GPU's walk, then the walk the GPUs
## share).

suppressPackageStartupMessages(library(knngpu))

args <- commandArgs(trailingOnly = TRUE)
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L]) else default
}
sizes <- as.numeric(strsplit(argValue("n", "1e6,4e6"), ",")[[1L]])
ids <- gpuInfo()$devices$id
stopifnot(length(ids) >= 2L)

## Seconds of `reps` graphs on `devices` (the median), and the last graph.
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

set.seed(11)
cat(sprintf("%s; %s\n", paste(gpuInfo()$devices$name, collapse = ", "),
            format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")))
cat("| n | 1 GPU s | all GPUs s | speed-up | edges identical |",
    "each pair once |\n")
cat("|---:|---:|---:|---:|---|---|\n")
pairsOnce <- function(graph) isTRUE(attr(graph, "timings")$pairs_once)
for (n in sizes) {
    x <- matrix(rnorm(50 * n), 50)
    invisible(knnSearch(x[, seq_len(5000)], k = 15, by = "columns",
                        device = "gpu", devices = ids, progress = FALSE))
    one <- timeGraph(x, ids[1L], 1L)
    reps <- if (one$seconds < 5) 3L else 1L
    if (reps > 1L) one <- timeGraph(x, ids[1L], reps)
    all <- timeGraph(x, ids, reps)
    columns <- c("from", "to", "weight", "distance", "rank")
    same <- identical(unclass(one$graph)[columns],
                      unclass(all$graph)[columns])
    cat(sprintf("| %g | %.3f | %.3f | %.2f | %s | %s / %s |\n", n,
                one$seconds, all$seconds, one$seconds / all$seconds, same,
                pairsOnce(one$graph), pairsOnce(all$graph)))
    rm(x, one, all)
    invisible(gc())
}
