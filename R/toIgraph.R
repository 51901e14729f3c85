#' Turn a knnGraph() edge data frame into an igraph graph
#'
#' @param edges A data.frame returned by \code{\link{knnGraph}}.
#' @param directed \code{NULL} (directed exactly when the edges are the plain
#'   kNN edges, i.e. \code{symmetrize = "none"} and no \code{snn}), or
#'   \code{TRUE}/\code{FALSE}.
#' @return An igraph graph with every node as a vertex (isolated ones
#'   included) and the edge columns as edge attributes.
#' @examples
#' if (requireNamespace("igraph", quietly = TRUE)) {
#'     set.seed(1)
#'     x <- matrix(rnorm(60 * 8), nrow = 60)
#'     g <- toIgraph(knnGraph(x, k = 4, symmetrize = "mutual"))
#'     igraph::ecount(g)
#' }
#' @export
toIgraph <- function(edges, directed = NULL) {
    if (!requireNamespace("igraph", quietly = TRUE)) {
        stop("toIgraph() needs the igraph package", call. = FALSE)
    }
    if (!is.data.frame(edges) || is.null(attr(edges, "nodes"))) {
        stop("'edges' must be a data.frame returned by knnGraph()",
             call. = FALSE)
    }
    if (is.null(directed)) {
        directed <- identical(attr(edges, "symmetrize"), "none") &&
            is.null(attr(edges, "snn"))
    }
    directed <- .checkFlag(directed, "directed")
    plain <- edges
    attributes(plain) <- attributes(edges)[c("names", "row.names", "class")]
    igraph::graph_from_data_frame(plain, directed = directed,
                                  vertices = attr(edges, "nodes"))
}
