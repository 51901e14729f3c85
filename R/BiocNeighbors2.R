## KnngpuParam's methods for BiocNeighbors 2.x (Bioconductor 3.20 on),
## whose generics dispatch on (X, BNPARAM). Its own searches on a matrix
## build a C++ index through defineBuilder(); knngpu instead takes the
## searches on (matrix or anything else, KnngpuParam), building a
## KnngpuIndex, and on (KnngpuIndex, any parameters), so that its methods
## are always the closest: (ANY, KnngpuParam) alone would tie with
## BiocNeighbors' (matrix, ANY) ones. BiocNeighbors' own X = "missing"
## methods pass BNINDEX on as X. Set by .registerBiocNeighbors()
## (KnngpuParam.R) through `set(name, signature, fun)`.

.bnMethods2 <- function(set) {
    for (data in c("matrix", "ANY")) {
        on <- c(X = data, BNPARAM = "KnngpuParam")
        set("buildIndex", on, function(X, transposed = FALSE, ...,
                                       BNPARAM = NULL) {
            .bnBuild(X, BNPARAM, transposed)
        })
        set("findKNN", on, function(X, k, get.index = TRUE,
                                    get.distance = TRUE, num.threads = 1,
                                    subset = NULL, ..., BNPARAM = NULL) {
            .bnFind2(.bnBuild(X, BNPARAM, ...), k, get.index, get.distance,
                     num.threads, subset, ...)
        })
        set("queryKNN", on, function(X, query, k, get.index = TRUE,
                                     get.distance = TRUE, num.threads = 1,
                                     subset = NULL, transposed = FALSE, ...,
                                     BNPARAM = NULL) {
            .bnQuery2(.bnBuild(X, BNPARAM, transposed), query, k, get.index,
                      get.distance, num.threads, subset, transposed, ...)
        })
        set("findDistance", on, function(X, k, num.threads = 1,
                                         subset = NULL, ...,
                                         BNPARAM = NULL) {
            .bnFindDistance2(.bnBuild(X, BNPARAM, ...), k, num.threads,
                             subset, ...)
        })
        set("queryDistance", on, function(X, query, k, num.threads = 1,
                                          subset = NULL, transposed = FALSE,
                                          ..., BNPARAM = NULL) {
            .bnQueryDistance2(.bnBuild(X, BNPARAM, transposed), query, k,
                              num.threads, subset, transposed, ...)
        })
        set("findNeighbors", on, function(X, threshold, get.index = TRUE,
                                          get.distance = TRUE,
                                          num.threads = 1, subset = NULL,
                                          ..., BNPARAM = NULL) {
            .bnFindRange2(.bnBuild(X, BNPARAM, ...), threshold, get.index,
                          get.distance, num.threads, subset, ...)
        })
        set("queryNeighbors", on, function(X, query, threshold,
                                           get.index = TRUE,
                                           get.distance = TRUE,
                                           num.threads = 1, subset = NULL,
                                           transposed = FALSE, ...,
                                           BNPARAM = NULL) {
            .bnQueryRange2(.bnBuild(X, BNPARAM, transposed), query,
                           threshold, get.index, get.distance, num.threads,
                           subset, transposed, ...)
        })
    }
    for (param in c("ANY", "KnngpuParam")) {
        on <- c(X = "KnngpuIndex", BNPARAM = param)
        set("findKNN", on, function(X, k, get.index = TRUE,
                                    get.distance = TRUE, num.threads = 1,
                                    subset = NULL, ..., BNPARAM = NULL) {
            .bnFind2(X, k, get.index, get.distance, num.threads, subset, ...)
        })
        set("queryKNN", on, function(X, query, k, get.index = TRUE,
                                     get.distance = TRUE, num.threads = 1,
                                     subset = NULL, transposed = FALSE, ...,
                                     BNPARAM = NULL) {
            .bnQuery2(X, query, k, get.index, get.distance, num.threads,
                      subset, transposed, ...)
        })
        set("findDistance", on, function(X, k, num.threads = 1,
                                         subset = NULL, ...,
                                         BNPARAM = NULL) {
            .bnFindDistance2(X, k, num.threads, subset, ...)
        })
        set("queryDistance", on, function(X, query, k, num.threads = 1,
                                          subset = NULL, transposed = FALSE,
                                          ..., BNPARAM = NULL) {
            .bnQueryDistance2(X, query, k, num.threads, subset, transposed,
                              ...)
        })
        set("findNeighbors", on, function(X, threshold, get.index = TRUE,
                                          get.distance = TRUE,
                                          num.threads = 1, subset = NULL,
                                          ..., BNPARAM = NULL) {
            .bnFindRange2(X, threshold, get.index, get.distance,
                          num.threads, subset, ...)
        })
        set("queryNeighbors", on, function(X, query, threshold,
                                           get.index = TRUE,
                                           get.distance = TRUE,
                                           num.threads = 1, subset = NULL,
                                           transposed = FALSE, ...,
                                           BNPARAM = NULL) {
            .bnQueryRange2(X, query, threshold, get.index, get.distance,
                           num.threads, subset, transposed, ...)
        })
    }
}

