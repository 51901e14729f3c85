## Helpers of the GPU tests (test-gpu-*.R): the CPU engine is the reference,
## and the GPU must give the same bits.

gpuSearchBoth <- function(x, k, metric, by = "rows", query = NULL, ...) {
    args <- list(x = x, query = query, k = k, metric = metric, by = by,
                 progress = FALSE, ...)
    list(cpu = do.call(knnSearch, c(args, device = "cpu")),
         gpu = do.call(knnSearch, c(args, device = "gpu")))
}

expectGpuIdentical <- function(x, k, metric, by = "rows", query = NULL,
                               label = "", ...) {
    got <- gpuSearchBoth(x, k, metric, by, query, ...)
    label <- sprintf("%s %s %s k=%d", label, metric, by, k)
    expect_identical(got$gpu$index, got$cpu$index, label = label)
    expect_identical(got$gpu$distance, got$cpu$distance, label = label)
    invisible(got)
}

## Free bytes of GPU 0, unrounded (gpuInfo() rounds to 0.1 GB).
gpuFreeBytes <- function() {
    .Call(knngpu:::C_knn_gpu_info)$devices$memory_free[1L]
}
