## Small searches, where a call's fixed costs outweigh its products (issue
## 41's targets: at most 1.5 ms and 2 ms end to end): 4096 queries against
## 16384 references of 128 features, and 1000 queries against 100000
## references of 50 features, k = 16, Euclidean, N(0,1), by = "columns".
## For each, the medians over --reps warm calls of the wall clock from R
## and of the engine's phases (attr(, "timings"), what verbose = TRUE
## prints): where the time goes. Phases: engine (the .Call's search, from
## the checks to the result), setup (stream, handles, tile buffers and
## their release), prepare (upload and normalisation), search, re-rank,
## copy-out, and R (the wall clock outside the engine: argument checks,
## the result's attributes). In the same run, where python3 imports them,
## FAISS GPU (GpuIndexFlatL2, peers/faiss_knn.py) and cuVS brute force
## (peers/cuvs_knn.py) on the same data, and knngpu's time over theirs.
##
## Usage, from the repository root, with knngpu installed in R_LIBS (and
## the peers as inst/bench/gpu.R and inst/bench/shapes.R describe):
##   Rscript inst/bench/small.R [--reps=50] [--peers=yes|no]
##                              [--device=gpu|cpu] [--cases=a,b]
## Milliseconds. --device=cpu times the same calls on the CPU (no peers).

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "peers", "faiss.R"))
source(file.path("inst", "bench", "peers", "cuvs.R"))

cases <- list(
    s16k_q4k_d128 = list(n = 16384, nq = 4096, d = 128, k = 16,
                         target = 1.5),
    s100k_q1k_d50 = list(n = 100000, nq = 1000, d = 50, k = 16,
                         target = 2))
wanted <- argValue("cases", "")
if (nzchar(wanted)) cases <- cases[strsplit(wanted, ",")[[1L]]]
reps <- as.integer(argValue("reps", "50"))
device <- argValue("device", "gpu")
peers <- device == "gpu" && argValue("peers", "yes") != "no"
withFaiss <- peers && faissAvailable()
withCuvs <- peers && cuvsAvailable()

phases <- c(engine = "elapsed", setup = "seconds_setup",
            prepare = "seconds_prepare", search = "seconds_search",
            rerank = "seconds_rerank", copy_out = "seconds_collect")

## One call's wall clock and phases, in milliseconds.
timeCall <- function(ref, query, case) {
    start <- as.numeric(Sys.time())
    res <- knnSearch(ref, query, k = case$k, metric = "euclidean",
                     by = "columns", device = device, progress = FALSE)
    wall <- as.numeric(Sys.time()) - start
    t <- attr(res, "timings")
    got <- vapply(phases, function(p) as.numeric(t[[p]]), numeric(1))
    1000 * c(wall = wall, got, R = wall - t$elapsed)
}

set.seed(1)
rows <- list()
for (name in names(cases)) {
    case <- cases[[name]]
    x <- matrix(rnorm((case$n + case$nq) * case$d), nrow = case$d)
    ref <- x[, seq_len(case$n)]
    query <- x[, case$n + seq_len(case$nq)]
    for (i in seq_len(20)) invisible(timeCall(ref, query, case))
    runs <- vapply(seq_len(reps), function(i) timeCall(ref, query, case),
                   numeric(length(phases) + 2L))
    ours <- apply(runs, 1, stats::median)
    faiss <- cuvs <- NA_real_
    if (withFaiss || withCuvs) {
        file <- faissFile(t(x))
        if (withFaiss) {
            faiss <- 1000 * faissSearch(file, case$n, case$d, case$k,
                                        "euclidean", "gpu", nq = case$nq,
                                        reps = reps)$seconds
        }
        if (withCuvs) {
            cuvs <- 1000 * cuvsSearch(file, case$n, case$d, case$k,
                                      "euclidean", nq = case$nq)$seconds
        }
        unlink(file)
    }
    rm(x, ref, query)
    rows[[name]] <- data.frame(
        case = name, target = case$target, t(round(ours, 3)),
        faiss = round(faiss, 3), cuvs = round(cuvs, 3),
        over_faiss = round(ours[["wall"]] / faiss, 2),
        over_cuvs = round(ours[["wall"]] / cuvs, 2))
    print(rows[[name]], row.names = FALSE)
}

machine <- if (device == "gpu") gpuInfo()$devices$name[1L] else
    sprintf("CPU (%d cores)", parallel::detectCores())
cat(sprintf(paste0("\n%s; %s; R %s; median of %d warm calls, ms; ",
                   "command: Rscript inst/bench/small.R --reps=%d%s\n"),
            machine, format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"),
            getRversion(), reps, reps,
            if (device != "gpu") paste0(" --device=", device) else ""))
if (peers && !withFaiss) cat("FAISS GPU: python3 cannot import faiss\n")
if (peers && !withCuvs) cat("cuVS: python3 cannot import cuvs\n")
print(do.call(rbind, rows), row.names = FALSE)
