#' Exact k-nearest-neighbour graph as an igraph-ready edge data frame
#'
#' Builds the exact kNN graph of the rows (genes, by default) or columns
#' (samples) of an expression matrix and returns its edges as a data.frame
#' that \code{igraph::graph_from_data_frame()} takes as it is.
#'
#' @inheritParams knnSearch
#' @param symmetrize \code{"none"} keeps one directed edge per node and
#'   neighbour. \code{"union"} keeps an undirected edge when either node
#'   chose the other, \code{"mutual"} only when both did; each pair then
#'   appears once, with \code{from} before \code{to} in node order. The
#'   metric is symmetric, so \code{weight} and \code{distance} are those of
#'   the pair; \code{rank} is the better (smaller) of the two directions'
#'   ranks.
#' @param snn \code{NULL}, or a shared-nearest-neighbour weighting as
#'   \code{bluster::makeSNNGraph()} defines it: \code{"rank"} (\eqn{k - r/2}
#'   with r the smallest sum of ranks of a shared neighbour), \code{"number"}
#'   (shared neighbours, each node counted in its own set) or
#'   \code{"jaccard"}. The result is then the undirected SNN graph with
#'   columns \code{from}, \code{to} and \code{weight}.
#'
#' @return A data.frame with one row per edge: \code{from}, \code{to} (node
#'   names from the row or column names, else 1-based integers),
#'   \code{weight} (a similarity: r for pearson, spearman and bicor, |r| for
#'   abspearson, the cosine similarity, and \eqn{1 / (1 + d)} for distance
#'   metrics), \code{distance} and \code{rank} (1 to k). Directed edges are
#'   grouped by \code{from} with ranks ascending; symmetrised and SNN edges
#'   are ordered by \code{from}, then \code{to}, in node order, so a node's
#'   edges appear both where it is \code{from} and where it is \code{to}.
#'   Attributes: \code{nodes} (a data.frame
#'   of every node, so isolated nodes survive
#'   \code{graph_from_data_frame(edges, vertices = attr(edges, "nodes"))};
#'   its column \code{name}, then the nodes' own annotation, which igraph
#'   makes vertex attributes: \code{rowData()} or \code{colData()} of a
#'   SummarizedExperiment, \code{fData()} or \code{pData()} of an
#'   ExpressionSet, columns of plain values),
#'   \code{metric}, \code{k}, \code{by}, \code{symmetrize}, \code{snn},
#'   \code{use}, \code{min.shared},
#'   \code{assay} or \code{reducedDim} (for a \code{SummarizedExperiment}:
#'   the assay or reduced dimensions searched),
#'   \code{backend} (\code{"cpu"} or \code{"gpu"}), \code{device} (its
#'   description, e.g. the GPU's name), \code{precision}, \code{elapsed}
#'   (seconds) and \code{timings} (the engine's phases in seconds, what
#'   \code{verbose = TRUE} prints).
#'
#' @details Neighbours, ties, bad input (non-finite values, degenerate
#'   nodes, NA or repeated names, thread counts) and interrupts are handled
#'   as \code{\link{knnSearch}} describes: ranks follow the reported
#'   distance, then the smaller node index, the k-th place included; node
#'   names are always unique, so the edges and \code{attr(edges, "nodes")}
#'   go into \code{igraph::graph_from_data_frame()} as they are.
#'
#' @seealso \code{\link{toIgraph}}, \code{\link{toAdjacency}},
#'   \code{\link{knnSearch}}.
#' @examples
#' set.seed(1)
#' expr <- matrix(rnorm(100 * 12), nrow = 100,
#'                dimnames = list(paste0("gene", 1:100), NULL))
#' edges <- knnGraph(expr, k = 5, metric = "pearson")
#' head(edges)
#' attr(edges, "device")
#' mutual <- knnGraph(expr, k = 5, symmetrize = "mutual")
#' snn <- knnGraph(expr, k = 5, snn = "rank")
#' # Missing values, correlated over the samples each pair shares:
#' expr[sample(length(expr), 60)] <- NA
#' robust <- knnGraph(expr, k = 5, metric = "bicor",
#'                    use = "pairwise.complete.obs")
#' if (requireNamespace("igraph", quietly = TRUE)) {
#'     g <- igraph::graph_from_data_frame(edges,
#'                                        vertices = attr(edges, "nodes"))
#'     igraph::vcount(g)
#' }
#' @export
knnGraph <- function(x, k = 10, metric = NULL, by = c("rows", "columns"),
                     symmetrize = c("none", "union", "mutual"), snn = NULL,
                     device = c("auto", "cpu", "gpu"), threads = NULL,
                     progress = interactive(), verbose = FALSE, assay = NULL,
                     devices = NULL,
                     precision = c("auto", "tf32", "fp32", "fp64", "tf32x3"),
                     use.dimred = NULL,
                     BPPARAM = BiocParallel::SerialParam(),
                     checkpoint = NULL,
                     use = c("everything", "pairwise.complete.obs"),
                     min.shared = 4L) {
    hint <- missing(by)
    by <- .checkChoice(by[1L], c("rows", "columns"), "by")
    metric <- .checkMetric(.defaultMetric(metric, use.dimred))
    use <- .checkUse(use, metric, min.shared)
    precision <- .checkPrecision(precision)
    symmetrize <- .checkChoice(symmetrize[1L], c("none", "union", "mutual"),
                               "symmetrize")
    if (!is.null(snn)) {
        snn <- .checkChoice(snn, c("rank", "number", "jaccard"), "snn")
        if (symmetrize != "none") {
            stop("'symmetrize' must be \"none\" when 'snn' is set: SNN ",
                 "graphs are undirected already", call. = FALSE)
        }
    }
    source <- .nodeSource(x, by, assay, "x", use.dimred, hint)
    if (source$n < 2L) {
        stop("'x' needs at least 2 nodes to build a graph", call. = FALSE)
    }
    k <- .checkK(k, source$n - 1L)
    if (is.null(snn)) .checkEdgeCount(source$n, k)
    BPPARAM <- .checkBPPARAM(if (missing(BPPARAM)) NULL else BPPARAM,
                             checkpoint)
    way <- .searchUse(use, source)
    res <- if (is.null(BPPARAM)) {
        .runEngine(.readNodes(source, threads = threads), NULL, k, metric,
                   device[1L], threads, progress, verbose, devices,
                   edges = is.null(snn), precision = precision, use = way,
                   min.shared = use$min.shared)
    } else {
        .edgeList(.searchInBlocks(source, NULL, k, metric, device[1L],
                                  threads, progress, verbose, devices,
                                  BPPARAM, precision, checkpoint,
                                  use = way, min.shared = use$min.shared))
    }
    edges <- if (!is.null(snn)) {
        .snnEdges(res$index, snn)
    } else if (symmetrize == "none" || anyNA(res$to)) {
        .symmetrize(.directedEdges(res, way == "pairwise"), symmetrize,
                    source$n)
    } else {
        res[c("from", "rank")] <- NULL
        .symmetrizeSearch(res, symmetrize, k)
    }
    .labelEdges(edges, source$labels, c(list(
        metric = metric, k = k, by = by, symmetrize = symmetrize, snn = snn,
        use = use$use, min.shared = use$min.shared,
        backend = res$info$backend, device = res$info$device,
        precision = res$info$precision, elapsed = res$info$elapsed,
        timings = res$info), source$input), source$annotation)
}

