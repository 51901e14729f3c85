## The hostile-input battery: generated cases over every verb, metric and
## `by`, each run in its own R process under a time limit, so that a crash
## or a hang is counted rather than fatal. A case passes when it ends in a
## clear R error that names the argument (and, for bad values, the nodes),
## or in the float64 reference's answer. Prints one line per failing case,
## "N passed, N failed" and a table by outcome; exits 1 on any failure.
##
## Usage (from the repository root, with knngpu installed in R_LIBS):
##   Rscript tools/hostile.R [--device=cpu|gpu] [--jobs=N] [--timeout=S]
##                           [--filter=REGEX] [--list]
## Under the sanitizers, tools/sanitize.sh runs it with R_LIBS pointing at
## the instrumented build and LD_PRELOAD set, which the children inherit.

source(file.path("tools", "args.R"))
device <- argValue("device", "cpu")
jobs <- as.integer(argValue("jobs", "2"))
timeout <- as.numeric(argValue("timeout", "120"))
filter <- argValue("filter", "")

metrics <- c("pearson", "cosine", "euclidean", "spearman", "abspearson",
             "manhattan", "sqeuclidean")
correlations <- c("pearson", "cosine", "spearman", "abspearson")

## A case: R code run after `prelude` (which defines the data helpers), and
## what it must end in: expect = "error" with `pattern` (the message must
## match it), or expect = "answer", where the code leaves `got` and `want`
## (lists of index and distance matrices) to compare. `env`: environment
## variables of its process ("NAME=value"); `vmem`: its address-space
## limit (ulimit -v, in kB), as a cluster's scheduler sets it.
cases <- list()
add <- function(name, code, expect, pattern = NULL, env = character(),
                vmem = NULL) {
    cases[[length(cases) + 1L]] <<- list(name = name, code = code,
                                         expect = expect, pattern = pattern,
                                         env = env, vmem = vmem)
}
errorCase <- function(name, code, pattern) add(name, code, "error", pattern)
answerCase <- function(name, code) add(name, code, "answer")

search <- function(x, extra = "") {
    sprintf("knnSearch(%s, k = 3, metric = m, device = dev%s)", x, extra)
}

## Non-finite values, whole rows and single cells, in x and in query, for
## every metric and both layouts.
for (m in metrics) for (bad in c("NA", "NaN", "Inf", "-Inf")) {
    errorCase(sprintf("%s: a row of %s in x", m, bad),
              sprintf("m <- '%s'; x <- base(); x[7, ] <- %s; %s", m, bad,
                      search("x")),
              "'x' has NA, NaN or Inf values in rows: 7$")
    errorCase(sprintf("%s: one %s cell in query", m, bad),
              sprintf("m <- '%s'; q <- base()[1:5, ]; q[4, 2] <- %s; %s", m,
                      bad, search("base(), q")),
              "'query' has NA, NaN or Inf values in rows: 4$")
}
for (m in metrics) {
    errorCase(sprintf("%s: NA in a column, by columns", m),
              sprintf(paste("m <- '%s'; x <- t(base()); x[3, 9] <- NA;",
                            "%s"), m, search("x", ", by = 'columns'")),
              "'x' has NA, NaN or Inf values in columns: 9$")
}

## Nodes the correlations cannot use; distances take them.
for (m in metrics) {
    code <- sprintf("m <- '%s'; x <- base(); x[c(4, 9), ] <- %s; %s", m,
                    if (m == "cosine") "0" else "2", search("x"))
    if (m %in% correlations) {
        errorCase(paste0(m, ": degenerate rows"), code,
                  "'x' has 2 (constant|all-zero) rows.*: 4, 9;")
    } else {
        answerCase(paste0(m, ": constant rows"), paste(
            code, "-> got; want <- refKnn(x, 3, m)"))
    }
}

