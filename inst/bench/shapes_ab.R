## knngpu alone on the data shapes, for comparing two builds of the
## package side by side: each kind's time end to end, the engine's phases
## (the timings attribute), its candidates a row, whether each pair was
## computed once, the precision, and a checksum of the neighbour indices
## (equal checksums: the same result). Run it once per build, alternating,
## in the same session on the same machine:
##   R_LIBS=/lib/before Rscript inst/bench/shapes_ab.R [--n=N] [--kinds=a,b]
##                             [--device=gpu|cpu] [--reps=R]
##   R_LIBS=/lib/after  Rscript inst/bench/shapes_ab.R ...
##   --n      nodes per data kind (default 1000000)
##   --kinds  data kinds of inst/bench/shapes-data.R (default normal,heavy)
##   --device knngpu's device (default gpu)
##   --reps   timed runs after a warm-up; the smallest is shown (default 2)
## Euclidean, k = 10, the nodes as columns (by = "columns").

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "shapes-data.R"))

n <- as.numeric(argValue("n", "1000000"))
kinds <- strsplit(argValue("kinds", "normal,heavy"), ",")[[1L]]
device <- argValue("device", "gpu")
reps <- as.integer(argValue("reps", "2"))
library_dir <- strsplit(Sys.getenv("R_LIBS"), ":")[[1L]][1L]

search <- function(x) {
    knnSearch(x, k = 10, metric = "euclidean", by = "columns",
              device = device, progress = FALSE)
}

## A checksum of the indices that any change of a neighbour or its order
## changes.
checksum <- function(index) {
    sum(as.numeric(index) * seq_along(index) %% 1000003)
}

cat(sprintf("library %s, %s, %s\n", library_dir, device,
            format(Sys.time(), tz = "UTC", usetz = TRUE)))
cat("| data | n x d | s | search s | re-rank s | candidates a row |",
    "each pair once | checksum | precision |\n")
cat("|---|---|---:|---:|---:|---:|---|---|---|\n")
for (kind in kinds) {
    x <- t(shapeData(kind, n))
    got <- search(x)
    seconds <- vapply(seq_len(reps), function(i)
        system.time(got <<- search(x))[["elapsed"]], 0)
    tm <- attr(got, "timings")
    cat(sprintf(paste("| %s | %d x %d | %.3f | %.3f | %.3f | %.1f | %s |",
                      "%.0f | %s |\n"),
                kind, ncol(x), nrow(x), min(seconds), tm$seconds_search,
                tm$seconds_rerank, tm$candidates, tm$pairs_once,
                checksum(got$index), attr(got, "precision")))
}
