## The CPU's search by clusters (src/engine/knn_clusters.c) on every shape
## class, against the product scan it may hand over to, BiocNeighbors'
## KMKNN and FAISS CPU's flat search; and the numbers behind its
## thresholds.
##
## Usage, from the repository root, with knngpu installed in R_LIBS (and,
## for FAISS, python3 with faiss-cpu on the PATH, see peers/faiss.R):
##   Rscript inst/bench/clusters.R [--n=1000,5000,20000] [--kinds=a,b]
##                                 [--metric=euclidean] [--k=10]
##                                 [--reps=3] [--kmknn=yes|no]
##                                 [--faiss=yes|no] [--forced=yes|no]
##                                 [--out=FILE]
##   --metric euclidean, cosine or pearson (KMKNN: its "Cosine" distance,
##            on rows centred in R first for pearson, centring timed)
##   --faiss  run FAISS CPU (IndexFlat, its own time from the float64
##            array to the indices, Python's start and the file read
##            excluded), where python3 can import faiss
##   --forced also run the forced scan and clusters (no: auto alone)
##   --n      nodes per case (comma-separated)
##   --kinds  data kinds of inst/bench/shapes-data.R (default: the classes
##            below), at their full feature counts
##   --reps   runs of each method per case, alternated (each round of
##            the methods starts one further), so that other processes on
##            the machine weigh on each alike; the table holds medians
##   --kmknn  run BiocNeighbors::findKNN(x, k, BNPARAM = KmknnParam())
##            (one thread, as BiocNeighbors runs by default)
##
## Columns: auto (what knnSearch() chooses), scan (forced
## knngpu.algorithm = "products"), clusters (forced "clusters"), auto's
## choice: the share of pairs the clusters multiplied (from the precision
## line) or "scan";
## auto / KMKNN; auto / FAISS; auto / N(0,1) (the normal kind's auto time
## at the same n).
## The thresholds of knn_clusters.c come from here: KNN_KM_MIN_NODES (the
## smallest n where clusters beat the scan on structured kinds) and
## KNN_KM_MAX_SHARE (the share above which the scan is faster: compare the
## clusters and scan columns against the share).

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "shapes-data.R"))
source(file.path("inst", "bench", "peers", "faiss.R"))

sizes <- as.integer(strsplit(argValue("n", "1000,5000,20000"), ",")[[1L]])
kinds <- strsplit(argValue("kinds", paste(
    "normal,pca,cellpcs,heavy,levels,logcounts,binary,duplicates,",
    "replicates,clusters", sep = "")), ",")[[1L]]
k <- as.integer(argValue("k", "10"))
metric <- argValue("metric", "euclidean")
stopifnot(metric %in% c("euclidean", "cosine", "pearson"))
faiss <- argValue("faiss", "yes") == "yes" && faissAvailable()
forced <- argValue("forced", "yes") == "yes"
reps <- as.integer(argValue("reps", "3"))
kmknn <- argValue("kmknn", "yes") == "yes"
out <- argValue("out", "")
if (kmknn) suppressPackageStartupMessages(library(BiocNeighbors))

seconds <- function(f) {
    start <- proc.time()[["elapsed"]]
    value <- f()
    list(seconds = proc.time()[["elapsed"]] - start, value = value)
}

withAlgorithm <- function(algorithm, x) {
    old <- options(knngpu.algorithm = algorithm)
    on.exit(options(old))
    knnSearch(x, k = k, metric = metric, device = "cpu",
              progress = FALSE)
}

## KMKNN's search under `metric`: Pearson as the cosine of rows centred
## here (part of its time).
kmknnSearch <- function(x) {
    if (metric == "euclidean") {
        return(findKNN(x, k = k, BNPARAM = KmknnParam()))
    }
    if (metric == "pearson") x <- x - rowMeans(x)
    findKNN(x, k = k, BNPARAM = KmknnParam(distance = "Cosine"))
}

methods <- list(auto = function(x) withAlgorithm("auto", x))
if (forced) {
    methods$scan <- function(x) withAlgorithm("products", x)
    methods$clusters <- function(x) withAlgorithm("clusters", x)
}
if (kmknn) methods$kmknn <- kmknnSearch
if (faiss) {
    ## FAISS's own time, which excludes the file it reads the nodes from.
    methods$faiss <- function(x) {
        file <- faissFile(x)
        on.exit(unlink(file))
        got <- faissSearch(file, nrow(x), ncol(x), k, metric, "cpu")
        structure(list(), seconds = got$seconds)
    }
}

emit <- function(lines) {
    writeLines(lines)
    if (nzchar(out)) cat(lines, file = out, sep = "\n", append = TRUE)
}
emit(c(sprintf(paste("### %s, CPU, %d cores, load %s, %s, %s",
                     "(medians of %d alternated runs)"),
               format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"),
               parallel::detectCores(),
               paste(readLines("/proc/loadavg", warn = FALSE), collapse = ""),
               metric,
               paste(c("Rscript inst/bench/clusters.R", commandArgs(TRUE)),
                     collapse = " "), reps), "",
       paste("| data | n x d | auto s | scan s | clusters s |",
             "auto's choice | KMKNN s | FAISS s | auto / KMKNN |",
             "auto / FAISS | auto / N(0,1) |"),
       "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"))

normalAuto <- list()
for (n in sizes) for (kind in kinds) {
    x <- shapeData(kind, n)
    times <- matrix(NA_real_, reps, length(methods),
                    dimnames = list(NULL, names(methods)))
    share <- NA_character_
    ## Each round starts at the next method: a method run right after
    ## another (KMKNN's BLAS threads spin on for a while) pays for it, so
    ## no method always follows the same one.
    for (r in seq_len(reps)) for (m in names(methods)[
        (seq_along(methods) + r - 2L) %% length(methods) + 1L]) {
        got <- seconds(function() methods[[m]](x))
        own <- attr(got$value, "seconds")
        times[r, m] <- if (is.null(own)) got$seconds else own
        if (m == "auto") {
            share <- if (!grepl("clusters", attr(got$value, "device"))) {
                "scan"
            } else {
                sub(".*\\(([^)]*) of pairs\\).*", "\\1",
                    attr(got$value, "precision"))
            }
        }
    }
    med <- apply(times, 2L, stats::median)
    if (kind == "normal") normalAuto[[as.character(n)]] <- med[["auto"]]
    base <- normalAuto[[as.character(n)]]
    col <- function(m) if (m %in% names(med)) med[[m]] else NA_real_
    emit(sprintf(paste("| %s | %d x %d | %.3g | %.3g | %.3g | %s | %.3g |",
                       "%.3g | %.2f | %.2f | %s |"),
                 kind, nrow(x), ncol(x), med[["auto"]], col("scan"),
                 col("clusters"), share, col("kmknn"), col("faiss"),
                 med[["auto"]] / col("kmknn"), med[["auto"]] / col("faiss"),
                 if (is.null(base)) "" else
                     sprintf("%.2f", med[["auto"]] / base)))
}
emit("")