## Sizes: 1 or 2 nodes, 0 or 1 features, for the graph and the search.
for (m in metrics) {
    errorCase(paste0(m, ": one node"),
              sprintf("m <- '%s'; %s", m, search("base()[1, , drop = FALSE]")),
              "'x' needs at least 2 nodes")
    errorCase(paste0(m, ": zero features"),
              sprintf("m <- '%s'; %s", m, search("base()[, 0]")),
              "'x' has zero features")
}
for (m in setdiff(metrics, correlations)) {
    answerCase(paste0(m, ": two nodes, k = 1"), sprintf(paste(
        "m <- '%s'; x <- base()[1:2, ]; got <- knnSearch(x, k = 1,",
        "metric = m, device = dev); want <- refKnn(x, 1, m)"), m))
    answerCase(paste0(m, ": one feature"), sprintf(paste(
        "m <- '%s'; x <- base()[, 1, drop = FALSE]; got <- knnSearch(x,",
        "k = 4, metric = m, device = dev); want <- refKnn(x, 4, m)"), m))
}
## Cosine of one feature is 1 or -1 mathematically; in float64 some pairs
## come out 1 - 1.1e-16, and the answer ranks by that, so only the
## reference's distances are compared.
answerCase("cosine: one feature", paste(
    "m <- 'cosine'; x <- base()[, 1, drop = FALSE]; got <- knnSearch(x,",
    "k = 4, metric = m, device = dev); want <- distanceRef(x, 4, m, got)"))
for (m in setdiff(correlations, "cosine")) {
    errorCase(paste0(m, ": one feature"),
              sprintf("m <- '%s'; %s", m, search("base()[, 1, drop = FALSE]")),
              "'x' has .* (constant|all-zero) rows")
}

## Every bad k, for both verbs.
for (k in c("0", "-1", "1.5", "NA", "60", "'10'", "TRUE", "1e10", "c(2, 3)",
            "NULL", "Inf")) {
    for (verb in c("knnSearch", "knnGraph")) {
        errorCase(sprintf("%s: k = %s", verb, k),
                  sprintf("%s(base(), k = %s, device = dev)", verb, k),
                  "'k' must be a whole number from 1 to 59")
    }
}

## Magnitudes: nodes scaled by 2^±990 (exact powers of two, so the float64
## answer is the unscaled one, distances scaled alike; squared distances
## overflow to Inf or underflow to 0 there, and every node ties); magnitudes
## from 1e-150 to 1e150 mixed within rows (the distances are those of the
## float64 reference; its order of near-ties is its rounding's, so the
## indices are not compared); and
## subnormal values mixed with normal ones, where float64 distances can
## underflow and tie: the answer must keep the tie contract (sorted by
## reported distance, then index; its k columns the first k of the full
## ranking).
for (m in metrics) for (e in c(990, -990)) {
    scale <- sprintf("2^%d", e)
    answerCase(sprintf("%s: nodes scaled by %s", m, scale), sprintf(paste(
        "m <- '%s'; x <- base(); got <- knnSearch(x * %s, k = 5,",
        "metric = m, device = dev); want <- scaledRef(x, 5, m, %s)"),
        m, scale, scale))
}
for (m in metrics) {
    answerCase(paste0(m, ": magnitudes 1e-150 to 1e150 within rows"),
               sprintf(paste(
                   "m <- '%s'; x <- base() * 10^sample(-150:150, 60 * 8,",
                   "TRUE); got <- knnSearch(x, k = 4, metric = m,",
                   "device = dev); want <- distanceRef(x, 4, m, got)"), m))
    answerCase(paste0(m, ": subnormals mixed within rows"), sprintf(paste(
        "m <- '%s'; x <- base(); x[, 1:4] <- x[, 1:4] * 1e-310;",
        "got <- knnSearch(x, k = 4, metric = m, device = dev);",
        "want <- tieContract(x, 4, m)"), m))
}

## Storage types and containers.
for (type in c("logical", "character", "complex")) {
    errorCase(paste("a", type, "matrix"),
              sprintf("x <- base(); storage.mode(x) <- '%s'; %s", type,
                      "knnSearch(x, k = 3, device = dev)"),
              "'x' must be a numeric matrix")
}
answerCase("an integer matrix", paste(
    "x <- round(base() * 10); storage.mode(x) <- 'integer';",
    "got <- knnSearch(x, k = 4, metric = 'manhattan', device = dev);",
    "want <- refKnn(x, 4, 'manhattan')"))
for (col in c("factor", "character")) {
    errorCase(paste("a data.frame with a", col, "column"), sprintf(paste(
        "d <- as.data.frame(base()); d$V3 <- as.%s(d$V3);",
        "knnSearch(d, k = 3, device = dev)"), col),
        "'x' has non-numeric columns: V3")
}
answerCase("a dgCMatrix", paste(
    "x <- base(); x[abs(x) < 0.8] <- 0;",
    "got <- knnSearch(Matrix::Matrix(x, sparse = TRUE), k = 4,",
    "metric = 'euclidean', device = dev); want <- refKnn(x, 4, 'euclidean')"))
