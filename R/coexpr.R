## Internal: the co-expression measures of WGCNA users (src/engine/
## knn_coexpr.h): metric = "bicor" and use = "pairwise.complete.obs".
##
## bicor without missing values is a per-node transform (computed once, in
## float64) followed by the engine's exact cosine search, on either device.
## A pairwise-complete search, which happens only where the data hold
## missing values, ranks by float64 keys (src/engine/knn_pw_key.h): on the
## CPU after a screen of float32 products for the Pearson metrics and
## cosine, on a GPU for every pair; the bits are the same.

## The metrics that take use = "pairwise.complete.obs", in the engine's
## order of knn_pairwise_measure.
.pairwiseMetrics <- c("pearson", "abspearson", "cosine", "bicor")

## The metric the engine searches for a metric of the R layer: bicor is
## the cosine of its transformed nodes.
.engineMetric <- function(metric) if (metric == "bicor") "cosine" else metric

## 'use' and 'min.shared' checked: use as one choice, min.shared as an
## integer from 1.
.checkUse <- function(use, metric, min.shared) {
    if (identical(use, .uses)) use <- "everything"
    use <- .checkChoice(use, .uses, "use")
    if (use != "everything" && !metric %in% .pairwiseMetrics) {
        stop(sprintf(paste("'use = \"%s\"' needs a correlation metric:",
                           "%s"), use,
                     paste0('"', .pairwiseMetrics, '"', collapse = ", ")),
             call. = FALSE)
    }
    if (!.isWholeNumber(min.shared) || min.shared < 1 ||
        min.shared > .Machine$integer.max) {
        stop("'min.shared' must be a whole number from 1 (the fewest ",
             "features a pair must share to be neighbours)", call. = FALSE)
    }
    list(use = use, min.shared = as.integer(min.shared))
}

## The values of 'use'.
.uses <- c("everything", "pairwise.complete.obs")

## How the search runs for a checked use (.checkUse()) on the node
## sources (.nodeSource(), NULL for none): "pairwise" where missing values
## are asked for pairwise and some source holds one, else "everything". The
## whole search takes one way, decided here once, so that any split into
## blocks gives the same bits.
.searchUse <- function(use, ...) {
    if (use$use == "everything") return("everything")
    sources <- Filter(Negate(is.null), list(...))
    missing <- vapply(sources, function(s) anyNA(s$matrix), logical(1))
    if (any(missing)) return("pairwise")
    p <- sources[[1L]]$p
    if (p < use$min.shared) {
        stop(sprintf(paste("'min.shared' (%d) is more than the %d features",
                           "the nodes have: no pair could be neighbours"),
                     use$min.shared, p), call. = FALSE)
    }
    "everything"
}

## Nodes (a result of .readNodes(), or NULL) as bicor's transform of them;
## stops naming non-finite values and constant nodes.
.bicorNodes <- function(nodes, threads) {
    if (is.null(nodes)) return(NULL)
    .stopNonFinite(nodes)
    values <- .Call(C_knn_bicor_nodes, nodes$values, threads, 5L)
    count <- attr(values, "count")
    if (count > 0L) {
        stop(sprintf(paste0("'%s' has %d constant %s, for which the bicor ",
                            "metric is undefined: %s; remove them first ",
                            "(e.g. keep %s with non-zero variance)"),
                     nodes$arg, count, nodes$what,
                     .nameNodes(nodes$labels[attr(values, "bad")], count),
                     nodes$what), call. = FALSE)
    }
    attributes(values) <- list(dim = dim(values))
    nodes$values <- values
    nodes
}

## The pairwise-complete search of .runEngine() on backend ("gpu": every
## pair's float64 key and each row's best k on the first of `devices`),
## with what the engine reports completed for .reportRun().
.runPairwise <- function(ref, query, k, threads, progress, edges,
                         metric, min.shared, backend = "cpu",
                         devices = integer()) {
    gpu <- backend == "gpu"
    memory <- if (gpu) .memoryBudget("gpu") else 0
    res <- .Call(C_knn_pairwise, ref$values, query$values, as.integer(k),
                 match(metric, .pairwiseMetrics) - 1L, min.shared, threads,
                 progress, gpu, memory, as.integer(devices))
    if (identical(res$problem$status, "nonfinite")) {
        for (nodes in list(ref, query)) .stopInfinite(nodes)
    }
    if (!is.null(res$problem)) {
        .stopProblem(res$problem, ref, query, metric)
    }
    res$info <- c(res$info, seconds_rerank = 0, seconds_collect = 0,
                  pairs_once = FALSE)
    if (edges) res <- .edgeList(res)
    res
}

## Stops naming the nodes of `nodes` (or NULL) that hold Inf or -Inf,
## which a pairwise-complete search cannot take as missing.
.stopInfinite <- function(nodes) {
    if (is.null(nodes)) return(invisible(NULL))
    bad <- which(colSums(is.infinite(nodes$values)) > 0)
    if (!length(bad)) return(invisible(NULL))
    stop(sprintf(paste("'%s' has Inf values in %s: %s; only NA and NaN are",
                       "missing values"), nodes$arg, nodes$what,
                 .nameNodes(nodes$labels[bad])), call. = FALSE)
}
