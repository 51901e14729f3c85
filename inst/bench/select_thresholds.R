## Measures where the GPU's two candidate-selection kernels cross over, to
## set the constants of knn_select_choose() in src/cuda/knn_gpu_select.cu
## (KNN_WARP_MAX_K, KNN_WARP_MIN_ROWS).
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/select_thresholds.R [--out=FILE]
##
## For ref sizes (columns of a panel), k <= 32 and row tiles R, it times the
## search phase (the tile products plus selection; the products are the
## same for both kernels) of a query search of 16384 queries, once with
## KNNGPU_SELECT=warp and once with radix, R forced through the memory
## budget. Prints the faster of 2 runs per cell and, per (cols, k), the
## smallest R at which the warp kernel is faster.

suppressPackageStartupMessages(library(knngpu))
args <- commandArgs(trailingOnly = TRUE)
out <- sub("^--out=", "", grep("^--out=", args, value = TRUE))

p <- 32L
nq <- 16384L
metric <- 2L # euclidean, R/validate.R's order
searchSeconds <- function(ref, query, k, rows, algo) {
    Sys.setenv(KNNGPU_SELECT = algo)
    slots <- min(2 * k + 256, ncol(ref))
    perRow <- 4 * ncol(ref) + 36 * slots + 20 * k + 16
    times <- vapply(1:2, function(i) {
        res <- .Call(knngpu:::C_knn_search, ref, query, as.integer(k),
                     metric, 1L, 0L, rows * perRow + 1, integer(), FALSE)
        ## The plan caps R (panel size): such a cell cannot occur.
        if (res$info$row_tile != rows) return(NA_real_)
        res$info$seconds_search
    }, numeric(1))
    min(times)
}

set.seed(1)
query <- matrix(rnorm(p * nq), p)
grid <- list()
for (cols in c(50000L, 400000L)) {
    ref <- matrix(rnorm(p * cols), p)
    for (k in c(1L, 8L, 32L)) for (rows in c(512L, 4096L, 16384L)) {
        warp <- searchSeconds(ref, query, k, rows, "warp")
        radix <- searchSeconds(ref, query, k, rows, "radix")
        grid[[length(grid) + 1L]] <- data.frame(cols = cols, k = k,
                                                rows = rows, warp = warp,
                                                radix = radix)
    }
}
Sys.unsetenv("KNNGPU_SELECT")
grid <- do.call(rbind, grid)
grid <- grid[!is.na(grid$warp), ]
grid$warp_wins <- grid$warp < grid$radix
print(grid, row.names = FALSE)

wins <- grid[grid$warp_wins, ]
cross <- if (nrow(wins)) {
    aggregate(rows ~ cols + k, data = wins, FUN = min)
} else {
    data.frame(cols = integer(), k = integer(), rows = integer())
}
names(cross)[3L] <- "min_rows_warp_wins"
print(cross, row.names = FALSE)
lines <- c(sprintf("select thresholds on %s, %s", gpuInfo()$devices$name[1L],
                   format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")),
           capture.output(print(grid, row.names = FALSE)),
           capture.output(print(cross, row.names = FALSE)))
if (length(out)) writeLines(lines, out)
