## Atlas-sized graphs on every GPU of one host: the Euclidean k = 15
## neighbours of N(0,1) nodes x 50 features at growing n, end to end from
## R (matrix in, index and distance matrices out), with the phases, the
## R session's peak memory and the result's precision.
##
## Usage, on a machine with one or more GPUs, from the repository root,
## with knngpu installed in R_LIBS:
##   Rscript inst/bench/atlas.R [--n=1e6,4e6,1e7]
## The nodes are drawn on every core (parallel::mclapply, one L'Ecuyer
## stream per block of nodes), which is not timed: R's rnorm() on one
## core takes about a minute for 30M x 50.
## The GPUs' memory in use can be followed beside it with
##   nvidia-smi --query-gpu=index,memory.used --format=csv -lms 1000

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")

sizes <- as.numeric(strsplit(argValue("n", "1e6,4e6,1e7"), ",")[[1L]])
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
## n N(0,1) nodes x p, drawn in blocks of nodes on every core.
drawNodes <- function(n, p = 50L) {
    cores <- parallel::detectCores()
    edges <- round(seq(0, n, length.out = cores + 1L))
    RNGkind("L'Ecuyer-CMRG")
    set.seed(7)
    blocks <- parallel::mclapply(seq_len(cores), function(b) {
        rnorm(p * (edges[b + 1L] - edges[b]))
    }, mc.cores = cores, mc.set.seed = TRUE)
    x <- matrix(0, p, n)
    for (b in seq_len(cores))
        if (edges[b + 1L] > edges[b])
            x[, (edges[b] + 1):edges[b + 1L]] <- blocks[[b]]
    x
}

## R's peak memory is read after the nodes are drawn (the drawing holds
## them twice) and again after the search.
cat("| n | GPUs | end to end s | search s | each pair once |",
    "R peak GB, nodes drawn / after search | precision |\n",
    "|---:|---:|---:|---:|---|---|---|\n", sep = "")
for (n in sizes) {
    x <- drawNodes(n)
    drawn <- peakGb()
    seconds <- system.time(
        found <- knnSearch(x, k = 15, metric = "euclidean", by = "columns",
                           device = "gpu", devices = ids,
                           progress = FALSE))[["elapsed"]]
    tm <- attr(found, "timings")
    cat(sprintf("| %.0e | %d | %.1f | %.1f | %s | %.1f / %.1f | %s |\n",
                n, length(ids), seconds, tm$seconds_search, tm$pairs_once,
                drawn, peakGb(), attr(found, "precision")))
    rm(found, x)
    invisible(gc())
}
