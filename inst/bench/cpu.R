## CPU benchmark: knngpu (device = "cpu") against the R k-NN peers and
## FAISS CPU (python3 with faiss-cpu; skipped, saying so, without it), on
## the same data, with agreement checked against knngpu.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript inst/bench/cpu.R [--write] [--reps=N] [--all] [--out=FILE]
##
##   --write   replace the "## CPU" section of inst/bench/RESULTS.md (or
##             --out=FILE) with this run's results, machine and command
##   --reps=N  runs per contender (median reported; default 5); a contender
##             whose first run takes over 5 s runs once
##   --all     also run the kd-tree peers (FNN, RANN, dbscan) on the random
##             50000 x 50 matrix; in 50 dimensions a kd-tree visits nearly
##             every point, so each takes several minutes there
##   --profile only break down knngpu's time on ALL Pearson (R-side
##             conversion, engine prepare and search for 1 and 2 threads,
##             the BLAS product alone) and stop; run it also under
##             OMP_WAIT_POLICY=passive or OPENBLAS_NUM_THREADS=1 to compare
##
## Data: ALL (12625 genes x 128 samples, genes as nodes) and a random
## 50000 x 50 matrix (set.seed(20261121)); k = 10 throughout. Pearson peers
## search Euclidean neighbours of rows centred and scaled to unit length
## (squared distance = 2 (1 - r), the same ranking); cosine peers use rows
## scaled to unit length (squared distance = 2 (1 - cos)).

suppressPackageStartupMessages({
    library(knngpu)
    library(BiocNeighbors)
})
source(file.path("inst", "bench", "peers", "faiss.R"))

args <- commandArgs(trailingOnly = TRUE)
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L]) else default
}
write <- "--write" %in% args
runAll <- "--all" %in% args
profile <- "--profile" %in% args
reps <- as.integer(argValue("reps", "5"))
outFile <- argValue("out", file.path("inst", "bench", "RESULTS.md"))
slowSeconds <- 5
k <- 10L

## Machine and software

cpuModel <- function() {
    lines <- readLines("/proc/cpuinfo", warn = FALSE)
    model <- grep("^model name", lines, value = TRUE)
    if (!length(model)) return("unknown")
    sub("^model name\\s*:\\s*", "", model[1L])
}

memoryGiB <- function() {
    lines <- readLines("/proc/meminfo", warn = FALSE)
    kb <- as.numeric(gsub("[^0-9]", "",
                          grep("^MemTotal", lines, value = TRUE)))
    sprintf("%.0f GiB", kb / 1024^2)
}

blas <- sessionInfo()$BLAS
if (is.null(blas) || !nzchar(blas)) blas <- extSoftVersion()[["BLAS"]]
command <- paste(c("Rscript inst/bench/cpu.R", args), collapse = " ")
machine <- list(
    cpu = sprintf("%s, %d cores (parallel::detectCores()), %s RAM",
                  cpuModel(), parallel::detectCores(), memoryGiB()),
    date = format(Sys.time(), "%Y-%m-%d %H:%M UTC", tz = "UTC"),
    r = R.version.string,
    blas = blas,
    threads = sprintf(paste("knngpu threads default (all cores);",
                            "OPENBLAS_NUM_THREADS=%s, OMP_NUM_THREADS=%s"),
                      Sys.getenv("OPENBLAS_NUM_THREADS", "unset"),
                      Sys.getenv("OMP_NUM_THREADS", "unset")),
    packages = paste(vapply(c("knngpu", "BiocNeighbors", "FNN", "RANN",
                              "dbscan", "WGCNA"), function(p) {
        v <- tryCatch(as.character(packageVersion(p)),
                      error = function(e) "absent")
        paste(p, v)
    }, character(1)), collapse = ", "),
    command = command)

cat("knngpu CPU benchmark\n")
for (field in names(machine)) cat(sprintf("  %-8s %s\n", field,
                                          machine[[field]]))
cat("\n")

## Timing and agreement

## Median elapsed seconds of up to `reps` runs of fun(); one run when the
## first is slow. Returns the last result with the times attached.
timeIt <- function(fun, reps) {
    times <- numeric()
    repeat {
        invisible(gc(verbose = FALSE))
        t0 <- as.numeric(Sys.time())
        res <- fun()
        times <- c(times, as.numeric(Sys.time()) - t0)
        if (length(times) >= reps || times[1L] > slowSeconds) break
    }
    list(result = res, seconds = stats::median(times), runs = length(times))
}