## Data on disk (HDF5Array), read in blocks; split across workers.
for (by in c("rows", "columns")) {
    answerCase(sprintf("an HDF5Array, by %s", by), sprintf(paste(
        "needs('HDF5Array'); y <- base(); x <- if ('%s' == 'rows') y",
        "else t(y); h <- HDF5Array::writeHDF5Array(x,",
        "tempfile(fileext = '.h5'), 'x'); got <- knnSearch(h, k = 4,",
        "by = '%s', metric = 'cosine', device = dev);",
        "want <- refKnn(y, 4, 'cosine')"), by, by))
}
errorCase("an HDF5Array with an NA row", paste(
    "needs('HDF5Array'); x <- base(); x[12, ] <- NA;",
    "h <- HDF5Array::writeHDF5Array(x, tempfile(fileext = '.h5'), 'x');",
    "knnGraph(h, k = 3, device = dev)"),
    "'x' has NA, NaN or Inf values in rows: 12$")
errorCase("an HDF5Array whose file is gone", paste(
    "needs('HDF5Array'); path <- tempfile(fileext = '.h5');",
    "h <- HDF5Array::writeHDF5Array(base(), path, 'x'); unlink(path);",
    "knnGraph(h, k = 3, device = dev)"), "could not read 'x'")
errorCase("a logical HDF5Array", paste(
    "needs('HDF5Array'); h <- HDF5Array::writeHDF5Array(base() > 0,",
    "tempfile(fileext = '.h5'), 'x'); knnGraph(h, k = 3, device = dev)"),
    "'x' must be a numeric matrix")
answerCase("BPPARAM with two workers", paste(
    "needs('BiocParallel'); x <- base();",
    "got <- knnSearch(x, k = 5, metric = 'pearson', device = dev,",
    "BPPARAM = BiocParallel::SnowParam(2, tasks = 3));",
    "want <- refKnn(x, 5, 'pearson')"))
errorCase("BPPARAM with a worker error", paste(
    "needs('BiocParallel'); x <- base(); x[40, 2] <- NaN;",
    "knnGraph(x, k = 3, device = dev, BPPARAM =",
    "BiocParallel::SnowParam(2))"),
    paste0("worker failed on block 1 of 2 .*'x' has NA, NaN or Inf ",
           "values in rows: 40$"))
errorCase("BPPARAM not a BiocParallelParam", paste(
    "knnGraph(base(), k = 3, device = dev, BPPARAM = list(workers = 2))"),
    "'BPPARAM' must be NULL or a BiocParallelParam")
errorCase("a SummarizedExperiment without the assay", paste(
    "needs('SummarizedExperiment');",
    "se <- SummarizedExperiment::SummarizedExperiment(list(counts =",
    "t(base()))); knnSearch(se, k = 3, assay = 'logcounts', device = dev)"),
    "logcounts|assay")

## Node names igraph would refuse: made unique, and the graph loads.
for (names in c("rep(c('a', 'b'), 30)", "c(NA, paste0('g', 2:60))",
                "c('', paste0('g', 2:60))", "rep('', 60)")) {
    for (extra in c("", ", symmetrize = 'union'", ", snn = 'rank'")) {
        answerCase(sprintf("names %s%s", names, extra), sprintf(paste(
            "x <- base(); rownames(x) <- %s; e <- suppressMessages(",
            "knnGraph(x, k = 4, device = dev%s)); g <- toIgraph(e);",
            "got <- list(ok = igraph::vcount(g) == 60 &&",
            "!anyDuplicated(igraph::V(g)$name)); want <- list(ok = TRUE)"),
            names, extra))
    }
}

## Bad values of the other arguments.
bad <- list(
    threads = c("1e6", "1e10", "-1", "2.5", "NA", "'2'"),
    device = c("'tpu'", "NA", "1"), metric = c("'kendall'", "NA", "2"),
    by = c("'genes'", "NA"), symmetrize = c("'both'", "NA"),
    snn = c("'shared'", "1"), progress = c("NA", "'yes'"),
    verbose = c("NA", "2"), precision = c("'fp16'", "NA", "64"))
