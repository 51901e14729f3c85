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
    .checkChoice(metric, .metricNames(), "metric")
}

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

## The matrix inside the supported containers, with samples in columns;
## with use.dimred, the reduced dimensions of a SingleCellExperiment's
## cells, cells in rows, named by the cells.
.extractMatrix <- function(x, assay, arg, use.dimred = NULL) {
    if (!is.null(use.dimred)) return(.reducedDims(x, use.dimred, arg))
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

## Node labels: the row (or column) names, else 1-based numbers. Names
## that igraph would refuse as vertex names (NA, empty, repeated) are made
## unique with a message: NA and empty names become the node's number,
## then make.unique() appends ".1", ".2", ... to repeats.
.reducedDims <- function(x, use.dimred, arg) {
    if (!methods::is(x, "SingleCellExperiment")) {
        stop(sprintf("'use.dimred' needs '%s' to be a SingleCellExperiment",
                     arg), call. = FALSE)
    }
    available <- SingleCellExperiment::reducedDimNames(x)
    known <- if (is.character(use.dimred)) use.dimred %in% available
        else .isWholeNumber(use.dimred) && use.dimred >= 1 &&
            use.dimred <= length(available)
    if (length(use.dimred) != 1L || !isTRUE(known)) {
        stop(sprintf("'use.dimred' must name one of the reducedDims of '%s':",
                     arg), " ", paste0('"', available, '"', collapse = ", "),
             call. = FALSE)
    }
    m <- SingleCellExperiment::reducedDim(x, use.dimred)
    if (is.null(rownames(m))) rownames(m) <- colnames(x)
    m
}

.nodeLabels <- function(m, by, arg) {
    labels <- if (by == "rows") rownames(m) else colnames(m)
    if (is.null(labels)) {
        return(seq_len(if (by == "rows") nrow(m) else ncol(m)))
    }
    missing <- is.na(labels) | !nzchar(labels)
    repeated <- duplicated(labels) & !missing
    if (!any(missing | repeated)) return(labels)
    bad <- which(missing | labels %in% labels[repeated])
    labels[missing] <- as.character(which(missing))
    fixed <- make.unique(labels)
    message(sprintf(paste("knngpu: '%s' has %d NA, empty or repeated %s",
                          "names (%s); using %s instead"), arg, length(bad),
                    if (by == "rows") "row" else "column",
                    .nameNodes(bad), .nameNodes(fixed[bad])))
    fixed
}

## Converts x to what the engine takes: a double matrix with one column per
## node (features x nodes), plus the node labels and the argument's name
## for messages. Non-finite values and nodes the metric cannot use are left
## to the engine, which finds them as it reads the values anyway
## (.stopBadNodes names them).
.asNodes <- function(x, by, assay = 1L, arg = "x", use.dimred = NULL) {
    if (!is.null(use.dimred) && by != "rows") {
        stop("'by' must be \"rows\" with 'use.dimred': the cells are the ",
             "rows of reducedDim()", call. = FALSE)
    }
    m <- .extractMatrix(x, assay, arg, use.dimred)
    if (!is.matrix(m) || !is.numeric(m)) {
        stop(sprintf(paste("'%s' must be a numeric matrix, a data.frame of",
                           "numeric columns, a SummarizedExperiment or an",
                           "ExpressionSet"), arg), call. = FALSE)
    }
    labels <- .nodeLabels(m, by, arg)
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