## Drops each node itself from a k + 1 neighbour list (searches that return
## the query point), keeping k columns.
dropSelf <- function(index, distance, k) {
    n <- nrow(index)
    keep <- index != seq_len(n)
    out <- t(vapply(seq_len(n), function(i) {
        which(keep[i, ])[seq_len(k)]
    }, integer(k)))
    list(index = matrix(index[cbind(rep(seq_len(n), k), as.vector(out))],
                        n, k),
         distance = matrix(distance[cbind(rep(seq_len(n), k),
                                          as.vector(out))], n, k))
}

## Fraction of rows whose k indices equal knngpu's in order, and fraction
## whose k sorted distances equal knngpu's (so rows that differ only in how
## exact ties were broken still count as agreeing).
agreement <- function(ref, index, distance) {
    same <- rowSums(index == ref$index) == ncol(ref$index)
    d <- t(apply(distance, 1L, sort))
    if (ncol(ref$index) == 1L) d <- t(d)
    close <- abs(d - ref$distance) <= 1e-7 * pmax(1, abs(ref$distance))
    list(identical = mean(same),
         ties = mean(rowSums(close) == ncol(ref$index)))
}

## knnGraph() edges back to an n x k index matrix.
graphIndex <- function(edges, labels) {
    to <- match(edges$to, labels)
    list(index = matrix(to, ncol = attr(edges, "k"), byrow = TRUE),
         distance = matrix(edges$distance, ncol = attr(edges, "k"),
                           byrow = TRUE))
}

## Rows centred and scaled to unit length (Pearson) or only scaled (cosine).
unitRows <- function(x, centre) {
    if (centre) x <- x - rowMeans(x)
    x / sqrt(rowSums(x * x))
}

## Top k of each row of a dense similarity matrix (self excluded), ties to
## the smaller index as knngpu breaks them.
denseTopK <- function(s, k) {
    diag(s) <- -Inf
    n <- nrow(s)
    index <- matrix(0L, n, k)
    for (i in seq_len(n)) index[i, ] <- order(-s[, i])[seq_len(k)]
    list(index = index,
         distance = 1 - matrix(s[cbind(rep(seq_len(n), k),
                                       as.vector(index))], n, k))
}

results <- list()

## Records one contender. dist converts the peer's distances to knngpu's
## scale (identity for Euclidean, d^2 / 2 for unit-row Euclidean).
record <- function(data, metric, method, timed, ref, dist = identity) {
    res <- timed$result
    a <- if (is.null(ref)) list(identical = NA_real_, ties = NA_real_) else
        agreement(ref, res$index, dist(res$distance))
    row <- data.frame(data = data, metric = metric, method = method,
                      seconds = timed$seconds, runs = timed$runs,
                      identical = a$identical, ties = a$ties, note = "",
                      stringsAsFactors = FALSE)
    results[[length(results) + 1L]] <<- row
    cat(sprintf("%-12s %-9s %-44s %8.3f s (%d runs)  rows identical %.4f,",
                data, metric, method, timed$seconds, timed$runs,
                a$identical),
        sprintf("equal distances %.4f\n", a$ties))
}

skipped <- function(data, metric, method, note) {
    results[[length(results) + 1L]] <<- data.frame(
        data = data, metric = metric, method = method, seconds = NA_real_,
        runs = 0L, identical = NA_real_, ties = NA_real_, note = note,
        stringsAsFactors = FALSE)
    cat(sprintf("%-12s %-9s %-44s skipped: %s\n", data, metric, method,
                note))
}

halfSquare <- function(d) d^2 / 2

## Contenders

knngpuRuns <- function(data, x, metrics) {
    refs <- list()
    for (metric in metrics) {
        s <- timeIt(function() knnSearch(x, k = k, metric = metric,
                                         device = "cpu"), reps)
        refs[[metric]] <- s$result
        record(data, metric, "knngpu::knnSearch", s, NULL)
        if (metric == "pearson") {
            s1 <- timeIt(function() knnSearch(x, k = k, metric = metric,
                                              device = "cpu", threads = 1),
                         reps)
            record(data, metric, "knngpu::knnSearch threads = 1", s1,
                   refs[[metric]])
        }
        labels <- if (is.null(rownames(x))) seq_len(nrow(x)) else rownames(x)
        g <- timeIt(function() knnGraph(x, k = k, metric = metric,
                                        device = "cpu"), reps)
        g$result <- graphIndex(g$result, labels)
        record(data, metric, "knngpu::knnGraph", g, refs[[metric]])
    }
    refs
}