for (arg in names(bad)) for (value in bad[[arg]]) {
    verb <- if (arg %in% c("symmetrize", "snn")) "knnGraph" else "knnSearch"
    errorCase(sprintf("%s: %s = %s", verb, arg, value),
              sprintf("%s(base(), k = 3, %s = %s)", verb, arg, value),
              sprintf("'%s' must", arg))
}
for (value in c("99", "-1", "c(0, 0)", "NA")) {
    errorCase(paste("devices =", value), sprintf(paste(
        "if (!gpuAvailable()) stop(\"'devices' must (no GPU to test)\");",
        "knnSearch(base(), k = 3, device = 'gpu', devices = %s)"), value),
        "'devices' must")
}
errorCase("precision = 'tf32' on the CPU",
          "knnSearch(base(), k = 3, device = 'cpu', precision = 'tf32')",
          "'precision = \"tf32\"' is not a rung of the CPU")
errorCase("query with other features",
          "knnSearch(base(), base()[, 1:3], k = 3, device = dev)",
          "'query' has 3 features but 'x' has 8")
errorCase("use.dimred without a SingleCellExperiment",
          "knnGraph(base(), k = 3, use.dimred = 'PCA', device = dev)",
          "'use.dimred' needs 'x' to be a SingleCellExperiment")

## Through BiocNeighbors: the same errors.
errorCase("findKNN: k not whole", paste(
    "BiocNeighbors::findKNN(base(), k = 2.5, BNPARAM = KnngpuParam(device =",
    "dev))"), "'k' must be a whole number of at least 1")
errorCase("findKNN: NA", paste(
    "x <- base(); x[2, 2] <- NA; BiocNeighbors::findKNN(x, k = 3,",
    "BNPARAM = KnngpuParam(device = dev))"),
    "'X' has NA, NaN or Inf values in rows: 2$")
errorCase("findKNN: character", paste(
    "BiocNeighbors::findKNN(matrix(letters, 13), k = 3,",
    "BNPARAM = KnngpuParam(device = dev))"), "'X' must be a numeric matrix")

## Where users run it: an address-space limit, an absurd OpenMP setting.
## The search finishes with the reference's answer, or stops with an error
## that names what to lower, in its normal time (a hang is the timeout).
finishes <- function(call) paste(
    "res <- tryCatch({", call, "; 'done'}, error = function(e)",
    "if (grepl(\"'threads'|knngpu.cpu.memory\", conditionMessage(e)))",
    "'named' else conditionMessage(e));",
    "got <- list(res = res %in% c('done', 'named'));",
    "want <- list(res = TRUE)")
limitCase <- function(name, code, env = character(), vmem = NULL) {
    add(paste("limits:", name), code, "answer", env = env, vmem = vmem)
}
exact <- paste("m <- 'euclidean'; x <- base(); got <-",
               "knnSearch(x, k = 3, metric = m, device = 'cpu'%s);",
               "want <- refKnn(x, 3, m)")
limitCase("OMP_NUM_THREADS = 3000, threads = 2",
          sprintf(exact, ", threads = 2"), env = "OMP_NUM_THREADS=3000")
limitCase("threads = 1024 under 4 GB", sprintf(exact, ", threads = 1024"),
          vmem = 4e6)
limitCase("OMP_STACKSIZE = 64K", sprintf(exact, ", threads = 2"),
          env = "OMP_STACKSIZE=64K")
limitCase("20000 x 10, threads = 4, under 1 GB", finishes(paste(
    "x <- matrix(rnorm(20000 * 10), ncol = 10); knnSearch(x, k = 10,",
    "metric = 'euclidean', device = 'cpu', threads = 4)")), vmem = 1e6)
limitCase("100000 x 50 graph under 1 GB", finishes(paste(
    "x <- matrix(rnorm(1e5 * 50), ncol = 50); knnGraph(x, k = 10,",
    "metric = 'euclidean', device = 'cpu')")), vmem = 1e6)
limitCase("SNN weights of 20000 nodes, k = 30, under 1 GB", finishes(paste(
    "x <- matrix(rnorm(20000 * 10), ncol = 10); knnGraph(x, k = 30,",
    "metric = 'euclidean', device = 'cpu', snn = 'rank')")), vmem = 1e6)
