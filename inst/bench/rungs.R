## The rungs of the precision policy side by side: each candidate
## arithmetic forced in turn, and "auto", on the data kinds of
## inst/bench/shapes-data.R. This is the measurement behind the ladder
## (TF32, then split TF32, then float64 DGEMM on the GPU; float32, then
## float64 BLAS on the CPU), behind knn_rung_too_wide's switch (a rung
## pays where its cheaper products outweigh the re-rank of the extra
## candidates its wider margin lets through) and behind the GPU's choice
## between refining TF32 candidates and climbing
## (KNN_REFINE_NODES_PER_CANDIDATE in src/cuda/knn_gpu_policy.cuh).
##
## Usage, from the repository root, with knngpu installed in R_LIBS:
##   Rscript inst/bench/rungs.R [--device=cpu|gpu] [--n=N] [--kinds=a,b]
##                              [--out=FILE]
##   --device  knngpu's device (default gpu)
##   --n       nodes per data kind (default 20000)
##   --kinds   data kinds (default all)
##   --out     append the markdown table to FILE
##
## Metrics: pearson, cosine, euclidean; k = 10 (15 for logcounts). Times
## are seconds of one search after a warm-up, the nodes already in the
## engine's layout (columns), so the input's transpose is not counted;
## "search" and "re-rank" are the engine's phases, "candidates" the
## average per node that the re-rank ranked. Every rung must give the same
## neighbours: the script stops if one does not.

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
source(file.path("inst", "bench", "shapes-data.R"))

device <- argValue("device", "gpu")
n <- as.integer(argValue("n", "20000"))
kinds <- strsplit(argValue("kinds",
                           "normal,levels,logcounts,neardup,clusters"),
                  ",")[[1L]]
out <- argValue("out", "")
rungs <- if (device == "gpu") c("tf32", "tf32x3", "fp32", "fp64", "auto") else
    c("fp32", "fp64", "auto")

emit <- function(lines) {
    writeLines(lines)
    if (nzchar(out)) cat(lines, file = out, sep = "\n", append = TRUE)
}
about <- if (device == "gpu") gpuInfo()$devices$name[1L] else
    sprintf("CPU, %d cores", parallel::detectCores())
emit(c(sprintf("### %s, %s, %s", format(Sys.time(), "%Y-%m-%d %H:%M UTC",
                                        tz = "UTC"), about,
               paste(c("Rscript inst/bench/rungs.R", commandArgs(TRUE)),
                     collapse = " ")), "",
       paste("| data | metric | n x d | k | rung | seconds | search |",
             "re-rank | candidates | precision |"),
       "|---|---|---|---:|---|---:|---:|---:|---:|---|"))

for (kind in kinds) {
    nodes <- t(shapeData(kind, n))
    k <- if (kind == "logcounts") 15L else 10L
    for (metric in c("pearson", "cosine", "euclidean")) {
        first <- NULL
        for (rung in rungs) {
            search <- function(x) {
                knnSearch(x, k = k, metric = metric, by = "columns",
                          device = device, precision = rung,
                          progress = FALSE)
            }
            invisible(search(nodes[, 1:2000]))
            started <- proc.time()[["elapsed"]]
            got <- search(nodes)
            seconds <- proc.time()[["elapsed"]] - started
            if (is.null(first)) first <- got$index
            stopifnot(identical(got$index, first))
            tm <- attr(got, "timings")
            emit(sprintf(paste("| %s | %s | %d x %d | %d | %s | %.3f |",
                               "%.3f | %.3f | %.1f | %s |"),
                         kind, metric, ncol(nodes), nrow(nodes), k, rung,
                         seconds, tm$seconds_search, tm$seconds_rerank,
                         tm$candidates, attr(got, "precision")))
        }
    }
}
emit("")
