## GPU benchmark: knngpu (device = "gpu") against what GPU users write by
## hand (inst/bench/peers/torch_knn.py: chunked x @ x.T + topk in PyTorch,
## float32), against FAISS GPU's flat search (inst/bench/peers/
## faiss_knn.py, where python3 imports faiss: ../shared/peers/faiss-gpu)
## and against the bare float32 GEMM of the same product, on the same
## N(0,1) data.
##
## Usage, on a machine with a GPU, from the repository root, with knngpu
## installed in R_LIBS and python3 with torch on the PATH:
##   Rscript inst/bench/gpu.R [--cases=a,b,...] [--out=FILE] [--dir=DIR]
##
##   --cases  names from the table below (default: all)
##   --out    append the markdown table to FILE
##   --dir    where the data files go (default: tempdir())
##   --peers=no  knngpu alone (the peers' columns stay empty)
##
## Each case's data is written once by torch_knn.py (float64, row-major
## N x D, so R reads it as D x N with nodes as columns: no transpose) and
## read by both contenders. Columns of the table:
##   knngpu   end to end: R matrix in, edge data.frame out (knnGraph), or
##            the index/distance matrices for searches and for k = 4096
##            (a 1e9-row data.frame would measure R, not the search)
##   engine   the .Call alone (upload, search, re-rank, results in R)
##   torch    float64 host array in, k indices and distances on the host
##   gemm     torch's chunked float32 products alone, inputs on the device
##   faiss    FAISS GpuIndexFlatL2/IP: float64 host arrays in, k indices on
##            the host (empty for k > 2048, FAISS's limit, or no faiss)
## Times are one run after a warm-up, or the median of 5 runs when one
## takes under a second and of 21 under 0.1 s (seconds, wall clock to the
## microsecond, 3 significant digits); FAISS's the same counts, timed in
## its own process with its GPU resources made before the timing.

suppressPackageStartupMessages(library(knngpu))
source(file.path("inst", "bench", "peers", "faiss.R"))

args <- commandArgs(trailingOnly = TRUE)
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L]) else default
}

cases <- data.frame(
    name = c("g100k_d50_k10", "g100k_d295_k20", "g262k_d128_k100",
             "g262k_d128_k1024", "g262k_d128_k4096", "g1M_d50_k15",
             "g1.53M_d295_k20", "s16k_q4k_d128_k16"),
    n = c(1e5, 1e5, 262144, 262144, 262144, 1e6, 1533876, 16384),
    d = c(50, 295, 128, 128, 128, 50, 295, 128),
    k = c(10, 20, 100, 1024, 4096, 15, 20, 16),
    metric = c("euclidean", "pearson", "euclidean", "euclidean",
               "euclidean", "euclidean", "pearson", "euclidean"),
    nq = c(0, 0, 0, 0, 0, 0, 0, 4096),
    stringsAsFactors = FALSE)

wanted <- argValue("cases", "")
if (nzchar(wanted)) {
    cases <- cases[cases$name %in% strsplit(wanted, ",")[[1L]], ]
}
dir <- argValue("dir", tempdir())
peer <- file.path("inst", "bench", "peers", "torch_knn.py")

elapsed <- function(expr) {
    start <- as.numeric(Sys.time())
    value <- expr
    list(value = value, seconds = as.numeric(Sys.time()) - start)
}

## One knngpu call for a case: knnSearch for searches and k = 4096,
## knnGraph otherwise. data: list(ref, query), made outside the timing.
runCase <- function(data, case) {
    if (case$nq > 0) {
        knnSearch(data$ref, data$query, k = case$k, metric = case$metric,
                  by = "columns", device = "gpu", progress = FALSE)
    } else if (case$k >= 4096) {
        knnSearch(data$ref, k = case$k, metric = case$metric, by = "columns",
                  device = "gpu", progress = FALSE)
    } else {
        knnGraph(data$ref, k = case$k, metric = case$metric, by = "columns",
                 device = "gpu", progress = FALSE)
    }
}