## Little left under the limit: a raw vector takes all but `mb` of it
## (ulimit -v, which a child shell reports, less what R holds), where a
## BLAS buffer (128 MB in OpenBLAS, retried for ever when refused) no
## longer fits beside the search.
leaving <- function(mb, call) paste(
    "limit <- as.numeric(system('ulimit -v', intern = TRUE));",
    "held <- as.numeric(gsub('[^0-9]', '', grep('^VmSize',",
    "    readLines('/proc/self/status'), value = TRUE)));",
    "x <- matrix(rnorm(20000 * 50), ncol = 50);",
    sprintf("hog <- raw(max(0, (limit - held) * 1024 - %.0f * 2^20 - 8e6));",
            mb), call)
for (left in c(60, 120, 200)) for (algorithm in c("auto", "products")) {
    limitCase(sprintf("20000 x 50, %s, %d MB left under 1 GB", algorithm,
                      left),
              finishes(leaving(left, paste0(
                  "options(knngpu.algorithm = '", algorithm, "'); ",
                  "knnSearch(x, k = 10, metric = 'euclidean', ",
                  "device = 'cpu', threads = 2)"))), vmem = 1e6)
}
limitCase("k = 5000 re-rank under 1 GB", finishes(paste(
    "x <- matrix(rnorm(20000 * 10), ncol = 10); knnSearch(x, x[1:2000, ],",
    "k = 5000, metric = 'euclidean', device = 'cpu')")), vmem = 1e6)
limitCase("union of 20000 nodes, k = 200, under 1 GB", finishes(paste(
    "x <- matrix(rnorm(20000 * 10), ncol = 10); knnGraph(x, k = 200,",
    "metric = 'euclidean', device = 'cpu', symmetrize = 'union')")),
    vmem = 1e6)
limitCase("k-d tree of 300000 points, threads = 8, under 1 GB", finishes(
    paste("x <- matrix(rnorm(3e5 * 3), ncol = 3);",
          "options(knngpu.algorithm = 'tree'); knnSearch(x, k = 10,",
          "metric = 'euclidean', device = 'cpu', threads = 8)")), vmem = 1e6)
limitCase("SnowParam(2) under 1 GB", finishes(paste(
    "x <- matrix(rnorm(20000 * 10), ncol = 10); knnGraph(x, k = 10,",
    "metric = 'euclidean', device = 'cpu',",
    "BPPARAM = BiocParallel::SnowParam(2))")), vmem = 1e6)
limitCase("Spearman of 5000 x 500, threads = 4, under 1 GB", finishes(paste(
    "x <- matrix(rnorm(5000 * 500), ncol = 500); knnGraph(x, k = 10,",
    "metric = 'spearman', device = 'cpu', threads = 4)")), vmem = 1e6)

## The R code every case runs first.
prelude <- c(
    "suppressPackageStartupMessages(library(knngpu))",
    sprintf("dev <- '%s'", device),
    "set.seed(1)",
    "base <- function() matrix(rnorm(60 * 8), 60, 8)",
    ## A case that needs a package this machine lacks is skipped.
    "needs <- function(pkg) {",
    "    if (!requireNamespace(pkg, quietly = TRUE)) {",
    "        cat('OUTCOME SKIPPED: no', pkg, '\\n')",
    "        quit(status = 0)",
    "    }",
    "}",
    ## The independent float64 reference of the test suite.
    "source(file.path('tests', 'testthat', 'setup.R'))",
    ## Scaling by a power of two is exact: indices as unscaled, distances
    ## scaled (squared for sqeuclidean, none for correlations).
    "scaledRef <- function(x, k, m, s) {",
    "    if (m == 'sqeuclidean' && (s^2 == Inf || s^2 == 0)) {",
    "        n <- nrow(x)",
    "        index <- t(vapply(seq_len(n), function(i) {",
    "            setdiff(seq_len(k + 1), i)[seq_len(k)]",
    "        }, integer(k)))",
    "        return(list(index = index, distance = matrix(s^2, n, k)))",
    "    }",
    "    r <- refKnn(x, k, m)",
    "    f <- if (m %in% c('euclidean', 'manhattan')) s else",
    "        if (m == 'sqeuclidean') s^2 else 1",
    "    r$distance <- r$distance * f",
    "    r",
    "}",
    ## The reference's distances; the indices are the answer's own, each
    ## row sorted by (distance, index).
    "distanceRef <- function(x, k, m, got) {",
    "    r <- refKnn(x, k, m)",
    "    sorted <- all(vapply(seq_len(nrow(x)), function(i) {",
    "        identical(order(got$distance[i, ], got$index[i, ]), seq_len(k))",
    "    }, logical(1)))",
    "    list(index = if (sorted) got$index, distance = r$distance)",
    "}",
    ## The tie contract on the engine's own full ranking: every row sorted
    ## by (distance, index); the first k columns are the answer.
    "tieContract <- function(x, k, m) {",
    "    all <- knnSearch(x, k = nrow(x) - 1, metric = m, device = dev)",
    "    sorted <- all(vapply(seq_len(nrow(x)), function(i) {",
    "        identical(order(all$distance[i, ], all$index[i, ]),",
    "                  seq_len(nrow(x) - 1L))",
    "    }, logical(1)))",
    "    if (!sorted) return(list())",
    "    list(index = all$index[, 1:k], distance = all$distance[, 1:k])",
    "}")

