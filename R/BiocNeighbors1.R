## KnngpuParam's methods for BiocNeighbors 1.x (Bioconductor up to 3.19),
## whose generics dispatch on (BNINDEX, BNPARAM) and whose searches return
## n-by-k matrices, of which `last` keeps the last columns. Set by
## .registerBiocNeighbors() (KnngpuParam.R) through `set(name, signature,
## fun)`.

.bnMethods1 <- function(set) {
    set("buildIndex", c(BNPARAM = "KnngpuParam"),
        function(X, ..., BNPARAM) .bnBuild(X, BNPARAM, ...))
    set("findKNN", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, k, ..., BNINDEX, BNPARAM) {
            .bnFind1(.bnBuild(X, BNPARAM, ...), k, ...)
        })
    set("queryKNN", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, query, k, ..., BNINDEX, BNPARAM) {
            .bnQuery1(.bnBuild(X, BNPARAM), query, k, ...)
        })
    set("findNeighbors", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, threshold, ..., BNINDEX, BNPARAM) {
            .bnFindRange1(.bnBuild(X, BNPARAM, ...), threshold, ...)
        })
    set("queryNeighbors", c(BNINDEX = "missing", BNPARAM = "KnngpuParam"),
        function(X, query, threshold, ..., BNINDEX, BNPARAM) {
            .bnQueryRange1(.bnBuild(X, BNPARAM), query, threshold, ...)
        })
    for (param in c("missing", "KnngpuParam")) {
        on <- c(BNINDEX = "KnngpuIndex", BNPARAM = param)
        set("findKNN", on, function(X, k, ..., BNINDEX, BNPARAM) {
            .bnFind1(BNINDEX, k, ...)
        })
        set("queryKNN", on, function(X, query, k, ..., BNINDEX, BNPARAM) {
            .bnQuery1(BNINDEX, query, k, ...)
        })
        set("findNeighbors", on,
            function(X, threshold, ..., BNINDEX, BNPARAM) {
                .bnFindRange1(BNINDEX, threshold, ...)
            })
        set("queryNeighbors", on,
            function(X, query, threshold, ..., BNINDEX, BNPARAM) {
                .bnQueryRange1(BNINDEX, query, threshold, ...)
            })
    }
}

## `transposed` is taken here for findKNN's index (points in columns).
.bnFind1 <- function(index, k, get.index = TRUE, get.distance = TRUE,
                     last = k, BPPARAM = NULL, subset = NULL,
                     transposed = FALSE, warn.ties = TRUE,
                     raw.index = FALSE, ...) {
    rows <- .bnRows(subset, ncol(index@data), index@NAMES)
    k <- .bnK(k, rows, ncol(index@data) - 1L, self = TRUE)
    .bnCheckArgs1(last, get.index, get.distance)
    res <- .bnSearch(index, NULL, rows, k, NULL, BPPARAM)
    .bnResult1(res, k, last, get.index, get.distance)
}

.bnQuery1 <- function(index, query, k, get.index = TRUE, get.distance = TRUE,
                      last = k, BPPARAM = NULL, transposed = FALSE,
                      subset = NULL, warn.ties = TRUE, raw.index = FALSE,
                      ...) {
    q <- .bnQuerySource(index, query, transposed)
    rows <- .bnRows(subset, q$n, if (is.character(q$labels)) q$labels)
    k <- .bnK(k, rows, ncol(index@data), self = FALSE)
    .bnCheckArgs1(last, get.index, get.distance)
    res <- .bnSearch(index, q, rows, k, NULL, BPPARAM)
    .bnResult1(res, k, last, get.index, get.distance)
}

## 1.x counts each point among its own neighbours, at distance 0.
.bnFindRange1 <- function(index, threshold, get.index = TRUE,
                          get.distance = TRUE, BPPARAM = NULL,
                          subset = NULL, transposed = FALSE,
                          raw.index = FALSE, ...) {
    .bnCheckArgs1(1L, get.index, get.distance)
    rows <- .bnRows(subset, ncol(index@data), index@NAMES)
    res <- .bnRange(index, NULL, rows, threshold, NULL, BPPARAM)
    res$index <- Map(c, rows, res$index)
    res$distance <- lapply(res$distance, function(d) c(0, d))
    res[c(get.index, get.distance)]
}

.bnQueryRange1 <- function(index, query, threshold, get.index = TRUE,
                           get.distance = TRUE, BPPARAM = NULL,
                           transposed = FALSE, subset = NULL,
                           raw.index = FALSE, ...) {
    q <- .bnQuerySource(index, query, transposed)
    .bnCheckArgs1(1L, get.index, get.distance)
    rows <- .bnRows(subset, q$n, if (is.character(q$labels)) q$labels)
    res <- .bnRange(index, q, rows, threshold, NULL, BPPARAM)
    res[c(get.index, get.distance)]
}

## Checks a search's 1.x arguments before anything runs.
.bnCheckArgs1 <- function(last, get.index, get.distance) {
    .checkFlag(get.index, "get.index")
    .checkFlag(get.distance, "get.distance")
    if (!.isWholeNumber(last) || last < 1) {
        stop("'last' must be a whole number from 1 to 'k'", call. = FALSE)
    }
}

## 1.x's result: the last `last` columns of what was asked for.
.bnResult1 <- function(res, k, last, get.index, get.distance) {
    cols <- seq.int(k - min(last, k) + 1L, k)
    res$index <- res$index[, cols, drop = FALSE]
    res$distance <- res$distance[, cols, drop = FALSE]
    res[c(get.index, get.distance)]
}
