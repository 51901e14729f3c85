## Co-expression with missing values: knngpu's pairwise-complete Pearson
## (use = "pairwise.complete.obs") against its complete-data search, and
## against WGCNA's own cor(use = "p") + order(), with the neighbours
## checked to be the same.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript inst/bench/coexpr.R [--reps=N] [--device=auto|cpu|gpu]
##                               [--skip-large] [--bicor]
##                               [--wgcna-rows=N]
##
##   --reps=N      runs per contender (median reported; default 3); a
##                 contender whose first run takes over 30 s runs once
##   --device      knngpu's device for every search (default "auto"):
##                 with "gpu" (or "auto" on a GPU machine) the
##                 pairwise-complete searches key every pair on the GPU
##                 (float64, the CPU's bits), and each is also timed on
##                 the CPU for the GPU's gain
##   --skip-large  only the ALL cases
##   --bicor       also time metric = "bicor" (with missing values)
##                 against WGCNA::bicor(use = "p") on ALL
##   --wgcna-rows  WGCNA's reference for the first N genes of each case
##                 only (their correlations with all genes), checked
##                 against knngpu's rows of them; its time is for them
##                 (default: all genes; WGCNA's pairwise-complete path
##                 takes minutes per case)
##
## Cases, k = 10, genes as nodes:
##   1. ALL (12625 probe sets x 128 patients), complete, and with 0.5% and
##      5% of its values missing at random (set.seed(20261126));
##   2. a random 20000 genes x 500 samples matrix of 20 modules (each gene
##      its module's profile plus noise), complete and 5% missing at
##      random.
## Each pairwise-complete search is checked against WGCNA's cor(use = "p")
## (bicor) + order(distance, index) in the same run. The issue's target:
## pairwise-complete Pearson at most 3 times the complete-data search on
## ALL (the ratio lines), on the same device.

suppressPackageStartupMessages({
    library(knngpu)
    library(ALL)
})

args <- commandArgs(trailingOnly = TRUE)
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L]) else default
}
reps <- as.integer(argValue("reps", "3"))
device <- argValue("device", "auto")
skipLarge <- "--skip-large" %in% args
withBicor <- "--bicor" %in% args
wgcnaRows <- as.integer(argValue("wgcna-rows", "0"))
slowSeconds <- 30
k <- 10L
haveWgcna <- requireNamespace("WGCNA", quietly = TRUE)

## Median wall seconds of `reps` runs of expr (one run when the first
## takes over slowSeconds); the last value is kept in `value`.
timed <- function(expr) {
    expr <- substitute(expr)
    env <- parent.frame()
    seconds <- numeric()
    for (i in seq_len(reps)) {
        start <- Sys.time()
        value <- eval(expr, env)
        seconds[i] <- as.numeric(Sys.time()) - as.numeric(start)
        if (seconds[1L] > slowSeconds) break
    }
    list(seconds = stats::median(seconds), value = value)
}

## The genes WGCNA's reference is computed for (--wgcna-rows).
wgcnaGenes <- function(x) {
    seq_len(if (wgcnaRows > 0L) min(wgcnaRows, nrow(x)) else nrow(x))
}

## WGCNA's answer for the genes wgcnaGenes(x): their pairwise-complete
## correlations (or bicor) with all genes in blocks of 2000, then each
## one's k best by (1 - r, index), as one matrix of indices.
wgcnaNeighbours <- function(x, k, bicor = FALSE) {
    genes <- wgcnaGenes(x)
    blocks <- split(genes, (genes - 1L) %/% 2000L)
    found <- lapply(blocks, function(rows) {
        r <- if (bicor) {
            suppressWarnings(WGCNA::bicor(t(x[rows, , drop = FALSE]), t(x),
                                          use = "p"))
        } else {
            WGCNA::cor(t(x[rows, , drop = FALSE]), t(x), use = "p")
        }
        d <- 1 - r
        d[cbind(seq_along(rows), rows)] <- NA
        d[is.na(d)] <- Inf
        t(apply(d, 1, function(row) order(row, seq_along(row))[seq_len(k)]))
    })
    do.call(rbind, found)
}

withMissing <- function(x, share, seed) {
    set.seed(seed)
    x[sample(length(x), round(share * length(x)))] <- NA
    x
}

modules <- function(genes, samples, count, seed) {
    set.seed(seed)
    profiles <- matrix(stats::rnorm(count * samples), count)
    member <- sample(count, genes, replace = TRUE)
    x <- profiles[member, ] + matrix(stats::rnorm(genes * samples, sd = 1.5),
                                     genes)
    rownames(x) <- paste0("gene", seq_len(genes))
    x
}

## Whether knngpu's neighbours (a knnSearch() result) are WGCNA's
## (wgcnaNeighbours()) for the genes WGCNA's reference covers.
sameAsWgcna <- function(found, wgcna) {
    identical(unname(found$index[seq_len(nrow(wgcna)), , drop = FALSE]),
              unname(wgcna))
}

## The label of WGCNA's contender for x.
wgcnaLabel <- function(x, what = "cor") {
    covered <- length(wgcnaGenes(x))
    sprintf("WGCNA %s(use = \"p\") + order()%s", what,
            if (covered < nrow(x)) sprintf(", %d genes", covered) else "")
}

report <- function(case, contender, seconds, same = NA) {
    cat(sprintf("%-34s %-40s %9.3f s %s\n", case, contender, seconds,
                if (is.na(same)) "" else
                    sprintf("(same neighbours as WGCNA: %s)", same)))
}