biocRuns <- function(data, x, refs) {
    s <- timeIt(function() findKNN(x, k, BNPARAM = KmknnParam()), reps)
    record(data, "euclidean", "BiocNeighbors KMKNN", s, refs$euclidean)
    if (requireNamespace("BiocParallel", quietly = TRUE)) {
        bp <- BiocParallel::MulticoreParam(2L)
        s <- timeIt(function() findKNN(x, k, BNPARAM = KmknnParam(),
                                       BPPARAM = bp), reps)
        record(data, "euclidean", "BiocNeighbors KMKNN, 2 workers", s,
               refs$euclidean)
    }
    s <- timeIt(function() findKNN(x, k, BNPARAM = ExhaustiveParam()), reps)
    record(data, "euclidean", "BiocNeighbors Exhaustive", s, refs$euclidean)
    s <- timeIt(function() findKNN(unitRows(x, TRUE), k,
                                   BNPARAM = KmknnParam()), reps)
    record(data, "pearson", "BiocNeighbors KMKNN, standardised rows", s,
           refs$pearson, halfSquare)
    if (!is.null(refs$cosine)) {
        s <- timeIt(function() findKNN(unitRows(x, FALSE), k,
                                       BNPARAM = KmknnParam()), reps)
        record(data, "cosine", "BiocNeighbors KMKNN, unit rows", s,
               refs$cosine, halfSquare)
    }
}

treeRuns <- function(data, x, refs) {
    s <- timeIt(function() {
        r <- FNN::get.knn(x, k, algorithm = "kd_tree")
        list(index = r$nn.index, distance = r$nn.dist)
    }, reps)
    record(data, "euclidean", "FNN::get.knn kd_tree", s, refs$euclidean)
    s <- timeIt(function() {
        r <- RANN::nn2(x, k = k + 1L)
        dropSelf(r$nn.idx, r$nn.dists, k)
    }, reps)
    record(data, "euclidean", "RANN::nn2 (k + 1, self dropped)", s,
           refs$euclidean)
    s <- timeIt(function() {
        r <- dbscan::kNN(x, k)
        list(index = r$id, distance = r$dist)
    }, reps)
    record(data, "euclidean", "dbscan::kNN", s, refs$euclidean)
}

denseRuns <- function(data, x, refs) {
    s <- timeIt(function() denseTopK(stats::cor(t(x)), k), 1L)
    record(data, "pearson", "stats::cor(t(x)) + order per row", s,
           refs$pearson)
    if (requireNamespace("WGCNA", quietly = TRUE)) {
        c1 <- timeIt(function() WGCNA::cor(t(x), nThreads = 2L), 1L)
        record(data, "pearson", "WGCNA::cor(t(x)) only (no top-k)", c1,
               NULL)
    }
}

## FAISS CPU flat search (pip install faiss-cpu; float32 IndexFlatL2, or
## IndexFlatIP on unit rows), timed by FAISS itself (its own seconds from
## the float64 array to the indices, median of `reps` runs); distances of
## its neighbours are computed here in float64 for the agreement columns.
faissRuns <- function(data, x, refs) {
    if (!faissAvailable()) {
        for (metric in names(refs)) {
            skipped(data, metric, "FAISS CPU IndexFlat",
                    "python3 cannot import faiss")
        }
        return(invisible())
    }
    file <- faissFile(x)
    on.exit(unlink(file))
    for (metric in names(refs)) {
        runs <- lapply(seq_len(reps), function(i) {
            faissSearch(file, nrow(x), ncol(x), k, metric, "cpu")
        })
        index <- runs[[1L]]$index
        timed <- list(result = list(index = index,
                                    distance = pairDistances(x, index,
                                                             metric)),
                      seconds = stats::median(vapply(runs, `[[`, 1,
                                                     "seconds")),
                      runs = reps)
        record(data, metric, "FAISS CPU IndexFlat (float32)", timed,
               refs[[metric]])
    }
}

