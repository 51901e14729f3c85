#' knngpu as a BiocNeighbors backend: BNPARAM = KnngpuParam()
#'
#' A \code{BiocNeighborParam} for the tools that find neighbours through
#' BiocNeighbors (bluster's \code{makeKNNGraph()}, \code{makeSNNGraph()},
#' \code{clusterRows(x, NNGraphParam(BNPARAM = ))}, \code{DbscanParam()}
#' and \code{neighborPurity()}, scran's \code{buildSNNGraph()}, scater's
#' \code{runUMAP()}, batchelor): they then run knngpu's exact search, on
#' the GPU where there is one.
#'
#' @param metric \code{"euclidean"}, \code{"manhattan"} or \code{"cosine"},
#'   the distances BiocNeighbors defines.
#' @param distance The same choice in BiocNeighbors' spelling,
#'   \code{"Euclidean"}, \code{"Manhattan"} or \code{"Cosine"} (what
#'   \code{ExhaustiveParam(distance = )} takes and \code{bndistance()}
#'   gives); when set, it is used instead of \code{metric}.
#' @inheritParams knnSearch
#' @param use,min.shared As for \code{\link{knnSearch}}: with
#'   \code{use = "pairwise.complete.obs"} (\code{metric = "cosine"}
#'   only), points with missing values are compared over the coordinates
#'   both have; a point with fewer than k partners has \code{NA} in its
#'   last places.
#'
#' @return A \code{KnngpuParam} object, a subclass of BiocNeighbors'
#'   \code{BiocNeighborParam}. \code{buildIndex(X, BNPARAM = KnngpuParam())}
#'   gives a \code{KnngpuIndex} (a \code{BiocNeighborIndex} holding the
#'   points in the engine's layout), which the searches take in place of
#'   \code{X} (or as \code{BNINDEX}) to search it again without
#'   converting it.
#'
#' @details Both interfaces of BiocNeighbors are served, chosen when it is
#'   loaded by its major version:
#'   \itemize{
#'     \item 2.x (Bioconductor 3.20 on, Debian 13): \code{findKNN()},
#'     \code{queryKNN()}, \code{findDistance()}, \code{queryDistance()},
#'     \code{findNeighbors()}, \code{queryNeighbors()} and
#'     \code{buildIndex()} on a matrix (or anything \code{knnSearch()}
#'     takes) or on a \code{KnngpuIndex}. Honoured: \code{get.index} and
#'     \code{get.distance} (\code{TRUE}, \code{FALSE} or
#'     \code{"transposed"}, k-by-n), \code{k} as an \code{AsIs} vector (a
#'     number of neighbours per point; lists out), \code{subset},
#'     \code{transposed} (points in columns; for queries, both \code{X}
#'     and \code{query}), \code{num.threads} (CPU threads, unless the
#'     parameters set \code{threads}).
#'     \item 1.x (Bioconductor up to 3.19, Debian 12): the same searches
#'     but the distances-only ones, dispatching on \code{BNINDEX} and
#'     \code{BNPARAM}, with \code{last} (the last columns),
#'     \code{raw.index} and \code{warn.ties} (knngpu neither reorders
#'     points nor varies its ties, so both change nothing), and
#'     \code{transposed} for the query only, as 1.x defines them. Its
#'     \code{findNeighbors()} counts each point among its own neighbours,
#'     as 1.x's backends do.
#'   }
#'   On both, \code{BPPARAM} splits the points searched into blocks that
#'   BiocParallel workers search, with the same result as one search (for
#'   \code{device = "gpu"} take workers started fresh, such as
#'   \code{SnowParam()}: a forked worker of \code{MulticoreParam()} cannot
#'   use the CUDA its parent started, and says so), and a \code{k} larger
#'   than the points there are is capped with a warning, as every
#'   BiocNeighbors backend does.
#'
#'   Results equal \code{ExhaustiveParam()}'s: Euclidean and Manhattan
#'   distances as they are; for \code{"Cosine"} BiocNeighbors reports the
#'   Euclidean distance of the rows scaled to unit length,
#'   \eqn{\sqrt{2 (1 - \cos)}}, which knngpu computes from its exact cosine.
#'   Ties: knngpu orders neighbours at equal reported distance by the
#'   smaller index; BiocNeighbors' order of exact ties is its own (and its
#'   distances can differ in the last bits). Range searches
#'   (\code{findNeighbors()}, \code{queryNeighbors()}) are exact too: they
#'   grow an exact kNN search until each point's last neighbour lies past
#'   its \code{threshold}, and keep every point at a distance up to the
#'   threshold, one exactly at it included; neighbours come closest first.
#'
#'   The class and its methods are made when BiocNeighbors is loaded (it is
#'   a suggested package), in whichever order the packages load: a session
#'   that never asks for it does not pay its load, about 190 MB. Where they
#'   cannot be made (a BiocNeighbors whose interface this knngpu does not
#'   know), a message says why, none of them is left behind, and knngpu's
#'   own functions work as before.
#'
#' @seealso \code{\link{knnSearch}}, which this calls.
#' @examples
#' if (requireNamespace("BiocNeighbors", quietly = TRUE)) {
#'     set.seed(1)
#'     pcs <- matrix(rnorm(500 * 10), 500)
#'     nn <- BiocNeighbors::findKNN(pcs, k = 5, BNPARAM = KnngpuParam())
#'     nn$index[1:3, ]
#'     q <- BiocNeighbors::queryKNN(pcs, pcs[1:2, ] + 0.1, k = 3,
#'                                  BNPARAM = KnngpuParam("manhattan"))
#'     q$distance
#'     near <- BiocNeighbors::findNeighbors(pcs, threshold = 3,
#'         BNPARAM = KnngpuParam(distance = "Euclidean"))
#'     lengths(near$index)[1:5]
#'     if (requireNamespace("bluster", quietly = TRUE)) {
#'         g <- bluster::makeSNNGraph(pcs, k = 10, BNPARAM = KnngpuParam())
#'         igraph::vcount(g)
#'     }
#' }
#' @export
KnngpuParam <- function(metric = c("euclidean", "manhattan", "cosine"),
                        device = c("auto", "cpu", "gpu"), threads = NULL,
                        devices = NULL,
                        precision = c("auto", "tf32", "fp32", "fp64",
                                      "tf32x3"),
                        distance = NULL,
                        use = c("everything", "pairwise.complete.obs"),
                        min.shared = 4L) {
    metric <- if (is.null(distance)) {
        .checkChoice(metric[1L], names(.bnDistances), "metric")
    } else {
        .bnMetric(.checkChoice(distance, .bnDistances, "distance"))
    }
    use <- .checkUse(use, metric, min.shared)
    device <- .checkChoice(device[1L], c("auto", "cpu", "gpu"), "device")
    threads <- .checkThreads(threads)
    devices <- .checkDeviceIds(devices)
    precision <- .checkPrecision(precision,
                                 if (device != "auto") device)
    if (!requireNamespace("BiocNeighbors", quietly = TRUE)) {
        stop("KnngpuParam() needs the BiocNeighbors package", call. = FALSE)
    }
    if (!.registerBiocNeighbors()) {
        stop("KnngpuParam() is not available: ", .state$bnProblem,
             call. = FALSE)
    }
    methods::new(.bnClass("KnngpuParam"), distance = .bnDistances[[metric]],
                 device = device, threads = threads,
                 devices = as.integer(devices), precision = precision,
                 use = use$use, min.shared = use$min.shared)
}

