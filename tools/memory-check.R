## Peak memory of knnGraph() against the O(n d + n k) promise: for each n,
## a child R builds an n x 50 N(0,1) matrix and its kNN graph (Euclidean,
## or --metric; k = 15) on the chosen device, and reports its peak
## resident memory (VmHWM) with the bound 2 (n d 8 + n k 16) bytes + 100 MB
## (the input and the edge table, with room for one working copy of each,
## and R itself), and the same peak for 1000 nodes, the fixed cost of R,
## the package and (on the GPU) the CUDA runtime.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript tools/memory-check.R [--device=cpu|gpu] [--n=50000,200000]
##                                [--metric=euclidean]

source(file.path("tools", "args.R"))
device <- argValue("device", "cpu")
metric <- argValue("metric", "euclidean")
sizes <- as.numeric(strsplit(argValue("n", "50000,200000"), ",")[[1]])
d <- 50
k <- 15

peak <- function(n) {
    script <- tempfile(fileext = ".R")
    writeLines(c(
        "suppressPackageStartupMessages(library(knngpu))",
        "set.seed(1)",
        sprintf("x <- matrix(rnorm(%.0f * %d), ncol = %d)", n, d, d),
        "start <- Sys.time()",
        sprintf(paste("g <- knnGraph(x, k = %d, metric = '%s',",
                      "device = '%s', progress = FALSE)"), k, metric,
                device),
        "secs <- as.numeric(Sys.time()) - as.numeric(start)",
        "hwm <- grep('^VmHWM', readLines('/proc/self/status'), value = TRUE)",
        "mib <- as.numeric(gsub('[^0-9]', '', hwm)) / 1024",
        "cat(mib, secs, nrow(g), '\\n')"),
        script)
    out <- system2(file.path(R.home("bin"), "Rscript"), script, stdout = TRUE)
    as.numeric(strsplit(trimws(tail(out, 1)), " +")[[1]])
}

cat(sprintf("# %s, device %s, %d cores, %s\n",
            format(Sys.time(), "%Y-%m-%d %H:%M"), device,
            parallel::detectCores(), metric))
## What a 1000-node graph peaks at: R, the package and, on the GPU, the
## CUDA runtime and cuBLAS with their kernels, which a search of any size
## pays once. "growth" is the peak above it, against the bound's part that
## grows with the data, 2 (n d 8 + n k 16).
fixed <- peak(1000)[1]
rows <- lapply(sizes, function(n) {
    got <- peak(n)
    grows <- 2 * (n * d * 8 + n * k * 16) / 2^20
    bound <- grows + 100
    data.frame(n = n, d = d, k = k, peak_MiB = round(got[1]),
               bound_MiB = round(bound), within = got[1] <= bound,
               fixed_MiB = round(fixed), growth_MiB = round(got[1] - fixed),
               grows_MiB = round(grows),
               seconds = signif(got[2], 3), edges = got[3])
})
print(do.call(rbind, rows), row.names = FALSE)
