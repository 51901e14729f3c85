## No cliffs: knngpu against FAISS flat search (float32, approximate) on the
## data shapes where exact methods fall off cliffs, in the same run, with the
## rows each gets wrong against a float64 reference.
##
## Usage, from the repository root, with knngpu installed in R_LIBS and
## python3 with faiss (pip install faiss-cpu; faiss-gpu on the GPU machine,
## ../shared/peers/faiss-gpu) on the PATH:
##   Rscript inst/bench/shapes.R [--device=cpu|gpu] [--n=N] [--check=R]
##                               [--kinds=a,b] [--out=FILE]
##   --device  knngpu's device, and FAISS's (IndexFlat or GpuIndexFlat)
##   --n       nodes per data kind (default 20000)
##   --check   rows checked against the float64 reference (default 500)
##   --kinds   data kinds below (default all)
##   --out     append the markdown table to FILE
##
## Data kinds: inst/bench/shapes-data.R (normal, levels, logcounts,
## neardup, clusters), at their full feature counts.
## Metrics: pearson, cosine, euclidean; k = 10 (15 for logcounts). Times
## are seconds, end to end from the float64 matrix on the host to the
## neighbour indices on the host, one run after a warm-up; FAISS's exclude
## the Python start and the file read. A row is wrong when a returned
## neighbour's float64 distance exceeds the row's exact k-th distance (by
## more than 1e-12 relative), so exact ties in either order count as right.

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "peers", "faiss.R"))
source(file.path("inst", "bench", "shapes-data.R"))

device <- argValue("device", "cpu")
n <- as.integer(argValue("n", "20000"))
checkRows <- as.integer(argValue("check", "500"))
kinds <- strsplit(argValue("kinds",
                           "normal,levels,logcounts,neardup,clusters"),
                  ",")[[1L]]
out <- argValue("out", "")

## float64 distances of node i to every node (R's own arithmetic); tx is
## t(x), the nodes in columns.
exactDistances <- function(tx, i, metric) {
    if (metric == "euclidean") return(sqrt(colSums((tx - tx[, i])^2)))
    y <- if (metric == "pearson") t(t(tx) - colMeans(tx)) else tx
    y <- t(t(y) / sqrt(colSums(y^2)))
    1 - as.vector(crossprod(y, y[, i]))
}

## For each index matrix of `found`, the rows (of those checked) whose
## neighbours are not a k nearest set.
wrongRows <- function(tx, found, metric, rows) {
    k <- ncol(found[[1L]])
    wrong <- vapply(rows, function(i) {
        d <- exactDistances(tx, i, metric)
        d[i] <- Inf
        kth <- sort(d, partial = k)[k]
        vapply(found, function(index) {
            got <- index[i, ]
            anyDuplicated(got) > 0 || any(got == i) ||
                any(d[got] > kth + 1e-12 * max(1, abs(kth)))
        }, logical(1))
    }, logical(length(found)))
    rowSums(matrix(wrong, nrow = length(found)))
}

## The table is written row by row, so that a run cut short (the device
## tool's ten minutes) keeps the cases it finished.
about <- if (device == "gpu") gpuInfo()$devices$name[1L] else
    sprintf("CPU, %d cores", parallel::detectCores())
emit <- function(lines) {
    writeLines(lines)
    if (nzchar(out)) cat(lines, file = out, sep = "\n", append = TRUE)
}
emit(c(sprintf("### %s, %s, %s (rows checked: %d per case)",
               format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"), about,
               paste(c("Rscript inst/bench/shapes.R", commandArgs(TRUE)),
                     collapse = " "), checkRows), "",
       paste("| data | metric | n x d | k | knngpu s | FAISS s |",
             "knngpu / FAISS | knngpu rows wrong | FAISS rows wrong |",
             "knngpu precision |"),
       "|---|---|---|---:|---:|---:|---:|---:|---:|---|"))

for (kind in kinds) {
    x <- shapeData(kind, n)
    file <- faissFile(x)
    k <- if (kind == "logcounts") 15L else 10L
    set.seed(1)
    checked <- sort(sample(nrow(x), min(checkRows, nrow(x))))
    tx <- t(x)
    for (metric in c("pearson", "cosine", "euclidean")) {
        invisible(knnSearch(x[1:2000, ], k = k, metric = metric,
                            device = device, progress = FALSE))
        start <- Sys.time()
        mine <- knnSearch(x, k = k, metric = metric, device = device,
                          progress = FALSE)
        seconds <- as.numeric(Sys.time()) - as.numeric(start)
        invisible(faissSearch(file, 2000L, ncol(x), k, metric, device))
        theirs <- faissSearch(file, nrow(x), ncol(x), k, metric, device)
        wrong <- wrongRows(tx, list(mine$index, theirs$index), metric,
                           checked)
        emit(sprintf(paste("| %s | %s | %d x %d | %d | %s | %s | %s |",
                           "%d | %d | %s |"), kind, metric, nrow(x),
                     ncol(x), k, signif(seconds, 3),
                     signif(theirs$seconds, 3),
                     signif(seconds / theirs$seconds, 3), wrong[1L],
                     wrong[2L], attr(mine, "precision")))
    }
    unlink(file)
}
emit("")
