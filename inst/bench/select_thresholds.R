## Measures where the GPU's candidate-selection kernels cross over, to set
## the constants of knn_select_choose() in src/cuda/knn_gpu_policy.cuh
## (KNN_WARP_AUTO_MAX_K, KNN_WARP_MIN_ROWS).
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/select_thresholds.R [--out=FILE]
##
## For ref sizes (columns of a panel), k <= 32 and row tiles R, it times the
## search phase (the tile products plus selection; the products are the
## same for every kernel) of a query search of 16384 queries, with each
## kernel forced in turn (.engineSearch(select = )), R forced through the
## memory budget. Prints the faster of 2 runs per cell (seconds) and, per cell,
## the fastest kernel.

suppressPackageStartupMessages(library(knngpu))
args <- commandArgs(trailingOnly = TRUE)
out <- sub("^--out=", "", grep("^--out=", args, value = TRUE))

p <- 32L
nq <- 16384L
metric <- "euclidean"
algos <- c("warp", "radix")

## A budget that gives row tiles of `rows`: rows + 1/2 times the bytes per
## row that the planner counts (knn_row_bytes in knn_gpu_tiles.cu: the
## panel row, 36 per candidate slot, 20 per neighbour, 16.5 of offsets and
## counts; cols here are multiples of 4, so the panel row is not padded).
budgetFor <- function(cols, k, rows) {
    slots <- min(2 * k + 256, cols)
    (rows + 0.5) * (4 * cols + 36 * slots + 20 * k + 16.5)
}

searchSeconds <- function(ref, query, k, rows, algo) {
    times <- vapply(1:2, function(i) {
        res <- knngpu:::.engineSearch(ref, query, k, metric, gpu = TRUE,
                                      memory = budgetFor(ncol(ref), k, rows),
                                      select = algo)
        ## The plan caps R (panel size): such a cell cannot occur.
        if (res$info$row_tile != rows) return(NA_real_)
        res$info$seconds_search
    }, numeric(1))
    min(times)
}

set.seed(1)
query <- matrix(rnorm(p * nq), p)
grid <- list()
for (cols in c(16384L, 50000L, 400000L)) {
    ref <- matrix(rnorm(p * cols), p)
    for (k in c(1L, 8L, 16L, 32L)) for (rows in c(512L, 4096L, 16384L)) {
        secs <- vapply(algos, function(a) searchSeconds(ref, query, k, rows,
                                                        a), numeric(1))
        grid[[length(grid) + 1L]] <- data.frame(cols = cols, k = k,
                                                rows = rows, t(secs))
    }
}
grid <- do.call(rbind, grid)
grid <- grid[stats::complete.cases(grid), ]
grid$fastest <- algos[apply(as.matrix(grid[, algos]), 1, which.min)]
print(grid, row.names = FALSE)
lines <- c(sprintf("select thresholds on %s, %s", gpuInfo()$devices$name[1L],
                   format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")),
           capture.output(print(grid, row.names = FALSE)))
if (length(out)) writeLines(lines, out)