## One row per (node, neighbour), grouped by node, ranks ascending: the
## engine wrote them in this order. A pairwise-complete search leaves a
## node's last places empty (NA) where it has fewer than k partners
## sharing enough features (pairwise): they are no edges.
.directedEdges <- function(res, pairwise = FALSE) {
    edges <- list2DF(res[c("from", "to", "weight", "distance", "rank")])
    if (!pairwise || !anyNA(edges$to)) return(edges)
    edges <- edges[!is.na(edges$to), , drop = FALSE]
    rownames(edges) <- NULL
    edges
}

## A self search's n x k results as the engine's directed edge list
## (edges = TRUE), its matrices kept for .snnEdges().
.edgeList <- function(res) {
    n <- nrow(res$index)
    k <- ncol(res$index)
    list(index = res$index, info = res$info,
         from = rep(seq_len(n), each = k),
         to = as.vector(t(res$index)), weight = as.vector(t(res$weight)),
         distance = as.vector(t(res$distance)),
         rank = rep(seq_len(k), times = n))
}

## Undirected edges: each pair once (from < to), keeping its better rank;
## "mutual" keeps pairs that both ends chose.

## Of a search's whole directed list, k neighbours of every node (the
## engine's `to`, `weight` and `distance` in edge order, as .runEngine()
## and .edgeList() give them; `from` and `rank` are not needed, and a
## caller that drops them first frees their memory): in C
## (knn_symmetry_pairs), in memory of the order of the edges themselves.
.symmetrizeSearch <- function(res, symmetrize, k) {
    list2DF(.Call(C_knn_symmetrize, res$to, res$weight, res$distance,
                  as.integer(k), symmetrize == "mutual"))
}

## Of any directed edge list of n nodes (fewer than k partners for some
## nodes, as a pairwise-complete search leaves, or other columns, as
## toAdjacency() passes): the columns of each pair's edge of the smaller
## rank, in (from, to) order, as .symmetrizeSearch() gives them.
.symmetrize <- function(edges, symmetrize, n) {
    if (symmetrize == "none") return(edges)
    lo <- pmin(edges$from, edges$to)
    hi <- pmax(edges$from, edges$to)
    edges$from <- lo
    edges$to <- hi
    edges <- edges[order(lo, hi, edges$rank), , drop = FALSE]
    pair <- (edges$from - 1) * as.double(n) + edges$to
    repeated <- duplicated(pair)
    keep <- !repeated
    if (symmetrize == "mutual") keep <- keep & pair %in% pair[repeated]
    edges <- edges[keep, , drop = FALSE]
    rownames(edges) <- NULL
    edges
}

.snnEdges <- function(index, snn) {
    if (anyNA(index)) {
        stop("'snn' needs k neighbours of every node, but some nodes have ",
             "fewer partners that share 'min.shared' features; lower 'k' or ",
             "'min.shared'", call. = FALSE)
    }
    type <- match(snn, c("rank", "number", "jaccard")) - 1L
    list2DF(.Call(C_knn_snn, index, type))
}

## Replaces node numbers by names (unnamed nodes keep their 1-based
## numbers) and attaches the node table (with the nodes' annotation, a
## data.frame or NULL: .nodeAnnotation()) and the description of the run.
.labelEdges <- function(edges, labels, about, annotation = NULL) {
    if (is.character(labels)) {
        edges$from <- labels[edges$from]
        edges$to <- labels[edges$to]
    }
    nodes <- data.frame(name = labels)
    if (!is.null(annotation)) nodes <- cbind(nodes, annotation)
    attr(edges, "nodes") <- nodes
    for (field in names(about)) attr(edges, field) <- about[[field]]
    edges
}
