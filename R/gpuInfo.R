#' What the GPU backend sees
#'
#' @return \code{gpuInfo()} returns a list of class \code{knngpu_gpu_info}:
#'   \code{built_with_cuda}, \code{reason} (why no GPU can be used, empty
#'   when one can), \code{runtime} and \code{driver} (CUDA versions), and
#'   \code{devices}, a data.frame with one row per visible GPU (\code{id},
#'   0-based as \code{devices =} takes it, \code{name}, \code{memory_gb},
#'   \code{free_gb}, \code{compute_capability}, \code{multiprocessors}).
#'   \code{gpuAvailable()} returns \code{TRUE} when \code{device = "gpu"}
#'   can run.
#' @details The first search that succeeds on a GPU keeps, for the next
#'   ones, that GPU's CUDA stream and cuBLAS handle (about 66 MB of device
#'   memory on an H200, which \code{free_gb} then no longer counts) and
#'   pinned host memory for uploads and results (32 MB, and up to 192 MB
#'   more); a small search would otherwise spend a third of its time making
#'   them. A search also keeps the device memory it gave back, up to
#'   1 GiB and at most a sixteenth of the GPU, for the next search to take
#'   again (allocating it anew costs a small search a fifth of its time);
#'   \code{free_gb} counts that memory as free, as searches do. All of it
#'   is released when the package is unloaded. A search that fails or is
#'   interrupted gives the kept device memory back, and leaves the GPU's
#'   memory as it found it.
#' @examples
#' gpuInfo()
#' gpuAvailable()
#' @export
gpuInfo <- function() {
    raw <- .Call(C_knn_gpu_info)
    dev <- raw$devices
    devices <- data.frame(
        id = seq_along(dev$name) - 1L,
        name = dev$name,
        memory_gb = round(dev$memory_total / 2^30, 1),
        free_gb = round(dev$memory_free / 2^30, 1),
        compute_capability = paste(dev$major, dev$minor, sep = "."),
        multiprocessors = dev$multiprocessors)
    reason <- raw$reason
    if (!nzchar(reason) && nrow(devices) == 0L) reason <- "no GPU found"
    structure(list(built_with_cuda = raw$built_with_cuda, reason = reason,
                   runtime = .cudaVersion(raw$runtime_version),
                   driver = .cudaVersion(raw$driver_version),
                   devices = devices),
              class = "knngpu_gpu_info")
}

#' @rdname gpuInfo
#' @export
gpuAvailable <- function() .gpuUsable(gpuInfo())

.gpuUsable <- function(info) {
    isTRUE(info$built_with_cuda) && nrow(info$devices) > 0L &&
        !nzchar(info$reason)
}

## CUDA encodes 13.0 as 13000.
.cudaVersion <- function(code) {
    if (is.na(code) || code <= 0L) return(NA_character_)
    sprintf("%d.%d", code %/% 1000L, (code %% 1000L) %/% 10L)
}

#' @export
print.knngpu_gpu_info <- function(x, ...) {
    cat("knngpu GPU backend\n")
    cat("  built with CUDA: ", if (x$built_with_cuda) "yes" else "no", "\n",
        sep = "")
    if (!is.na(x$runtime)) cat("  CUDA runtime:    ", x$runtime, "\n", sep = "")
    if (!is.na(x$driver)) cat("  CUDA driver:     ", x$driver, "\n", sep = "")
    if (nzchar(x$reason)) cat("  no GPU in use:   ", x$reason, "\n", sep = "")
    if (nrow(x$devices)) print(x$devices, row.names = FALSE)
    invisible(x)
}