## The searches on an index. `...` takes BPPARAM, and the arguments meant
## for building (transposed, for a search on a matrix), which are spent.
.bnFind2 <- function(index, k, get.index, get.distance, num.threads,
                     subset, ..., BPPARAM = NULL) {
    .bnCheckGet2(get.index, "get.index")
    .bnCheckGet2(get.distance, "get.distance")
    res <- .bnKnn2(index, NULL, k, num.threads, subset, BPPARAM)
    .bnResult2(res, get.index, get.distance)
}

.bnQuery2 <- function(index, query, k, get.index, get.distance, num.threads,
                      subset, transposed, ..., BPPARAM = NULL) {
    .bnCheckGet2(get.index, "get.index")
    .bnCheckGet2(get.distance, "get.distance")
    q <- .bnQuerySource(index, query, transposed)
    res <- .bnKnn2(index, q, k, num.threads, subset, BPPARAM)
    .bnResult2(res, get.index, get.distance)
}

## The distance to each point's k-th neighbour.
.bnFindDistance2 <- function(index, k, num.threads, subset, ...,
                             BPPARAM = NULL) {
    .bnLastDistance2(.bnKnn2(index, NULL, k, num.threads, subset, BPPARAM))
}

.bnQueryDistance2 <- function(index, query, k, num.threads, subset,
                              transposed, ..., BPPARAM = NULL) {
    q <- .bnQuerySource(index, query, transposed)
    .bnLastDistance2(.bnKnn2(index, q, k, num.threads, subset, BPPARAM))
}

.bnFindRange2 <- function(index, threshold, get.index, get.distance,
                          num.threads, subset, ..., BPPARAM = NULL) {
    .checkFlag(get.index, "get.index")
    .checkFlag(get.distance, "get.distance")
    rows <- .bnRows(subset, ncol(index@data), index@NAMES)
    res <- .bnRange(index, NULL, rows, threshold,
                    .bnThreads(index@param, num.threads), BPPARAM)
    .bnRangeResult2(res, get.index, get.distance)
}

.bnQueryRange2 <- function(index, query, threshold, get.index, get.distance,
                           num.threads, subset, transposed, ...,
                           BPPARAM = NULL) {
    .checkFlag(get.index, "get.index")
    .checkFlag(get.distance, "get.distance")
    q <- .bnQuerySource(index, query, transposed)
    rows <- .bnRows(subset, q$n, if (is.character(q$labels)) q$labels)
    res <- .bnRange(index, q, rows, threshold,
                    .bnThreads(index@param, num.threads), BPPARAM)
    .bnRangeResult2(res, get.index, get.distance)
}

## The kNN search of the index (query NULL) or of a query source, for the
## points `subset`: .bnSearch()'s result and k (from .bnK()).
.bnKnn2 <- function(index, query, k, num.threads, subset, BPPARAM) {
    n <- if (is.null(query)) ncol(index@data) else query$n
    names <- if (is.null(query)) index@NAMES
             else if (is.character(query$labels)) query$labels
    rows <- .bnRows(subset, n, names)
    k <- .bnK(k, rows, ncol(index@data) - is.null(query),
              self = is.null(query))
    res <- .bnSearch(index, query, rows, k,
                     .bnThreads(index@param, num.threads), BPPARAM)
    res$k <- k
    res
}

## get.index and get.distance: TRUE (or "normal"), FALSE or "transposed".
.bnCheckGet2 <- function(value, arg) {
    if (!(isTRUE(value) || isFALSE(value) ||
          identical(value, "transposed") || identical(value, "normal"))) {
        stop(sprintf("'%s' must be TRUE, FALSE or \"transposed\"", arg),
             call. = FALSE)
    }
}

## 2.x's result: for one k, n-by-k matrices (k-by-n when "transposed");
## for an AsIs k, lists of each point's first k.
.bnResult2 <- function(res, get.index, get.distance) {
    k <- res$k
    out <- list()
    for (field in c("index", "distance")) {
        get <- if (field == "index") get.index else get.distance
        if (isFALSE(get)) next
        m <- res[[field]]
        out[[field]] <- if (attr(k, "variable")) {
            lapply(seq_along(k), function(i) m[i, seq_len(k[i])])
        } else if (identical(get, "transposed")) {
            t(m)
        } else {
            m
        }
    }
    out
}

.bnLastDistance2 <- function(res) {
    k <- rep_len(res$k, nrow(res$distance))
    res$distance[cbind(seq_along(k), k)]
}

## 2.x's range result; with neither part asked for, the neighbour counts.
.bnRangeResult2 <- function(res, get.index, get.distance) {
    if (!get.index && !get.distance) return(lengths(res$index))
    res[c(get.index, get.distance)]
}