## BiocNeighbors' distance names of the metrics it shares with knngpu.
.bnDistances <- c(euclidean = "Euclidean", manhattan = "Manhattan",
                  cosine = "Cosine")

## The metric knngpu computes for a BiocNeighbors distance name.
.bnMetric <- function(distance) names(.bnDistances)[.bnDistances == distance]

## Where the classes and methods live: BiocNeighbors is only suggested, so
## they are made when it loads (.registerBiocNeighbors, hooked in zzz.R),
## in this environment of the namespace, under the package's name.
.bnEnv <- new.env()
assign(".packageName", "knngpu", envir = .bnEnv)

.bnClass <- function(name) methods::getClass(name, where = .bnEnv)

.bnGeneric <- function(name) {
    methods::getGeneric(name, package = "BiocNeighbors")
}

## The methods of each major version of BiocNeighbors: the function that
## sets them (BiocNeighbors1.R, BiocNeighbors2.R).
.bnInterfaces <- list(`1` = function(set) .bnMethods1(set),
                      `2` = function(set) .bnMethods2(set))

## Makes KnngpuParam, KnngpuIndex and their methods for the loaded
## BiocNeighbors' generics, once. Returns TRUE when they exist; FALSE
## after a failure, which it reports in a message (kept in
## .state$bnProblem) having removed whatever it had made, so no half of a
## backend is left to dispatch to. Arguments: the load hook's, unused.
.registerBiocNeighbors <- function(...) {
    if (isTRUE(.state$bnRegistered)) return(TRUE)
    made <- list()
    set <- function(name, signature, fun) {
        methods::setMethod(.bnGeneric(name), signature, fun, where = .bnEnv)
        made[[length(made) + 1L]] <<- list(name, signature)
    }
    version <- as.character(getNamespaceVersion("BiocNeighbors"))
    outcome <- tryCatch({
        interface <- .bnInterfaces[[sub("\\..*", "", version)]]
        if (is.null(interface)) {
            stop("its major version is not one knngpu serves (1.x, 2.x)",
                 call. = FALSE)
        }
        .bnClasses()
        interface(set)
        TRUE
    }, error = function(e) {
        for (m in made) {
            try(methods::removeMethod(.bnGeneric(m[[1L]]), m[[2L]],
                                      where = .bnEnv), silent = TRUE)
        }
        try(methods::removeMethod("show", "KnngpuParam", where = .bnEnv),
            silent = TRUE)
        for (name in c("KnngpuIndex", "KnngpuParam")) {
            if (methods::isClass(name, where = .bnEnv)) {
                methods::removeClass(name, where = .bnEnv)
            }
        }
        .state$bnProblem <- sprintf(
            "knngpu could not register KnngpuParam with BiocNeighbors %s: %s",
            version, conditionMessage(e))
        message(.state$bnProblem)
        FALSE
    })
    .state$bnRegistered <- outcome
    outcome
}