## The machine: its CPU model and, where one is used, its GPUs.
machine <- function() {
    cpu <- tryCatch(grep("^model name", readLines("/proc/cpuinfo"),
                         value = TRUE)[1L], error = function(e) NA)
    cpu <- if (is.na(cpu)) "unknown CPU" else sub(".*:\\s*", "", cpu)
    gpus <- gpuInfo()$devices
    gpu <- if (device != "cpu" && NROW(gpus)) {
        paste0(", GPU: ", paste(unique(gpus$name), collapse = ", "))
    } else ""
    paste0(cpu, " (", parallel::detectCores(), " cores)", gpu)
}

cat(sprintf("knngpu %s, WGCNA %s, R %s, device = \"%s\"\n%s\n%s\n",
            utils::packageVersion("knngpu"),
            if (haveWgcna) utils::packageVersion("WGCNA") else "absent",
            getRversion(), device, machine(),
            format(Sys.time(), "%Y-%m-%d %H:%M %Z")))
if (haveWgcna) WGCNA::enableWGCNAThreads(parallel::detectCores())

data(ALL, envir = environment())
all <- Biobase::exprs(ALL)

complete <- timed(knnSearch(all, k = k, device = device, progress = FALSE))
report("ALL complete", sprintf("knngpu pearson (%s)",
                               attr(complete$value, "backend")),
       complete$seconds)
for (share in c(0.005, 0.05)) {
    case <- sprintf("ALL %s%% NA", format(100 * share))
    holey <- withMissing(all, share, 20261126)
    pairwise <- timed(knnSearch(holey, k = k, use = "pairwise.complete.obs",
                                device = device, progress = FALSE))
    report(case, sprintf("knngpu pearson pairwise-complete (%s)",
                         attr(pairwise$value, "backend")), pairwise$seconds)
    cat(sprintf("%-34s ratio to complete (%s): %.2f (target <= 3)\n", case,
                attr(complete$value, "backend"),
                pairwise$seconds / complete$seconds))
    if (attr(pairwise$value, "backend") == "gpu") {
        onCpu <- timed(knnSearch(holey, k = k, use = "pairwise.complete.obs",
                                 device = "cpu", progress = FALSE))
        report(case, "knngpu pearson pairwise-complete (cpu)",
               onCpu$seconds)
        cat(sprintf(paste("%-34s same neighbours on GPU and CPU: %s;",
                          "CPU / GPU: %.2f\n"), case,
                    identical(onCpu$value[1:2], pairwise$value[1:2]),
                    onCpu$seconds / pairwise$seconds))
    }
    if (haveWgcna) {
        wgcna <- timed(wgcnaNeighbours(holey, k))
        report(case, wgcnaLabel(holey), wgcna$seconds,
               sameAsWgcna(pairwise$value, wgcna$value))
    }
}
if (withBicor) {
    robust <- timed(knnSearch(holey, k = k, metric = "bicor",
                              use = "pairwise.complete.obs",
                              device = device, progress = FALSE))
    report("ALL 5% NA", sprintf("knngpu bicor pairwise-complete (%s)",
                                attr(robust$value, "backend")),
           robust$seconds)
    if (attr(robust$value, "backend") == "gpu") {
        robustCpu <- timed(knnSearch(holey, k = k, metric = "bicor",
                                     use = "pairwise.complete.obs",
                                     device = "cpu", progress = FALSE))
        report("ALL 5% NA", "knngpu bicor pairwise-complete (cpu)",
               robustCpu$seconds)
        cat(sprintf(paste("%-34s same neighbours on GPU and CPU: %s;",
                          "CPU / GPU: %.2f\n"), "ALL 5% NA",
                    identical(robustCpu$value[1:2], robust$value[1:2]),
                    robustCpu$seconds / robust$seconds))
    }
    if (haveWgcna) {
        wgcnaB <- timed(wgcnaNeighbours(holey, k, bicor = TRUE))
        report("ALL 5% NA", wgcnaLabel(holey, "bicor"), wgcnaB$seconds,
               sameAsWgcna(robust$value, wgcnaB$value))
    }
}
if (!skipLarge) {
    large <- modules(20000, 500, 20, 20261127)
    largeHoley <- withMissing(large, 0.05, 20261128)
    completeL <- timed(knnSearch(large, k = k, device = device,
                                 progress = FALSE))
    report("20000 x 500 complete", sprintf("knngpu pearson (%s)",
                                           attr(completeL$value, "backend")),
           completeL$seconds)
    pairwiseL <- timed(knnSearch(largeHoley, k = k,
                                 use = "pairwise.complete.obs",
                                 device = device, progress = FALSE))
    report("20000 x 500 5% NA",
           sprintf("knngpu pearson pairwise-complete (%s)",
                   attr(pairwiseL$value, "backend")), pairwiseL$seconds)
    cat(sprintf("%-34s ratio to complete (%s): %.2f\n", "20000 x 500 5% NA",
                attr(completeL$value, "backend"),
                pairwiseL$seconds / completeL$seconds))
    if (haveWgcna) {
        wgcnaL <- timed(wgcnaNeighbours(largeHoley, k))
        report("20000 x 500 5% NA", wgcnaLabel(largeHoley), wgcnaL$seconds,
               sameAsWgcna(pairwiseL$value, wgcnaL$value))
    }
}
