## Beyond memory and one process: what streaming the nodes through a GPU
## smaller than them costs, and what BiocParallel workers give, against the
## same search in one piece in the same run; every variant's bits are
## checked against the one-piece result.
##
## Usage, from the repository root, with knngpu installed in R_LIBS:
##   Rscript inst/bench/beyond.R [--gpu=yes|no] [--n=N] [--workers=W]
##                               [--out=FILE]
##   --gpu      also time the GPU cases (default: yes where a GPU is usable)
##   --n        nodes of the GPU cases (default 1e6; the CPU cases take
##              n / 20)
##   --workers  SnowParam workers for the BPPARAM rows (default 2)
##   --out      append the markdown table to FILE
## Data: N(0,1) nodes of 50 features plus a cluster mean per node (20
## clusters), euclidean, k = 15. Times are wall-clock seconds of one run
## after a warm-up search, end to end (R matrix in, index out).

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")

gpu <- argValue("gpu", if (gpuAvailable()) "yes" else "no") == "yes"
n <- as.numeric(argValue("n", "1e6"))
workers <- as.integer(argValue("workers", "2"))
out <- argValue("out", "")

clustered <- function(n, p, seed) {
    set.seed(seed)
    centres <- matrix(rnorm(20 * p, sd = 2), 20)
    centres[sample(20, n, replace = TRUE), ] + matrix(rnorm(n * p), n)
}

timed <- function(expr) {
    start <- Sys.time()
    value <- force(expr)
    list(value = value, seconds = as.numeric(Sys.time()) -
                                  as.numeric(start))
}

rows <- list()
addRow <- function(case, variant, run, whole) {
    same <- identical(run$value$index, whole$value$index) &&
        identical(run$value$distance, whole$value$distance)
    rows[[length(rows) + 1L]] <<- data.frame(
        case = case, variant = variant, seconds = signif(run$seconds, 3),
        ratio = signif(run$seconds / whole$seconds, 3),
        identical = same,
        blocks = attr(run$value, "timings")$col_tile)
}

search <- function(x, device, ...) {
    knnSearch(x, k = 15, metric = "euclidean", device = device,
              progress = FALSE, ...)
}

if (gpu) {
    x <- clustered(n, 50, 1)
    case <- sprintf("gpu %.0f x 50", n)
    invisible(search(x[1:5000, ], "gpu"))
    whole <- timed(search(x, "gpu"))
    addRow(case, "whole on the device", whole, whole)
    nodeBytes <- n * 50 * 12
    for (share in c(0.5, 0.25, 0.1)) {
        old <- options(knngpu.gpu.memory = share * nodeBytes)
        run <- timed(search(x, "gpu"))
        options(old)
        addRow(case, sprintf("budget %.0f%% of the nodes' bytes",
                             100 * share), run, whole)
    }
}

x <- clustered(n / 20, 50, 2)
case <- sprintf("cpu %.0f x 50", n / 20)
invisible(search(x[1:2000, ], "cpu"))
whole <- timed(search(x, "cpu"))
addRow(case, "one process", whole, whole)
run <- timed(search(x, "cpu", BPPARAM = BiocParallel::SnowParam(workers)))
addRow(case, sprintf("SnowParam(%d)", workers), run, whole)
run <- timed(search(x, "cpu",
                    BPPARAM = BiocParallel::MulticoreParam(workers)))
addRow(case, sprintf("MulticoreParam(%d)", workers), run, whole)
if (gpu) {
    run <- timed(search(x, "gpu", BPPARAM = BiocParallel::SnowParam(workers)))
    addRow(case, sprintf("SnowParam(%d), GPU workers", workers), run, whole)
}

table <- do.call(rbind, rows)
header <- sprintf("%s, %s, %s", Sys.Date(), Sys.info()[["nodename"]],
                  if (gpu) gpuInfo()$devices$name[1L] else "CPU only")
lines <- c(paste("###", header), "",
           paste("| case | variant | seconds | ratio to one piece |",
                 "identical | block (nodes) |"),
           "|---|---|---:|---:|---|---:|",
           sprintf("| %s | %s | %s | %s | %s | %s |", table$case,
                   table$variant, table$seconds, table$ratio,
                   table$identical, table$blocks), "")
writeLines(lines)
if (nzchar(out)) cat(lines, file = out, sep = "\n", append = TRUE)