## KnngpuParam and KnngpuIndex. The index holds the points in the engine's
## layout (features x points) in `data`, their names in `NAMES` and the
## parameters; BiocNeighbors 1.x's BiocNeighborIndex has the first two
## slots (and `distance`) already, 2.x's has none.
.bnClasses <- function() {
    methods::setClass("KnngpuParam", contains = "BiocNeighborParam",
                      slots = c(device = "character", threads = "integer",
                                devices = "integer", precision = "character",
                                use = "character", min.shared = "integer"),
                      where = .bnEnv)
    own <- c(data = "matrix", NAMES = "ANY", distance = "character")
    inherited <- methods::slotNames(methods::getClass(
        "BiocNeighborIndex", where = asNamespace("BiocNeighbors")))
    methods::setClass("KnngpuIndex", contains = "BiocNeighborIndex",
                      slots = c(own[setdiff(names(own), inherited)],
                                param = "KnngpuParam"),
                      where = .bnEnv)
    methods::setMethod("show", "KnngpuParam", function(object) {
        cat(sprintf("class: KnngpuParam\ndistance: %s\ndevice: %s\n",
                    object@distance, object@device))
    }, where = .bnEnv)
}

## A KnngpuIndex of X (points in rows, or in columns when transposed);
## `...` takes the search's arguments, passed on by its method.
.bnBuild <- function(X, BNPARAM, transposed = FALSE, ...) {
    transposed <- .checkFlag(transposed, "transposed")
    nodes <- .asNodes(X, if (transposed) "columns" else "rows", arg = "X")
    names <- if (is.character(nodes$labels)) nodes$labels else NULL
    methods::new(.bnClass("KnngpuIndex"), data = nodes$values, NAMES = names,
                 distance = BNPARAM@distance, param = BNPARAM)
}

## The index as a node source (.layoutSource()) for .searchBlocks().
.bnSource <- function(index) {
    labels <- index@NAMES
    if (is.null(labels)) labels <- seq_len(ncol(index@data))
    .layoutSource(list(values = index@data, labels = labels, what = "rows",
                       arg = "X"))
}

## The query of a search of `index` as a node source, its points in rows
## (or columns when transposed), with the index's dimensions.
.bnQuerySource <- function(index, query, transposed) {
    transposed <- .checkFlag(transposed, "transposed")
    q <- .nodeSource(query, if (transposed) "columns" else "rows",
                     arg = "query")
    if (q$p != nrow(index@data)) {
        stop(sprintf(paste("'query' has %d dimensions but 'X' has %d; both",
                           "need the same"), q$p, nrow(index@data)),
             call. = FALSE)
    }
    q
}

