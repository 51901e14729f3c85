#' Turn a knnGraph() edge data frame into a sparse adjacency matrix
#'
#' The n x n adjacency matrix of the graph as a \code{dgCMatrix} (Matrix
#' package), rows and columns named by the nodes, every node included
#' (isolated ones too): what WGCNA, Seurat and igraph
#' (\code{graph_from_adjacency_matrix()}) users reach for.
#'
#' @param edges A data.frame returned by \code{\link{knnGraph}}.
#' @param value \code{"weight"} (the similarity; the only column of SNN
#'   edges) or \code{"distance"}: the value stored for each edge.
#' @param symmetrize For directed edges: \code{"none"} keeps entry
#'   \code{[from, to]} only (a node's row holds its k neighbours),
#'   \code{"union"} sets \code{[from, to]} and \code{[to, from]} where
#'   either node chose the other, \code{"mutual"} only where both did.
#'   Edges that are undirected already (\code{knnGraph(symmetrize = )} or
#'   \code{snn}) always fill both triangles; they take \code{"none"}.
#'
#' @return A \code{dgCMatrix} with the nodes' names as dimnames. An absent
#'   edge is a structural zero; an edge whose value is 0 (a distance
#'   between duplicate nodes) is stored as an explicit 0, so
#'   \code{Matrix::summary()} lists every edge.
#'
#' @seealso \code{\link{toIgraph}}, \code{\link{knnGraph}}.
#' @examples
#' if (requireNamespace("Matrix", quietly = TRUE)) {
#'     set.seed(1)
#'     x <- matrix(rnorm(30 * 8), nrow = 30,
#'                 dimnames = list(paste0("gene", 1:30), NULL))
#'     edges <- knnGraph(x, k = 3)
#'     a <- toAdjacency(edges)
#'     a[1:4, 1:4]
#'     Matrix::isSymmetric(toAdjacency(edges, symmetrize = "union"))
#' }
#' @export
toAdjacency <- function(edges, value = c("weight", "distance"),
                        symmetrize = c("none", "union", "mutual")) {
    if (!requireNamespace("Matrix", quietly = TRUE)) {
        stop("toAdjacency() needs the Matrix package", call. = FALSE)
    }
    nodes <- attr(edges, "nodes")
    if (!is.data.frame(edges) || is.null(nodes)) {
        stop("'edges' must be a data.frame returned by knnGraph()",
             call. = FALSE)
    }
    value <- .checkChoice(value[1L], c("weight", "distance"), "value")
    symmetrize <- .checkChoice(symmetrize[1L], c("none", "union", "mutual"),
                               "symmetrize")
    if (is.null(edges[[value]])) {
        stop(sprintf("'edges' has no column \"%s\" (SNN edges have only ",
                     value), "\"weight\"); use value = \"weight\"",
             call. = FALSE)
    }
    undirected <- !identical(attr(edges, "symmetrize"), "none") ||
        !is.null(attr(edges, "snn"))
    if (undirected && symmetrize != "none") {
        stop("'symmetrize' must be \"none\": the edges are undirected ",
             "already", call. = FALSE)
    }
    names <- as.character(nodes$name)
    from <- match(as.character(edges$from), names)
    to <- match(as.character(edges$to), names)
    x <- edges[[value]]
    if (symmetrize != "none") {
        both <- .symmetrize(data.frame(from = from, to = to, x = x,
                                       rank = edges$rank),
                            symmetrize, length(names))
        from <- both$from
        to <- both$to
        x <- both$x
        undirected <- TRUE
    }
    if (undirected) {
        loops <- from == to
        x <- c(x, x[!loops])
        swapped <- c(to, from[!loops])
        from <- c(from, to[!loops])
        to <- swapped
    }
    Matrix::sparseMatrix(i = from, j = to, x = as.double(x),
                         dims = rep(length(names), 2L),
                         dimnames = list(names, names))
}
