#' knngpu as a BiocNeighbors backend: BNPARAM = KnngpuParam()
#'
#' A \code{BiocNeighborParam} for the tools that find neighbours through
#' BiocNeighbors (bluster's \code{makeKNNGraph()}, \code{makeSNNGraph()} and
#' \code{clusterRows(x, NNGraphParam(BNPARAM = ))}, scran's
#' \code{buildSNNGraph()}, scater's \code{runUMAP()}, batchelor): they then
#' run knngpu's exact search, on the GPU where there is one.
#'
#' @param metric \code{"euclidean"}, \code{"manhattan"} or \code{"cosine"},
#'   the distances BiocNeighbors defines (\code{bndistance()} gives
#'   \code{"Euclidean"}, \code{"Manhattan"} or \code{"Cosine"}).
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
#'   points in the engine's layout), which \code{findKNN()} and
#'   \code{queryKNN()} take as \code{BNINDEX} to search it again without
#'   converting it.
#'
#' @details Supported is the BiocNeighbors 1.x interface (Bioconductor up to
#'   3.19, Debian 12's 1.16): \code{findKNN()}, \code{queryKNN()} and
#'   \code{buildIndex()} dispatch on \code{BNINDEX} and \code{BNPARAM}, and
#'   the results are \code{list(index, distance)} of n-by-k matrices. Their
#'   arguments are honoured: \code{get.index}, \code{get.distance},
#'   \code{last} (the last columns), \code{subset} (rows to search for, by
#'   number, name or logical), \code{transposed} (points in columns),
#'   \code{BPPARAM} (blocks of rows searched by BiocParallel workers, with
#'   the same result as one search; for \code{device = "gpu"} take workers
#'   started fresh, such as \code{SnowParam()}: a forked worker of
#'   \code{MulticoreParam()} cannot use the CUDA its parent started, and
#'   says so), \code{raw.index} (knngpu does not
#'   reorder the points, so raw and original indices are the same) and
#'   \code{warn.ties} (knngpu breaks ties by the smaller index, always the
#'   same way, so it never warns). BiocNeighbors 2.x (Bioconductor 3.20 on)
#'   dispatches \code{buildIndex()} alone and searches through C++
#'   prebuilt pointers; serving it would take \code{buildIndex()} and
#'   \code{findKNN()}/\code{queryKNN()} methods for its
#'   \code{BiocNeighborPrebuilt} class, which that release defines, not
#'   written here.
#'
#'   Results equal \code{ExhaustiveParam()}'s: Euclidean and Manhattan
#'   distances as they are; for \code{"Cosine"} BiocNeighbors reports the
#'   Euclidean distance of the rows scaled to unit length,
#'   \eqn{\sqrt{2 (1 - \cos)}}, which knngpu computes from its exact cosine.
#'   Ties: knngpu orders neighbours at equal reported distance by the
#'   smaller index; BiocNeighbors' order of exact ties is its own (and its
#'   distances can differ in the last bits).
#'
#'   The class and its methods are made when BiocNeighbors is loaded (it is
#'   a suggested package): a session that never asks for it does not pay
#'   its load, about 190 MB.
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
                        use = c("everything", "pairwise.complete.obs"),
                        min.shared = 4L) {
    metric <- .checkChoice(metric[1L], names(.bnDistances), "metric")
    use <- .checkUse(use, metric, min.shared)
    device <- .checkChoice(device[1L], c("auto", "cpu", "gpu"), "device")
    threads <- .checkThreads(threads)
    devices <- .checkDeviceIds(devices)
    precision <- .checkPrecision(precision,
                                 if (device != "auto") device)
    if (!requireNamespace("BiocNeighbors", quietly = TRUE)) {
        stop("KnngpuParam() needs the BiocNeighbors package", call. = FALSE)
    }
    .registerBiocNeighbors()
    methods::new(.bnClass("KnngpuParam"), distance = .bnDistances[[metric]],
                 device = device, threads = threads,
                 devices = as.integer(devices), precision = precision,
                 use = use$use, min.shared = use$min.shared)
}

## BiocNeighbors' distance names of the metrics it shares with knngpu.
.bnDistances <- c(euclidean = "Euclidean", manhattan = "Manhattan",
                  cosine = "Cosine")

## Where the classes and methods live: BiocNeighbors is only suggested, so
## they are made when it loads (.registerBiocNeighbors, hooked in zzz.R),
## in this environment of the namespace, under the package's name.
.bnEnv <- new.env()
assign(".packageName", "knngpu", envir = .bnEnv)

.bnClass <- function(name) methods::getClass(name, where = .bnEnv)

.bnGeneric <- function(name) {
    methods::getGeneric(name, package = "BiocNeighbors")
}

## Makes KnngpuParam, KnngpuIndex and their methods for BiocNeighbors'
## generics, once; called when BiocNeighbors is loaded (arguments: the
## hook's, unused).
.registerBiocNeighbors <- function(...) {
    if (methods::isClass("KnngpuIndex", where = .bnEnv)) {
        return(invisible(NULL))
    }
    methods::setClass("KnngpuParam", contains = "BiocNeighborParam",
                      slots = c(device = "character", threads = "integer",
                                devices = "integer", precision = "character",
                                use = "character", min.shared = "integer"),
                      where = .bnEnv)
    methods::setClass("KnngpuIndex", contains = "BiocNeighborIndex",
                      slots = c(param = "KnngpuParam"), where = .bnEnv)
    .bnMethods(.bnEnv)
    invisible(NULL)
}

