## Where a GPU search spends its time: the engine's phase timings
## (attr(, "timings"), what verbose = TRUE prints) next to the wall clock of
## the whole call, for the benchmark shapes of inst/bench/gpu.R. Phases:
## setup (stream, cuBLAS handle, tile buffers, their release), prepare
## (upload, normalisation), search (products and candidate selection),
## re-rank (exact float64 keys and sort), copy-out (results into R's
## arrays, overlapping the next tile's search), R (the call's time outside
## the engine: checks, allocation, the edge list).
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/gpu_phases.R [--cases=a,b] [--reps=5]
## Milliseconds; the median of --reps runs after a warm-up run.

suppressPackageStartupMessages(library(knngpu))

source("tools/args.R")

cases <- list(
    s16k_q4k_d128_k16 = list(n = 16384, nq = 4096, d = 128, k = 16,
                             verb = "search"),
    g100k_d50_k10 = list(n = 1e5, nq = 0, d = 50, k = 10, verb = "graph"),
    g262k_d128_k100 = list(n = 262144, nq = 0, d = 128, k = 100,
                           verb = "graph"),
    g1M_d50_k15 = list(n = 1e6, nq = 0, d = 50, k = 15, verb = "graph"),
    g262k_d128_k1024 = list(n = 262144, nq = 0, d = 128, k = 1024,
                            verb = "graph"),
    s262k_d128_k1024 = list(n = 262144, nq = 0, d = 128, k = 1024,
                            verb = "search"),
    s262k_d128_k4096 = list(n = 262144, nq = 0, d = 128, k = 4096,
                            verb = "search"))
wanted <- argValue("cases", "")
if (nzchar(wanted)) cases <- cases[strsplit(wanted, ",")[[1L]]]
reps <- as.integer(argValue("reps", "5"))

runOnce <- function(ref, query, case) {
    start <- as.numeric(Sys.time())
    res <- if (case$verb == "graph") {
        knnGraph(ref, k = case$k, metric = "euclidean", by = "columns",
                 device = "gpu", progress = FALSE)
    } else {
        knnSearch(ref, query, k = case$k, metric = "euclidean",
                  by = "columns", device = "gpu", progress = FALSE)
    }
    wall <- as.numeric(Sys.time()) - start
    t <- attr(res, "timings")
    rm(res)
    1000 * c(wall = wall, engine = t$elapsed, setup = t$seconds_setup,
             prepare = t$seconds_prepare, search = t$seconds_search,
             rerank = t$seconds_rerank, copy_out = t$seconds_collect,
             R = wall - t$elapsed)
}

set.seed(1)
rows <- list()
for (name in names(cases)) {
    case <- cases[[name]]
    x <- matrix(rnorm((case$n + case$nq) * case$d), nrow = case$d)
    ref <- x[, seq_len(case$n)]
    query <- if (case$nq > 0) x[, case$n + seq_len(case$nq)] else NULL
    rm(x)
    n <- if (case$n * case$k > 1e8) 1L else reps
    invisible(runOnce(ref, query, case))
    runs <- vapply(seq_len(n), function(i) {
        gc(verbose = FALSE)
        runOnce(ref, query, case)
    }, numeric(8))
    rows[[name]] <- data.frame(case = name, verb = case$verb, runs = n,
                               t(round(apply(runs, 1, stats::median), 1)))
    print(rows[[name]], row.names = FALSE)
}
cat(sprintf("\n%s; %s\n", gpuInfo()$devices$name[1L],
            format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")))
print(do.call(rbind, rows), row.names = FALSE)
