## Shared argument checks and input conversion for the exported verbs. Every
## message names the argument, and, for bad values, the offending nodes.

## The metrics, in the engine's code order: its table (knn_metric.h),
## read when the package loads (zzz.R).
.metricNames <- function() .state$metrics$name

## 0-based code the engine uses (knn_metric).
.metricCode <- function(metric) match(metric, .metricNames()) - 1L

.checkChoice <- function(value, choices, arg) {
    if (!is.character(value) || length(value) != 1L || is.na(value) ||
        !value %in% choices) {
        stop(sprintf("'%s' must be one of %s", arg,
                     paste0('"', choices, '"', collapse = ", ")),
             call. = FALSE)
    }
    value
}

.checkMetric <- function(metric) {
    .checkChoice(metric, c(.metricNames(), "bicor"), "metric")
}

.isWholeNumber <- function(x) {
    is.numeric(x) && length(x) == 1L && !is.na(x) && is.finite(x) &&
        x == round(x)
}

## A sparse matrix whose slots contradict each other (pointers out of
## order, row indices out of range or repeated) crashes the Matrix code
## that reads it: its own validity check names the problem first.
.checkSparse <- function(m, arg) {
    problem <- tryCatch({
        methods::validObject(m, complete = TRUE)
        NULL
    }, error = conditionMessage)
    if (!is.null(problem)) {
        stop(sprintf("'%s' is not a valid sparse matrix: %s", arg, problem),
             call. = FALSE)
    }
    invisible(m)
}

## A graph of n nodes with k edges each must fit in a data frame, whose
## rows R counts in int: refused before any search.
.checkEdgeCount <- function(n, k) {
    edges <- as.double(n) * k
    if (edges > .Machine$integer.max) {
        stop(sprintf(paste("'k' = %d on %d nodes gives %.0f edges, more",
                           "than a data frame holds (%d rows): lower 'k',",
                           "or use knnSearch() for the n x k neighbour",
                           "matrices (long vectors), knnSearch(filepath =",
                           "\"nn.h5\") to write them to an HDF5 file, or",
                           "split the nodes with knnSearch(x, query =",
                           "...)"),
                     k, n, edges, .Machine$integer.max), call. = FALSE)
    }
    invisible(edges)
}

.checkK <- function(k, available) {
    if (!.isWholeNumber(k) || k < 1 || k > available) {
        stop(sprintf(paste("'k' must be a whole number from 1 to %d",
                           "(the number of candidate nodes)"), available),
             call. = FALSE)
    }
    as.integer(k)
}

## The most threads a search may ask for: OpenMP would try to start every
## thread asked for, and a million of them exhaust the process (R crashed).
.maxThreads <- 1024L

.checkThreads <- function(threads) {
    if (is.null(threads)) threads <- getOption("knngpu.threads", 0L)
    if (!.isWholeNumber(threads) || threads < 0 || threads > .maxThreads) {
        stop(sprintf(paste("'threads' must be NULL or a whole number from 1",
                           "to %d (0 or NULL: all cores)"), .maxThreads),
             call. = FALSE)
    }
    as.integer(threads)
}

## 'precision' as one choice (the verbs' default, the whole vector of
## choices, is "auto"); with the backend known, also a rung that backend
## has (.checkRung).
.checkPrecision <- function(precision, backend = NULL) {
    if (identical(precision, .precisions)) precision <- "auto"
    precision <- .checkChoice(precision, .precisions, "precision")
    if (!is.null(backend)) .checkRung(precision, backend)
    precision
}

## A checked 'precision' that the backend has: TF32 and split TF32 are the
## GPU's tensor-core arithmetic. Returns it.
.checkRung <- function(precision, backend) {
    lacks <- list(cpu = c("tf32", "tf32x3"), gpu = character())
    if (precision %in% lacks[[backend]]) {
        has <- setdiff(.precisions[-1L], lacks[[backend]])
        stop(sprintf(paste("'precision = \"%s\"' is not a rung of the %s;",
                           "it has %s (or \"auto\")"), precision,
                     toupper(backend),
                     paste0('"', has, '"', collapse = ", ")), call. = FALSE)
    }
    precision
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

## The engine refused the nodes (non-finite values, or nodes the metric
## cannot use; `why` is its reason): names the offending nodes of ref, then
## of query. Non-finite values are reported first, whatever the engine met
## first, so the CPU and the GPU give the same message.
.stopBadNodes <- function(why, ref, query, metric) {
    for (nodes in list(ref, query)) .stopNonFinite(nodes)
    for (nodes in list(ref, query)) .stopDegenerate(nodes, metric)
    stop("the engine refused nodes that a second look did not: ", why,
         call. = FALSE)
}

## Stops naming the nodes of `nodes` (a result of .asNodes(), or NULL)
## that hold NA, NaN or Inf.
.stopNonFinite <- function(nodes) {
    if (is.null(nodes)) return(invisible(NULL))
    bad <- .Call(C_knn_nonfinite, nodes$values, 5L)
    count <- attr(bad, "count")
    if (count == 0L) return(invisible(NULL))
    stop(sprintf("'%s' has NA, NaN or Inf values in %s: %s", nodes$arg,
                 nodes$what, .nameNodes(nodes$labels[bad], count)),
         call. = FALSE)
}

## Stops naming the nodes the metric cannot use: constant nodes for
## correlations, all-zero nodes for cosine.
.stopDegenerate <- function(nodes, metric) {
    if (is.null(nodes)) return(invisible(NULL))
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

## What R_CheckUserInterrupt() does when the user pressed Ctrl-C: signal
## the "interrupt" condition (tryCatch(interrupt = ) sees it), then return
## to the top level. The engine has released its memory by now.
.signalInterrupt <- function(condition = NULL) {
    if (!inherits(condition, "interrupt")) {
        condition <- structure(list(message = "interrupted by the user",
                                    call = NULL),
                               class = c("interrupt", "condition"))
    }
    signalCondition(condition)
    invokeRestart("abort")
}
