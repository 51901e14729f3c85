## Ctrl-C in figures: starts a long graph (n x 100, k = 50; n = 60000 on
## the CPU, 2 million on the GPU) in a child R, sends it SIGINT 2 s into
## the search, and reports the seconds from the
## signal to the child's prompt (its tryCatch(interrupt = ) handler), how
## the child saw it, and its memory afterwards: resident memory (VmRSS,
## after gc()) against before the search, and on the GPU the device's free
## memory against before.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript tools/interrupt-check.R [--device=cpu|gpu] [--after=2] [--n=N]

source(file.path("tools", "args.R"))
device <- argValue("device", "cpu")
after <- as.numeric(argValue("after", "2"))
n <- as.numeric(argValue("n", if (device == "gpu") "2e6" else "60000"))

dir <- tempfile("knngpu-interrupt")
dir.create(dir)
files <- file.path(dir, c("pid", "out", "child.R"))
writeLines(c(
    "suppressPackageStartupMessages(library(knngpu))",
    "rss <- function() {",
    "    line <- grep('^VmRSS', readLines('/proc/self/status'), value = TRUE)",
    "    as.numeric(gsub('[^0-9]', '', line)) / 1024",
    "}",
    "gpuFree <- function() {",
    "    if (!gpuAvailable()) return(NA)",
    "    .Call(knngpu:::C_knn_gpu_info)$devices$memory_free[1] / 2^20",
    "}",
    "set.seed(1)",
    sprintf("x <- matrix(rnorm(%.0f * 100), %.0f)", n, n),
    sprintf("dev <- '%s'", device),
    "invisible(knnGraph(x[1:2000, ], k = 5, device = dev))",
    "invisible(gc()); before <- c(rss(), gpuFree())",
    sprintf("writeLines(as.character(Sys.getpid()), '%s')", files[1]),
    "res <- tryCatch({",
    "    knnGraph(x, k = 50, metric = 'euclidean', device = dev,",
    "             progress = FALSE)",
    "    'finished'",
    "}, interrupt = function(c) 'an interrupt condition',",
    "   error = function(e) paste('an error:', conditionMessage(e)))",
    "stopped <- as.numeric(Sys.time())",
    "invisible(gc())",
    "after <- c(rss(), gpuFree())",
    sprintf("writeLines(c(res, stopped, before, after), '%s')", files[2])),
    files[3])
## Since R 4.4 a child of system2(wait = FALSE) starts with SIGINT ignored
## (as a shell's background job does), which exec keeps: env (coreutils
## 8.31 on) gives it the default disposition back, so the signal arrives.
system2("env", c("--default-signal=INT", file.path(R.home("bin"), "Rscript"),
                 files[3]), wait = FALSE)
waitFor <- function(path, seconds) {
    limit <- Sys.time() + seconds
    while (!file.exists(path) && Sys.time() < limit) Sys.sleep(0.01)
    file.exists(path)
}
if (!waitFor(files[1], 300)) stop("the child did not start its search")
Sys.sleep(after)
sent <- as.numeric(Sys.time())
tools::pskill(as.integer(readLines(files[1])), tools::SIGINT)
if (!waitFor(files[2], 60)) stop("the child did not answer in 60 s")
Sys.sleep(0.2)
out <- readLines(files[2])
num <- suppressWarnings(as.numeric(out[-1]))
cat(sprintf(paste("device %s, %s: %.0f x 100, k = 50, SIGINT %.1f s into",
                  "the search\n"), device,
            format(Sys.time(), "%Y-%m-%d %H:%M"), n, after))
cat(sprintf("the child saw %s, %.3f s after the signal\n", out[1],
            num[1] - sent))
cat(sprintf("resident memory: %.0f MiB before the search, %.0f after\n",
            num[2], num[4]))
if (!is.na(num[3])) {
    cat(sprintf("GPU free memory: %.0f MiB before, %.0f after\n", num[3],
                num[5]))
}
