## Single-cell clustering through bluster with each BiocNeighbors backend:
## clusterRows(x, NNGraphParam(k = 15, BNPARAM = , cluster.fun =
## "louvain")) on PCA-like data (50 PCs, 20 clusters), timing the neighbour
## step (findKNN) and the whole call, in one process, same data; checks that
## each backend's neighbours are knngpu's (the same index sets).
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript inst/bench/bluster.R [--n=100000] [--exhaustive-n=20000]
##                                [--only=knngpu,kmknn,vptree,exhaustive]
## Each backend's row is printed as soon as it is measured.
##
## Backends: KmknnParam and VptreeParam (BiocNeighbors' exact methods),
## KnngpuParam on the CPU and, where a GPU is usable, on the GPU; and
## ExhaustiveParam on the first --exhaustive-n rows (its time grows with
## n^2), with KnngpuParam(CPU) on the same rows beside it.

suppressPackageStartupMessages({
    library(knngpu)
    library(BiocNeighbors)
    library(bluster)
})

args <- commandArgs(trailingOnly = TRUE)
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    as.integer(if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L])
               else default)
}
n <- argValue("n", 100000L)
exhaustiveN <- argValue("exhaustive-n", 20000L)
hit <- grep("^--only=", args, value = TRUE)
only <- if (length(hit)) strsplit(sub("^--only=", "", hit), ",")[[1]] else
    c("knngpu", "kmknn", "vptree", "exhaustive")
k <- 15L

set.seed(20261123)
centers <- matrix(rnorm(20 * 50, sd = 4), 20)
pcs <- centers[sample(20, n, TRUE), ] + matrix(rnorm(n * 50), n)

seconds <- function(expr) {
    start <- Sys.time()
    value <- force(expr)
    list(value = value,
         seconds = as.numeric(Sys.time()) - as.numeric(start))
}

## The same neighbours: each row's index set (exact ties may be ordered
## differently by another backend).
sameSets <- function(a, b) {
    all(vapply(seq_len(nrow(a)), function(i) {
        setequal(a[i, ], b[i, ])
    }, logical(1)))
}

run <- function(label, x, param, reference = NULL) {
    nn <- seconds(findKNN(x, k = k, BNPARAM = param))
    set.seed(1)
    whole <- seconds(clusterRows(x, NNGraphParam(k = k, BNPARAM = param,
                                                 cluster.fun = "louvain")))
    data.frame(backend = label, n = nrow(x),
               neighbours_s = signif(nn$seconds, 3),
               clusterRows_s = signif(whole$seconds, 3),
               clusters = length(unique(whole$value)),
               same_as_knngpu = if (is.null(reference)) NA
                                else sameSets(nn$value$index, reference))
}

cat(sprintf("# %s, %d cores, %s; %s\n", format(Sys.time(), "%Y-%m-%d %H:%M"),
            parallel::detectCores(),
            if (gpuAvailable()) gpuInfo()$devices$name[1] else "no GPU",
            R.version.string))
report <- function(row) {
    print(row, row.names = FALSE)
    flush(stdout())
}
mine <- findKNN(pcs, k = k, BNPARAM = KnngpuParam(device = "cpu"))$index
if ("knngpu" %in% only) {
    report(run("KnngpuParam(cpu)", pcs, KnngpuParam(device = "cpu")))
    if (gpuAvailable()) {
        ## The first GPU call opens the backend and makes its context.
        invisible(findKNN(pcs[1:1000, ], k = k,
                          BNPARAM = KnngpuParam(device = "gpu")))
        report(run("KnngpuParam(gpu)", pcs, KnngpuParam(device = "gpu"),
                   mine))
    }
}
if ("kmknn" %in% only) report(run("KmknnParam", pcs, KmknnParam(), mine))
if ("vptree" %in% only) report(run("VptreeParam", pcs, VptreeParam(), mine))
if ("exhaustive" %in% only) {
    small <- pcs[seq_len(min(n, exhaustiveN)), ]
    smallMine <- findKNN(small, k = k,
                         BNPARAM = KnngpuParam(device = "cpu"))$index
    report(run("KnngpuParam(cpu)", small, KnngpuParam(device = "cpu")))
    report(run("ExhaustiveParam", small, ExhaustiveParam(), smallMine))
}