runCase <- function(case) {
    dir <- tempfile("hostile")
    dir.create(dir)
    script <- file.path(dir, "case.R")
    writeLines(c(prelude,
                 "res <- tryCatch({",
                 case$code,
                 "    'done'",
                 "}, error = function(e) paste('ERROR:', conditionMessage(e)))",
                 "if (startsWith(res, 'ERROR:')) {",
                 "    cat('OUTCOME', res, '\\n')",
                 "} else",
                 "cat('OUTCOME', if (exists('got') && exists('want') &&",
                 "    identical(got$index, want$index) &&",
                 "    isTRUE(all.equal(got$distance, want$distance,",
                 "                     tolerance = 1e-10))) 'ANSWER: right'",
                 "    else 'ANSWER: wrong', '\\n')"), script)
    start <- proc.time()[["elapsed"]]
    ## An address-space limit cannot hold the sanitizers' shadow memory.
    if (!is.null(case$vmem) && nzchar(Sys.getenv("KNNGPU_SANITIZED"))) {
        return(list(name = case$name, outcome = "skipped", passed = TRUE,
                    detail = "limit under the sanitizers", seconds = 0))
    }
    command <- paste("exec env", paste(shQuote(case$env), collapse = " "),
                     "timeout", timeout,
                     shQuote(file.path(R.home("bin"), "Rscript")),
                     shQuote(script))
    if (!is.null(case$vmem)) {
        command <- paste("ulimit -v", format(case$vmem, scientific = FALSE),
                         "&&", command)
    }
    out <- suppressWarnings(system2("sh", c("-c", shQuote(command)),
                                    stdout = TRUE, stderr = TRUE))
    status <- attr(out, "status")
    if (is.null(status)) status <- 0L
    unlink(dir, recursive = TRUE)
    line <- grep("^OUTCOME", out, value = TRUE)
    line <- if (length(line)) trimws(sub("^OUTCOME ", "", line[1L])) else ""
    outcome <- if (status == 124L) "hang"
        else if (!nzchar(line)) "crash"
        else if (startsWith(line, "SKIPPED")) "skipped"
        else if (startsWith(line, "ERROR:")) {
            if (case$expect == "error" && grepl(case$pattern, line)) {
                "clear error"
            } else "wrong error"
        } else if (grepl("ANSWER: right", line) && case$expect == "answer") {
            "reference answer"
        } else if (case$expect == "error") "no error" else "wrong answer"
    list(name = case$name, outcome = outcome,
         passed = outcome %in% c("clear error", "reference answer",
                                 "skipped"),
         detail = if (nzchar(line)) line else paste(tail(out, 3),
                                                    collapse = " | "),
         seconds = proc.time()[["elapsed"]] - start)
}

if (nzchar(filter)) {
    cases <- Filter(function(c) grepl(filter, c$name), cases)
}
if ("--list" %in% args) {
    for (c in cases) cat(c$name, "\n")
    quit(status = 0L)
}
results <- parallel::mclapply(cases, runCase, mc.cores = jobs,
                              mc.preschedule = FALSE)
failed <- Filter(function(r) !r$passed, results)
for (r in failed) cat(sprintf("FAILED %s [%s]: %s\n", r$name, r$outcome,
                              r$detail))
outcomes <- vapply(results, `[[`, "", "outcome")
skipped <- sum(outcomes == "skipped")
cat(sprintf("hostile battery (%s): %d passed, %d failed, %d skipped\n",
            device, length(results) - length(failed) - skipped,
            length(failed), skipped))
print(table(outcome = outcomes))
quit(status = if (length(failed)) 1L else 0L)