## float64 distances, as knngpu reports them, of each row to the nodes of
## its row of `index`.
pairDistances <- function(x, index, metric) {
    rows <- rep(seq_len(nrow(x)), ncol(index))
    if (metric == "euclidean") {
        d <- sqrt(rowSums((x[rows, ] - x[as.vector(index), ])^2))
    } else {
        z <- unitRows(x, metric == "pearson")
        d <- 1 - rowSums(z[rows, ] * z[as.vector(index), ])
    }
    matrix(d, nrow(x))
}

## Data 1: ALL

suppressPackageStartupMessages({
    library(ALL)
    library(Biobase)
})
data(ALL)
xAll <- exprs(ALL)
cat(sprintf("ALL: %d genes x %d samples, k = %d\n", nrow(xAll), ncol(xAll),
            k))

## Median seconds of `reps` runs of fun(), as text.
medianText <- function(fun) {
    times <- vapply(seq_len(reps), function(i) {
        invisible(gc(verbose = FALSE))
        system.time(fun())[["elapsed"]]
    }, numeric(1))
    sprintf("%.3f s", stats::median(times))
}

if (profile) {
    cat("R side: t(x) + as double + finiteness check:", medianText(function()
        colSums(!is.finite(`storage.mode<-`(t(xAll), "double")))), "\n")
    for (threads in c(1L, 2L)) {
        timings <- vapply(seq_len(reps), function(i) {
            g <- knnGraph(xAll, k = k, metric = "pearson", device = "cpu",
                          threads = threads)
            info <- attr(g, "timings")
            c(info$seconds_prepare, info$seconds_search, info$elapsed)
        }, numeric(3))
        cat(sprintf(paste("threads = %d: engine prepare %.3f s, search",
                          "%.3f s, engine call %.3f s\n"), threads,
                    stats::median(timings[1L, ]),
                    stats::median(timings[2L, ]),
                    stats::median(timings[3L, ])))
        cat(sprintf("threads = %d: knnSearch %s, knnGraph %s\n", threads,
                    medianText(function() knnSearch(
                        xAll, k = k, metric = "pearson", device = "cpu",
                        threads = threads)),
                    medianText(function() knnGraph(
                        xAll, k = k, metric = "pearson", device = "cpu",
                        threads = threads))))
    }
    z <- t(unitRows(xAll, TRUE))
    tile <- z[, seq_len(512L)]
    tiles <- ceiling(ncol(z) / 512)
    cat(sprintf("BLAS: one 512-node tile product %s (x %d tiles)\n",
                medianText(function() crossprod(z, tile)), tiles))
    cat("BLAS: whole product t(z) %*% z", medianText(function() t(z) %*% z),
        "\n")
    cat("BLAS: crossprod(z) (dsyrk)", medianText(function() crossprod(z)),
        "\n")
    quit(save = "no")
}
refsAll <- knngpuRuns("ALL", xAll, c("pearson", "euclidean", "cosine"))
faissRuns("ALL", xAll, refsAll)
biocRuns("ALL", xAll, refsAll)
treeRuns("ALL", xAll, refsAll)
denseRuns("ALL", xAll, refsAll)

## Data 2: random 50000 x 50

set.seed(20261121)
xRand <- matrix(rnorm(50000 * 50), nrow = 50000)
cat(sprintf("\nrandom: %d x %d, k = %d\n", nrow(xRand), ncol(xRand), k))
refsRand <- knngpuRuns("random", xRand, c("pearson", "euclidean"))
faissRuns("random", xRand, refsRand)
biocRuns("random", xRand, refsRand)
if (runAll) {
    treeRuns("random", xRand, refsRand)
} else {
    for (m in c("FNN::get.knn kd_tree", "RANN::nn2 (k + 1, self dropped)",
                "dbscan::kNN")) {
        skipped("random", "euclidean", m, "skipped; --all runs it")
    }
}

## Table

tab <- do.call(rbind, results)
refSeconds <- function(data, metric) {
    tab$seconds[tab$data == data & tab$metric == metric &
                tab$method == "knngpu::knnSearch"]
}
tab$ratio <- vapply(seq_len(nrow(tab)), function(i) {
    base <- refSeconds(tab$data[i], tab$metric[i])
    if (length(base) == 1L) tab$seconds[i] / base else NA_real_
}, numeric(1))