## Rows `subset` (numbers, names or logicals, as BiocNeighbors takes it) of
## n rows named `names`, as row numbers; all rows when NULL.
.bnRows <- function(subset, n, names) {
    if (is.null(subset)) return(seq_len(n))
    rows <- seq_len(n)
    names(rows) <- names
    picked <- tryCatch(rows[subset], error = function(e) NA_integer_)
    wrong <- anyNA(picked) || !length(picked) ||
        (is.numeric(subset) && any(subset < 1 | subset != round(subset))) ||
        (is.logical(subset) && length(subset) != n)
    if (wrong) {
        stop("'subset' must pick existing rows (numbers from 1 to ", n,
             ", names or logicals)", call. = FALSE)
    }
    unname(picked)
}

## Neighbours to find for each of `rows` points: k, one number or (an AsIs
## vector, BiocNeighbors 2.x) one per point, capped with BiocNeighbors'
## warning at the `available` candidates.
.bnK <- function(k, rows, available, self) {
    variable <- inherits(k, "AsIs")
    whole <- is.numeric(k) && !anyNA(k) && all(is.finite(k)) &&
        all(k >= 1) && all(k == round(k))
    if (!whole || (!variable && length(k) != 1L)) {
        stop("'k' must be a whole number of at least 1, or (AsIs) one per ",
             "point", call. = FALSE)
    }
    if (variable && length(k) != length(rows)) {
        stop(sprintf(paste("'k' (AsIs) must have one number per point",
                           "searched (%d), not %d"), length(rows),
                     length(k)), call. = FALSE)
    }
    if (available < 1L) {
        stop("'X' needs at least 2 points to search", call. = FALSE)
    }
    if (any(k > available)) {
        warning(if (self) "'k' capped at the number of observations minus 1"
                else "'k' capped at the number of observations", call. = FALSE)
        k <- pmin(k, available)
    }
    structure(as.integer(k), variable = variable)
}

## CPU threads: the parameters' own when set, else the search's
## num.threads (BiocNeighbors 2.x).
.bnThreads <- function(param, num.threads) {
    if (param@threads > 0L || is.null(num.threads)) return(param@threads)
    if (!.isWholeNumber(num.threads) || num.threads < 1) {
        stop("'num.threads' must be a whole number of at least 1",
             call. = FALSE)
    }
    .checkThreads(num.threads)
}

## The k nearest neighbours (k from .bnK(), its largest for every point)
## of points `rows` of the query source (of the index itself when NULL):
## index and distance matrices, distances as BiocNeighbors defines them.
.bnSearch <- function(index, query, rows, k, threads, BPPARAM) {
    p <- index@param
    ref <- .bnSource(index)
    ## Pairwise-complete where asked for and the points hold missing
    ## values (.searchUse()).
    way <- .searchUse(list(use = p@use, min.shared = p@min.shared), ref,
                      query)
    search <- .engineRunner(.bnMetric(index@distance), p@device, threads,
                            if (length(p@devices)) p@devices else NULL,
                            p@precision, way, p@min.shared)
    res <- .searchBlocks(ref, query, rows, max(k), search,
                         .checkBPPARAM(BPPARAM))
    d <- res$distance
    ## BiocNeighbors' cosine distance: Euclidean between unit rows.
    if (index@distance == "Cosine") d[] <- sqrt(2 * pmax(d, 0))
    list(index = res$index, distance = d)
}

## Every point within `threshold` (one number, or one per point) of points
## `rows` of the query (of the index itself when NULL), closest first:
## lists index and distance. An exact kNN search, its k grown until each
## point's last neighbour lies past its threshold.
.bnRange <- function(index, query, rows, threshold, threads, BPPARAM) {
    if (!is.numeric(threshold) || anyNA(threshold) || any(threshold < 0) ||
        !length(threshold) %in% c(1L, length(rows))) {
        stop("'threshold' must be a distance of at least 0, one or one per ",
             "point", call. = FALSE)
    }
    threshold <- rep_len(as.double(threshold), length(rows))
    available <- ncol(index@data) - is.null(query)
    out <- list(index = vector("list", length(rows)),
                distance = vector("list", length(rows)))
    if (available < 1L) {
        out$index[] <- list(integer())
        out$distance[] <- list(double())
        return(out)
    }
    todo <- seq_along(rows)
    k <- min(available, 16L)
    while (length(todo)) {
        res <- .bnSearch(index, query, rows[todo], k, threads, BPPARAM)
        within <- res$distance <= threshold[todo]
        more <- within[, k] & k < available
        for (i in which(!more)) {
            keep <- within[i, ]
            out$index[[todo[i]]] <- res$index[i, keep]
            out$distance[[todo[i]]] <- res$distance[i, keep]
        }
        todo <- todo[more]
        k <- min(available, 4L * k)
    }
    out
}