.bnMethods <- function(where) {
    set <- function(name, signature, fun) {
        methods::setMethod(.bnGeneric(name), signature, fun, where = where)
    }
    set("buildIndex", c(BNPARAM = "KnngpuParam"),
        function(X, ..., BNPARAM) .bnBuild(X, BNPARAM, ...))
    set("findKNN", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, k, ..., BNINDEX, BNPARAM) {
            .bnFind(.bnBuild(X, BNPARAM, ...), k, ...)
        })
    for (param in c("missing", "KnngpuParam")) {
        set("findKNN", c(BNINDEX = "KnngpuIndex", BNPARAM = param),
            function(X, k, ..., BNINDEX, BNPARAM) .bnFind(BNINDEX, k, ...))
        set("queryKNN", c(BNINDEX = "KnngpuIndex", BNPARAM = param),
            function(X, query, k, ..., BNINDEX, BNPARAM) {
                .bnQuery(BNINDEX, query, k, ...)
            })
    }
    set("queryKNN", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, query, k, ..., BNINDEX, BNPARAM) {
            .bnQuery(.bnBuild(X, BNPARAM), query, k, ...)
        })
    methods::setMethod("show", "KnngpuParam", function(object) {
        cat(sprintf("class: KnngpuParam\ndistance: %s\ndevice: %s\n",
                    object@distance, object@device))
    }, where = where)
}

## The metric knngpu computes for a BiocNeighbors distance name.
.bnMetric <- function(distance) names(.bnDistances)[.bnDistances == distance]

## A KnngpuIndex of X (points in rows, or in columns when transposed).
.bnBuild <- function(X, BNPARAM, transposed = FALSE, ...) {
    transposed <- .checkFlag(transposed, "transposed")
    nodes <- .asNodes(X, if (transposed) "columns" else "rows", arg = "X")
    names <- if (is.character(nodes$labels)) nodes$labels else NULL
    methods::new(.bnClass("KnngpuIndex"), data = nodes$values, NAMES = names,
                 distance = BNPARAM@distance, param = BNPARAM)
}

## The index as .asNodes() returns nodes, for the engine.
.bnNodes <- function(index) {
    labels <- index@NAMES
    if (is.null(labels)) labels <- seq_len(ncol(index@data))
    list(values = index@data, labels = labels, what = "rows", arg = "X")
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

.bnFind <- function(index, k, get.index = TRUE, get.distance = TRUE,
                    last = k, BPPARAM = NULL, subset = NULL,
                    warn.ties = TRUE, raw.index = FALSE, ...) {
    nodes <- .bnNodes(index)
    n <- ncol(nodes$values)
    if (n < 2L) stop("'X' needs at least 2 points to search", call. = FALSE)
    k <- .checkK(k, n - 1L)
    BPPARAM <- .bnCheckArgs(last, get.index, get.distance, BPPARAM)
    rows <- .bnRows(subset, n, index@NAMES)
    res <- .searchBlocks(.layoutSource(nodes), NULL, rows, k,
                         .bnRunner(index, NULL), BPPARAM)
    .bnResult(res, index@distance, k, last, get.index, get.distance)
}

.bnQuery <- function(index, query, k, get.index = TRUE, get.distance = TRUE,
                     last = k, BPPARAM = NULL, transposed = FALSE,
                     subset = NULL, warn.ties = TRUE, raw.index = FALSE,
                     ...) {
    nodes <- .bnNodes(index)
    transposed <- .checkFlag(transposed, "transposed")
    q <- .nodeSource(query, if (transposed) "columns" else "rows",
                     arg = "query")
    if (q$p != nrow(nodes$values)) {
        stop(sprintf(paste("'query' has %d dimensions but 'X' has %d; both",
                           "need the same"), q$p, nrow(nodes$values)),
             call. = FALSE)
    }
    k <- .checkK(k, ncol(nodes$values))
    BPPARAM <- .bnCheckArgs(last, get.index, get.distance, BPPARAM)
    rows <- .bnRows(subset, q$n, if (is.character(q$labels)) q$labels)
    res <- .searchBlocks(.layoutSource(nodes), q, rows, k,
                         .bnRunner(index, q), BPPARAM)
    .bnResult(res, index@distance, k, last, get.index, get.distance)
}

## The engine run for the index's parameters, against the query source q
## (NULL for a self search): pairwise-complete where asked for and the
## points hold missing values (.searchUse()).
.bnRunner <- function(index, q) {
    p <- index@param
    use <- list(use = p@use, min.shared = p@min.shared)
    way <- .searchUse(use, p@device, .layoutSource(.bnNodes(index)), q)
    .engineRunner(.bnMetric(index@distance), p@device, p@threads,
                  if (length(p@devices)) p@devices else NULL, p@precision,
                  way, p@min.shared)
}

## Checks a search's BiocNeighbors arguments before anything runs;
## returns BPPARAM as .checkBPPARAM() does.
.bnCheckArgs <- function(last, get.index, get.distance, BPPARAM) {
    .checkFlag(get.index, "get.index")
    .checkFlag(get.distance, "get.distance")
    if (!.isWholeNumber(last) || last < 1) {
        stop("'last' must be a whole number from 1 to 'k'", call. = FALSE)
    }
    .checkBPPARAM(BPPARAM)
}

## BiocNeighbors' result: the last `last` columns of what was asked for,
## distances as BiocNeighbors defines them.
.bnResult <- function(res, distance, k, last, get.index, get.distance) {
    cols <- seq.int(k - min(last, k) + 1L, k)
    out <- list()
    if (get.index) {
        out$index <- res$index[, cols, drop = FALSE]
    }
    if (get.distance) {
        d <- res$distance[, cols, drop = FALSE]
        ## BiocNeighbors' cosine distance: Euclidean between unit rows.
        if (distance == "Cosine") d[] <- sqrt(2 * d)
        out$distance <- d
    }
    out
}
