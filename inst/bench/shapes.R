## No cliffs: knngpu against the peers users pick, on the data shapes
## where exact methods fall off cliffs, in the same run: FAISS flat search
## (float32; IndexFlat or GpuIndexFlat), on the GPU also cuVS brute force
## and cuVS's approximate NN-descent graph (its recall against knngpu's
## exact answer), with the rows each exact-in-intent peer gets wrong
## against a float64 reference.
##
## Usage, from the repository root, with knngpu installed in R_LIBS,
## python3 with faiss on the PATH (pip install faiss-cpu; faiss-gpu on the
## GPU machine, ../shared/peers/faiss-gpu) and, on the GPU, cuVS
## (../shared/peers/cuvs; see inst/bench/peers/cuvs.R):
##   Rscript inst/bench/shapes.R [--device=cpu|gpu] [--n=N] [--check=R]
##                               [--kinds=a,b] [--metrics=a,b] [--out=FILE]
##   --device  knngpu's device, and the peers'
##   --n       nodes per data kind (default 20000)
##   --check   rows checked against the float64 reference (default 500)
##   --kinds   data kinds (default all of inst/bench/shapes-data.R)
##   --metrics metrics (default pearson, cosine, euclidean)
##   --out     append the markdown table to FILE
##
## Data kinds: inst/bench/shapes-data.R, at their full feature counts.
## k = 10 (15 for logcounts). Times are seconds, end to end from the
## float64 matrix on the host to the neighbour indices on the host, one
## run after a warm-up; the peers' exclude the Python start and the file
## read (cuVS's: the median of its runs). A row is wrong when a returned
## neighbour's float64 distance exceeds the row's exact k-th distance (by
## more than 1e-12 relative), so exact ties in either order count as
## right. A peer that cannot be imported is left out, with "-".

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "peers", "faiss.R"))
source(file.path("inst", "bench", "peers", "cuvs.R"))
source(file.path("inst", "bench", "shapes-data.R"))

device <- argValue("device", "cpu")
n <- as.integer(argValue("n", "20000"))
checkRows <- as.integer(argValue("check", "500"))
kinds <- strsplit(argValue("kinds", paste(names(shapeFeatures),
                                          collapse = ",")), ",")[[1L]]
metrics <- strsplit(argValue("metrics", "pearson,cosine,euclidean"),
                    ",")[[1L]]
withFaiss <- faissAvailable()
withCuvs <- device == "gpu" && cuvsAvailable()
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
             "knngpu / FAISS | cuVS s | knngpu / cuVS | NN-descent s |",
             "NN-descent recall | knngpu rows wrong | FAISS rows wrong |",
             "cuVS rows wrong | knngpu precision |"),
       paste0("|---|---|---|", strrep("---:|", 11), "---|")))

## A number for the table, "-" for a peer left out.
cell <- function(v) {
    if (length(v) == 0L || is.na(v)) "-" else format(signif(v, 3))
}

for (kind in kinds) {
    x <- shapeData(kind, n)
    file <- faissFile(x)
    k <- if (kind == "logcounts") 15L else 10L
    set.seed(1)
    checked <- sort(sample(nrow(x), min(checkRows, nrow(x))))
    tx <- t(x)
    for (metric in metrics) {
        warm <- min(2000L, n)
        invisible(knnSearch(x[seq_len(warm), ], k = k, metric = metric,
                            device = device, progress = FALSE))
        start <- Sys.time()
        mine <- knnSearch(x, k = k, metric = metric, device = device,
                          progress = FALSE)
        seconds <- as.numeric(Sys.time()) - as.numeric(start)
        found <- list(mine$index)
        faiss <- cuvs <- nnd <- NULL
        if (withFaiss) {
            invisible(faissSearch(file, warm, ncol(x), k, metric, device))
            faiss <- faissSearch(file, nrow(x), ncol(x), k, metric, device)
            found <- c(found, list(faiss$index))
        }
        if (withCuvs) {
            cuvs <- cuvsSearch(file, nrow(x), ncol(x), k, metric)
            nnd <- cuvsSearch(file, nrow(x), ncol(x), k, metric, "nnd",
                              exact = mine$index)
            found <- c(found, list(cuvs$index))
        }
        wrong <- wrongRows(tx, found, metric, checked)
        emit(sprintf(paste("| %s | %s | %d x %d | %d | %s | %s | %s | %s |",
                           "%s | %s | %s | %d | %s | %s | %s |"), kind,
                     metric, nrow(x), ncol(x), k, cell(seconds),
                     cell(faiss$seconds), cell(seconds / faiss$seconds),
                     cell(cuvs$seconds), cell(seconds / cuvs$seconds),
                     cell(nnd$seconds), cell(nnd$recall), wrong[1L],
                     if (withFaiss) wrong[2L] else "-",
                     if (withCuvs) wrong[length(wrong)] else "-",
                     attr(mine, "precision")))
    }
    unlink(file)
}
emit("")
