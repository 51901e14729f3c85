## Measures the GPU's shared walk (src/cuda/knn_gpu_pairs.cu: a self search
## that computes each pair of nodes once) against the plain fused walk
## (every row walks every node) and the panel path (cuBLAS products, then
## the faster of the warp and radix selection kernels), to set
## knn_pairs_choose()'s constants in src/cuda/knn_gpu_policy.cuh
## (KNN_PAIRS_AUTO_SMALL_K, KNN_PAIRS_AUTO_MIN_NODES).
##
## Usage, on a machine with a GPU, from the repository root:
##   Rscript inst/bench/pairs.R [--out=FILE] [--cases=n200k_d50_k10,...]
##
## Self searches of N(0,1) nodes, each path forced in turn
## (.engineSearch(select = "fused"), "fused_rows", "warp" and "radix"),
## after a warm-up run: the engine's wall time and its search phase in
## seconds, the tiles, whether the shared walk ran, the ratios of its time
## to the plain walk's and the faster panel kernel's, and whether all four
## gave identical bits.

suppressPackageStartupMessages(library(knngpu))
source("tools/args.R")
out <- argValue("out", "")
wanted <- argValue("cases", paste0("n200k_d50_k10,n262k_d128_k32,",
                                   "n1M_d50_k15,n1M_d50_k32"))

timed <- function(x, k, metric, select) {
    knngpu:::.engineSearch(x, NULL, k, metric, gpu = TRUE, select = select)
    gc()
    t0 <- proc.time()[["elapsed"]]
    res <- knngpu:::.engineSearch(x, NULL, k, metric, gpu = TRUE,
                                  select = select)
    list(seconds = proc.time()[["elapsed"]] - t0, res = res)
}

cases <- list(n200k_d50_k10 = c(n = 200000, d = 50, k = 10),
              n262k_d128_k32 = c(n = 262144, d = 128, k = 32),
              n262k_d128_k64 = c(n = 262144, d = 128, k = 64),
              n262k_d128_k100 = c(n = 262144, d = 128, k = 100),
              n262k_d50_k100 = c(n = 262144, d = 50, k = 100),
              n262k_d64_k64 = c(n = 262144, d = 64, k = 64),
              n1M_d128_k100 = c(n = 1000000, d = 128, k = 100),
              n1M_d50_k15 = c(n = 1000000, d = 50, k = 15),
              n1M_d50_k32 = c(n = 1000000, d = 50, k = 32),
              n1M_d50_k100 = c(n = 1000000, d = 50, k = 100),
              n200k_d295_k20 = c(n = 200000, d = 295, k = 20),
              n1M_d295_k20 = c(n = 1000000, d = 295, k = 20),
              n1.53M_d295_k20 = c(n = 1533876, d = 295, k = 20))
unknown <- setdiff(strsplit(wanted, ",")[[1L]], names(cases))
if (length(unknown)) stop("unknown --cases: ", toString(unknown))
rows <- list()
for (cs in cases[strsplit(wanted, ",")[[1L]]]) {
    set.seed(1)
    x <- matrix(rnorm(cs[["n"]] * cs[["d"]]), cs[["d"]])
    for (metric in c("euclidean", "pearson")) {
        pairs <- timed(x, cs[["k"]], metric, "fused")
        plain <- timed(x, cs[["k"]], metric, "fused_rows")
        radix <- timed(x, cs[["k"]], metric, "radix")
        ## The warp kernel holds k <= 32.
        warp <- if (cs[["k"]] <= 32) timed(x, cs[["k"]], metric, "warp")
                else radix
        kernel <- if (warp$seconds < radix$seconds) "warp" else "radix"
        panel <- list(warp = warp, radix = radix)[[kernel]]
        same <- all(vapply(list(plain, warp, radix), function(other)
            identical(pairs$res$index, other$res$index) &&
                identical(pairs$res$distance, other$res$distance),
            logical(1)))
        rows[[length(rows) + 1L]] <- data.frame(
            n = cs[["n"]], d = cs[["d"]], k = cs[["k"]], metric = metric,
            pairs_s = signif(pairs$seconds, 3),
            pairs_search = signif(pairs$res$info$seconds_search, 3),
            pairs_tile = pairs$res$info$row_tile,
            shared = pairs$res$info$pairs_once,
            plain_s = signif(plain$seconds, 3),
            plain_search = signif(plain$res$info$seconds_search, 3),
            plain_tile = plain$res$info$row_tile,
            pairs_over_plain = signif(pairs$seconds / plain$seconds, 3),
            panel_s = signif(panel$seconds, 3),
            panel_kernel = kernel,
            pairs_over_panel = signif(pairs$seconds / panel$seconds, 3),
            identical = same)
    }
}
grid <- do.call(rbind, rows)
lines <- c(sprintf("each pair once on %s, %s",
                   gpuInfo()$devices$name[1L],
                   format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC")),
           capture.output(print(grid, row.names = FALSE)))
writeLines(lines)
if (nzchar(out)) writeLines(lines, out)
