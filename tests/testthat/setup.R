## An independent float64 reference: the full distance matrix from base R
## (cor, dist), then order() with the node index as tie-break. Distances are
## rounded to 10 decimals first, so that values equal in exact arithmetic
## but computed with different last bits by cor()/dist() count as ties.

refDistances <- function(nodes, metric, query = NULL) {
    all <- rbind(nodes, query)
    d <- switch(metric,
        pearson = 1 - stats::cor(t(all)),
        spearman = 1 - stats::cor(t(all), method = "spearman"),
        abspearson = 1 - abs(stats::cor(t(all))),
        cosine = {
            unit <- all / sqrt(rowSums(all^2))
            1 - tcrossprod(unit)
        },
        euclidean = as.matrix(stats::dist(all)),
        manhattan = as.matrix(stats::dist(all, method = "manhattan")),
        sqeuclidean = as.matrix(stats::dist(all))^2)
    dimnames(d) <- NULL
    n <- nrow(nodes)
    if (is.null(query)) {
        diag(d) <- Inf
        return(d)
    }
    d[n + seq_len(nrow(query)), seq_len(n), drop = FALSE]
}

## k nearest reference nodes of each row of `nodes` (or of `query`): list of
## n x k index and distance matrices, as knnSearch() returns them.
refKnn <- function(nodes, k, metric, query = NULL) {
    d <- refDistances(nodes, metric, query)
    index <- t(apply(d, 1, function(row) {
        order(round(row, 10), seq_along(row))[seq_len(k)]
    }))
    if (k == 1L) index <- matrix(index, ncol = 1L)
    distance <- matrix(d[cbind(rep(seq_len(nrow(d)), k), as.vector(index))],
                       ncol = k)
    list(index = index, distance = distance)
}

## Small-integer data: exact ties everywhere, duplicated rows, no constant
## row (so every metric is defined).
tiedMatrix <- function(n, p, seed) {
    set.seed(seed)
    x <- matrix(sample(0:3, n * p, replace = TRUE), n, p)
    x[seq(2, n, by = 7), ] <- x[seq(1, n - 1, by = 7), ]
    constant <- apply(x, 1, function(r) all(r == r[1]))
    x[constant, 1] <- x[constant, 1] + 1
    x
}

randomMatrix <- function(n, p, seed) {
    set.seed(seed)
    matrix(rnorm(n * p), n, p)
}

allMetrics <- c("pearson", "cosine", "euclidean", "spearman", "abspearson",
                "manhattan", "sqeuclidean")

## Nodes as rows, whatever `by` says, for the reference.
asRows <- function(x, by) if (by == "rows") x else t(x)

withOptions <- function(opts, code) {
    old <- options(opts)
    on.exit(options(old))
    code
}

## Whether some row of x is constant, which the correlation metrics refuse.
undefinedFor <- function(x, metric) {
    metric %in% c("pearson", "spearman", "abspearson", "cosine") &&
        any(apply(x, 1, function(r) all(r == r[1])))
}

## The data shapes where exact search falls off cliffs
## (inst/bench/shapes-data.R), smaller: genes at very different levels,
## log-counts full of zeros and duplicates, near-duplicate rows.
source(system.file("bench", "shapes-data.R", package = "knngpu"))
hardFeatures <- c(levels = 40, logcounts = 60, neardup = 20)
hardMatrix <- function(kind, n, seed) {
    shapeData(kind, n, hardFeatures[[kind]], seed)
}

hardKinds <- names(hardFeatures)

## Runs knnSearch(...) under an elapsed-time limit of `seconds`, which
## raises its error at the engine's next interrupt poll, the path Ctrl-C
## takes. The limit is lifted first thing in the handler: a limit still
## set would fire again inside whatever handles the error (testthat's
## backtrace, for one). Returns the error's message (or "finished") and
## the seconds from the start to the answer.
searchUnderTimeLimit <- function(seconds, ...) {
    started <- proc.time()[["elapsed"]]
    outcome <- tryCatch({
        setTimeLimit(elapsed = seconds, transient = TRUE)
        knnSearch(...)
        setTimeLimit()
        "finished"
    }, error = function(e) {
        setTimeLimit()
        conditionMessage(e)
    })
    list(err = outcome, took = proc.time()[["elapsed"]] - started)
}

## knnGraph(x, k, by = "columns", ...) under a limit on R's vector heap
## (mem.maxVSize(), R >= 4.2) that its result does not fit: what it
## raised, the limit restored. k is chosen from the heap's room, so that
## the result (28 bytes an edge) needs twice what is left.
graphOverVectorLimit <- function(x, ...) {
    gc()
    vcells <- gc()[2, ]
    limit <- vcells[[4]] + 40
    k <- ceiling(2 * (limit - vcells[[2]]) * 2^20 / (ncol(x) * 28))
    stopifnot(k < ncol(x))
    old <- mem.maxVSize()
    mem.maxVSize(limit)
    on.exit(mem.maxVSize(old))
    tryCatch(knnGraph(x, k = k, by = "columns", progress = FALSE, ...),
             error = identity)
}

## The ALL microarray set's most variable probe sets, genes in rows, with
## a share of values made missing at random.
allWithMissing <- function(genes, share, seed) {
    env <- new.env()
    utils::data("ALL", package = "ALL", envir = env)
    expr <- Biobase::exprs(env$ALL)
    expr <- expr[order(-apply(expr, 1, stats::var))[seq_len(genes)], ]
    set.seed(seed)
    expr[sample(length(expr), round(share * length(expr)))] <- NA
    expr
}