kmknn <- function(data) {
    tab$seconds[tab$data == data & tab$method == "BiocNeighbors KMKNN"]
}
targets <- do.call(rbind, lapply(unique(tab$data), function(data) {
    do.call(rbind, lapply(c("pearson", "euclidean"), function(metric) {
        data.frame(data = data, metric = metric,
                   knngpu = refSeconds(data, metric), kmknn = kmknn(data),
                   ratio = refSeconds(data, metric) / kmknn(data))
    }))
}))

fmt <- function(v, digits) ifelse(is.na(v), "-", formatC(v, digits = digits,
                                                          format = "f"))
markdownTable <- function() {
    head <- c(paste("| data | metric | method | median s | runs |",
                    "x knngpu | rows identical | equal distances |"),
              "|---|---|---|---:|---:|---:|---:|---:|")
    rows <- sprintf("| %s | %s | %s | %s | %d | %s | %s | %s |",
                    tab$data, tab$metric,
                    ifelse(nzchar(tab$note) & is.na(tab$seconds),
                           paste0(tab$method, " (", tab$note, ")"),
                           tab$method),
                    fmt(tab$seconds, 3), tab$runs, fmt(tab$ratio, 2),
                    fmt(tab$identical, 4), fmt(tab$ties, 4))
    c(head, rows)
}

pearsonAll <- targets[targets$data == "ALL" & targets$metric == "pearson", ]
verdict <- c(
    sprintf(paste("- ALL Pearson k = 10 in at most 1.0 s: %.3f s, %s."),
            pearsonAll$knngpu,
            if (pearsonAll$knngpu <= 1.0) "met" else "NOT met"),
    sprintf(paste("- ALL Pearson at most 0.3x BiocNeighbors KMKNN Euclidean",
                  "(%.3f s): %.3fx, %s."), pearsonAll$kmknn,
            pearsonAll$ratio, if (pearsonAll$ratio <= 0.3) "met" else
                "NOT met"))
ratios <- sprintf("- %s %s: knngpu %.3f s / KMKNN Euclidean %.3f s = %.3fx",
                  targets$data, targets$metric, targets$knngpu,
                  targets$kmknn, targets$ratio)

section <- c(
    "## CPU", "",
    sprintf("- Machine: %s", machine$cpu),
    sprintf("- Date: %s", machine$date),
    sprintf("- R: %s; BLAS: `%s`", machine$r, machine$blas),
    sprintf("- Threads: %s", machine$threads),
    sprintf("- Packages: %s", machine$packages),
    sprintf("- Command: `R_LIBS=<lib> %s`", machine$command),
    "",
    paste("k = 10, self excluded. Median of up to", reps, "runs (one run",
          "when the first took over 5 s). \"x knngpu\" is the time over",
          "knngpu::knnSearch for the same data and metric. \"rows",
          "identical\": rows whose 10 neighbour indices equal knngpu's in",
          "order; \"equal distances\": rows whose sorted distances equal",
          "knngpu's (relative 1e-7), which also counts rows that differ",
          "only in how exact ties were broken. Pearson and cosine peers",
          "search Euclidean neighbours of rows scaled to unit length",
          "(centred first for Pearson). \"-\" in the agreement columns",
          "marks the reference itself (knngpu::knnSearch) and WGCNA::cor,",
          "which gives correlations, not neighbours."),
    "", markdownTable(), "",
    "knngpu against BiocNeighbors KMKNN Euclidean, same data, same run:", "",
    ratios, "", "Targets (ALL, this machine):", "", verdict, "")

cat("\n")
cat(section, sep = "\n")

## Writing

## Replaces the "## CPU" section (up to the next "## " heading) of file, or
## appends it; creates the file with its title when missing.
writeSection <- function(file, section) {
    lines <- if (file.exists(file)) readLines(file) else
        c("# knngpu benchmarks", "")
    start <- which(lines == "## CPU")
    if (length(start)) {
        after <- grep("^## ", lines)
        after <- after[after > start[1L]]
        end <- if (length(after)) after[1L] - 1L else length(lines)
        lines <- c(lines[seq_len(start[1L] - 1L)], section,
                   if (end < length(lines)) lines[(end + 1L):length(lines)])
    } else {
        lines <- c(lines, section)
    }
    writeLines(lines, file)
}

if (write) {
    writeSection(outFile, section)
    cat(sprintf("wrote the CPU section of %s\n", outFile))
}
