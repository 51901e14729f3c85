## Shared argument checks and input conversion for the exported verbs. Every
## message names the argument, and, for bad values, the offending nodes.

.metrics <- c("pearson", "cosine", "euclidean", "spearman", "abspearson",
              "manhattan", "sqeuclidean")

.correlationMetrics <- c("pearson", "cosine", "spearman", "abspearson")

## 0-based code the engine uses (src/engine/knn.h, knn_metric).
.metricCode <- function(metric) match(metric, .metrics) - 1L

.checkChoice <- function(value, choices, arg) {
    if (!is.character(value) || length(value) != 1L || is.na(value) ||
        !value %in% choices) {
        stop(sprintf("'%s' must be one of %s", arg,
                     paste0('"', choices, '"', collapse = ", ")),
             call. = FALSE)
    }
    value
}

.checkMetric <- function(metric) .checkChoice(metric, .metrics, "metric")

.isWholeNumber <- function(x) {
    is.numeric(x) && length(x) == 1L && !is.na(x) && is.finite(x) &&
        x == round(x)
}

.checkK <- function(k, available) {
    if (!.isWholeNumber(k) || k < 1 || k > available) {
        stop(sprintf(paste("'k' must be a whole number from 1 to %d",
                           "(the number of candidate nodes)"), available),
             call. = FALSE)
    }
    as.integer(k)
}

.checkThreads <- function(threads) {
    if (is.null(threads)) threads <- getOption("knngpu.threads", 0L)
    if (!.isWholeNumber(threads) || threads < 0) {
        stop("'threads' must be NULL or a positive whole number",
             call. = FALSE)
    }
    as.integer(threads)
}

.checkFlag <- function(value, arg) {
    if (!is.logical(value) || length(value) != 1L || is.na(value)) {
        stop(sprintf("'%s' must be TRUE or FALSE", arg), call. = FALSE)
    }
    value
}

## Lists at most five labels, then how many more of `count` there are.
.nameNodes <- function(labels, count = length(labels)) {
    shown <- utils::head(labels, 5L)
    more <- count - length(shown)
    paste0(paste(shown, collapse = ", "),
           if (more > 0L) sprintf(" (and %d more)", more) else "")
}

## The matrix inside the supported containers, with samples in columns.
.extractMatrix <- function(x, assay, arg) {
    ## A plain matrix, the usual case, skips the S4 class lookups.
    if (is.matrix(x) && !isS4(x)) return(x)
    if (methods::is(x, "SummarizedExperiment")) {
        if (!requireNamespace("SummarizedExperiment", quietly = TRUE)) {
            stop(sprintf("'%s' is a SummarizedExperiment but the package ",
                         arg), "SummarizedExperiment is not installed",
                 call. = FALSE)
        }
        return(SummarizedExperiment::assay(x, assay, withDimnames = TRUE))
    }
    if (methods::is(x, "ExpressionSet")) {
        if (!requireNamespace("Biobase", quietly = TRUE)) {
            stop(sprintf("'%s' is an ExpressionSet but Biobase is not ", arg),
                 "installed", call. = FALSE)
        }
        return(Biobase::exprs(x))
    }
    if (is.data.frame(x)) {
        numeric <- vapply(x, is.numeric, logical(1))
        if (!all(numeric)) {
            stop(sprintf("'%s' has non-numeric columns: %s", arg,
                         .nameNodes(names(x)[!numeric])), call. = FALSE)
        }
        return(as.matrix(x))
    }
    if (methods::is(x, "Matrix")) return(as.matrix(x))
    x
}

.nodeLabels <- function(m, by) {
    labels <- if (by == "rows") rownames(m) else colnames(m)
    if (is.null(labels)) seq_len(if (by == "rows") nrow(m) else ncol(m))
    else labels
}

## Converts x to what the engine takes: a double matrix with one column per
## node (features x nodes), plus the node labels and the argument's name
## for messages. Non-finite values are left to the engine, which finds them
## as it reads the values anyway (.stopNonFinite names them).
.asNodes <- function(x, by, assay = 1L, arg = "x") {
    m <- .extractMatrix(x, assay, arg)
    if (!is.matrix(m) || !is.numeric(m)) {
        stop(sprintf(paste("'%s' must be a numeric matrix, a data.frame of",
                           "numeric columns, a SummarizedExperiment or an",
                           "ExpressionSet"), arg), call. = FALSE)
    }
    labels <- .nodeLabels(m, by)
    what <- if (by == "rows") "rows" else "columns"
    shape <- if (by == "rows") dim(m) else rev(dim(m))  # nodes, features
    if (shape[1L] < 1L) {
        stop(sprintf("'%s' has no %s (nodes)", arg, what), call. = FALSE)
    }
    if (shape[2L] < 1L) {
        stop(sprintf("'%s' has zero features: its %s are empty", arg, what),
             call. = FALSE)
    }
    list(values = .Call(C_knn_nodes, m, by == "rows"), labels = labels,
         what = what, arg = arg)
}

## The error for nodes holding NA, NaN or Inf, naming the first ones; each
## of nodes (results of .asNodes(), NULL ones skipped) is checked in turn.
.stopNonFinite <- function(...) {
    for (nodes in list(...)) {
        if (is.null(nodes)) next
        bad <- .Call(C_knn_nonfinite, nodes$values, 5L)
        count <- attr(bad, "count")
        if (count > 0L) {
            stop(sprintf("'%s' has NA, NaN or Inf values in %s: %s",
                         nodes$arg, nodes$what,
                         .nameNodes(nodes$labels[bad], count)),
                 call. = FALSE)
        }
    }
    stop("the engine found NA, NaN or Inf values that a second look ",
         "did not", call. = FALSE)
}

## Rejects nodes the metric cannot use: constant nodes for correlations,
## all-zero nodes for cosine.
.checkDegenerate <- function(nodes, metric) {
    if (!metric %in% .correlationMetrics) return(invisible(NULL))
    bad <- .Call(C_knn_degenerate, nodes$values, .metricCode(metric), 5L)
    count <- attr(bad, "count")
    if (count == 0L) return(invisible(NULL))
    kind <- if (metric == "cosine") "all-zero" else "constant"
    stop(sprintf(paste0("'%s' has %d %s %s, for which the %s metric is ",
                        "undefined: %s; remove them first (e.g. keep %s ",
                        "with non-zero variance)"), nodes$arg, count, kind,
                 nodes$what, metric, .nameNodes(nodes$labels[bad], count),
                 nodes$what), call. = FALSE)
}