## Seconds of one run, or the median of 5 when one takes under a second
## (of 21 under 0.1 s), as torch_knn.py counts its own. The runs keep
## their results until the case is done, as FAISS's do (faiss_knn.py
## collects them in a list), and R's collector runs before each, outside
## the timing: a run whose result was dropped would make R collect the
## previous result, or its heap, inside the next run's timing.
runKnngpu <- function(data, case) {
    kept <- list()
    timeRun <- function() {
        gc(verbose = FALSE)
        got <- elapsed(runCase(data, case))
        kept[[length(kept) + 1L]] <<- got$value
        list(total = got$seconds, engine = attr(got$value, "elapsed"),
             candidates = attr(got$value, "timings")$candidates,
             device = attr(got$value, "device"))
    }
    runs <- list(timeRun())
    more <- if (runs[[1L]]$total >= 1) 0L else if (runs[[1L]]$total >= 0.1)
        4L else 20L
    runs <- c(runs, replicate(more, timeRun(), FALSE))
    median2 <- function(field) {
        stats::median(vapply(runs, function(r) r[[field]], numeric(1)))
    }
    list(total = median2("total"), engine = median2("engine"),
         candidates = runs[[1L]]$candidates, device = runs[[1L]]$device)
}

## FAISS GPU's seconds for a case (NA where it cannot run it), with as many
## runs as knngpu's timing took (`seconds`: knngpu's).
runFaiss <- function(file, case, seconds) {
    if (case$k > 2048 || !faissAvailable()) return(NA_real_)
    reps <- if (seconds >= 1) 1L else if (seconds >= 0.1) 5L else 21L
    faissSearch(file, case$n, case$d, case$k, case$metric, "gpu",
                nq = case$nq, reps = reps)$seconds
}

runTorch <- function(file, case) {
    out <- system2("python3", c(peer, "knn", file,
                                sprintf("%d", as.integer(c(case$n + case$nq,
                                    case$d, case$k))),
                                case$metric,
                                sprintf("%d", as.integer(case$nq))),
                   stdout = TRUE, stderr = TRUE)
    line <- grep("^torch total", out, value = TRUE)
    if (!length(line)) {
        message(paste(out, collapse = "\n"))
        return(c(total = NA, gemm = NA))
    }
    f <- strsplit(line, " ")[[1L]]
    c(total = as.numeric(f[3L]), gemm = as.numeric(f[5L]))
}

## Loads the CUDA context, cuBLAS and the kernels outside the timings.
warm <- matrix(rnorm(64 * 3000), 64)
invisible(knnSearch(warm, k = 10, by = "columns", device = "gpu",
                    progress = FALSE))

rows <- list()
for (i in seq_len(nrow(cases))) {
    case <- cases[i, ]
    file <- file.path(dir, paste0(case$name, ".f64"))
    system2("python3", c(peer, "make", file,
                         sprintf("%d", as.integer(c(case$n + case$nq, case$d,
                                                    1)))))
    x <- matrix(readBin(file, "double", (case$n + case$nq) * case$d),
                nrow = case$d)
    data <- if (case$nq > 0) {
        list(ref = x[, seq_len(case$n)], query = x[, case$n + seq_len(case$nq)])
    } else {
        list(ref = x, query = NULL)
    }
    rm(x)
    ours <- runKnngpu(data, case)
    rm(data)
    gc(verbose = FALSE)
    peers <- argValue("peers", "yes") != "no"
    theirs <- if (peers) runTorch(file, case) else c(total = NA, gemm = NA)
    faiss <- if (peers) runFaiss(file, case, ours$total) else NA_real_
    unlink(file)
    rows[[i]] <- data.frame(
        case = case$name, metric = case$metric, k = case$k,
        knngpu = signif(ours$total, 3), engine = signif(ours$engine, 3),
        torch = signif(theirs[["total"]], 3),
        gemm = signif(theirs[["gemm"]], 3),
        torch_over_knngpu = round(theirs[["total"]] / ours$total, 2),
        faiss = signif(faiss, 3),
        knngpu_over_faiss = round(ours$total / faiss, 2),
        candidates = round(ours$candidates, 1))
    print(rows[[i]], row.names = FALSE)
    device <- ours$device
}

table <- do.call(rbind, rows)
md <- c(sprintf("Device: %s; %s; R %s; command: `Rscript inst/bench/gpu.R%s`",
                device, format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"),
                getRversion(),
                if (length(args)) paste0(" ", paste(args, collapse = " "))
                else ""),
        "",
        paste0("| ", paste(names(table), collapse = " | "), " |"),
        paste0("|", paste(rep("---", ncol(table)), collapse = "|"), "|"),
        apply(table, 1, function(r) paste0("| ", paste(r, collapse = " | "),
                                           " |")))
cat(md, sep = "\n")
out <- argValue("out", "")
if (nzchar(out)) cat(md, "", sep = "\n", file = out, append = TRUE)
