## Atlas-sized graphs on every GPU of one host: the Euclidean k = 15
## neighbours of N(0,1) nodes x 50 features at growing n, end to end from
## R (matrix in, index and distance matrices out), with the phases, the
## R session's peak memory and the result's precision.
##
## Usage, on a machine with one or more GPUs, from the repository root,
## with knngpu installed in R_LIBS:
##   Rscript inst/bench/atlas.R [--n=1e6,4e6,1e7]
## The GPUs' memory in use can be followed beside it with
##   nvidia-smi --query-gpu=index,memory.used --format=csv -lms 1000

suppressPackageStartupMessages(library(knngpu))

args <- commandArgs(trailingOnly = TRUE)
hit <- grep("^--n=", args, value = TRUE)
sizes <- as.numeric(strsplit(if (length(hit)) sub("^--n=", "", hit[1L])
                             else "1e6,4e6,1e7", ",")[[1L]])
ids <- gpuInfo()$devices$id
stopifnot(length(ids) >= 1L)

## Peak resident memory of this R session, GB (Linux).
peakGb <- function() {
    line <- grep("^VmHWM", readLines("/proc/self/status"), value = TRUE)
    as.numeric(gsub("[^0-9]", "", line)) / 1048576
}

cat(sprintf("%s; %d x %s\n",
            format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"),
            length(ids), paste(unique(gpuInfo()$devices$name),
                               collapse = ", ")))
invisible(knnSearch(matrix(rnorm(50 * 5000), 50), k = 15, by = "columns",
                    device = "gpu", devices = ids, progress = FALSE))
cat("| n | GPUs | end to end s | search s | each pair once |",
    "R peak GB | precision |\n|---:|---:|---:|---:|---|---:|---|\n")
for (n in sizes) {
    set.seed(7)
    x <- matrix(rnorm(50 * n), 50)
    seconds <- system.time(
        found <- knnSearch(x, k = 15, metric = "euclidean", by = "columns",
                           device = "gpu", devices = ids,
                           progress = FALSE))[["elapsed"]]
    tm <- attr(found, "timings")
    cat(sprintf("| %.0e | %d | %.1f | %.1f | %s | %.1f | %s |\n", n,
                length(ids), seconds, tm$seconds_search, tm$pairs_once,
                peakGb(), attr(found, "precision")))
    rm(found, x)
    invisible(gc())
}
