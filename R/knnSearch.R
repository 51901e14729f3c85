#' Exact k-nearest neighbours of every node, or of query nodes
#'
#' Finds, for each node (a row of \code{x} by default), the \code{k} closest
#' nodes under \code{metric}, exactly: the result equals a float64 reference,
#' with ties at equal distance broken by the smaller node index. The shape
#' of the result is that of \code{BiocNeighbors::findKNN()} /
#' \code{BiocNeighbors::queryKNN()} and \code{FNN::get.knnx()}.
#'
#' @param x A numeric matrix (genes in rows, samples in columns, as
#'   expression matrices are stored), a data.frame of numeric columns, a
#'   \code{SummarizedExperiment} or an \code{ExpressionSet}. These are the
#'   reference nodes.
#' @param query \code{NULL} to search \code{x} against itself (a node is
#'   never its own neighbour, but a duplicate of it is, at distance 0), or
#'   nodes of the same kind as \code{x} with the same features.
#' @param k Number of neighbours, a whole number from 1 to the number of
#'   candidate nodes.
#' @param metric One of \code{"pearson"}, \code{"cosine"},
#'   \code{"euclidean"}, \code{"spearman"} (Pearson of ranks),
#'   \code{"abspearson"} (\eqn{|r|}, unsigned co-expression),
#'   \code{"manhattan"} or \code{"sqeuclidean"}.
#' @param by \code{"rows"} (the default) makes rows the nodes, e.g. genes of
#'   an expression matrix; \code{"columns"} makes columns (samples) the nodes.
#' @param device \code{"auto"} uses the GPU when the package was built with
#'   CUDA and a GPU is present, else the CPU (saying so once);
#'   \code{"cpu"} or \code{"gpu"} force one. The answer is the same.
#' @param threads CPU threads; \code{NULL} uses
#'   \code{getOption("knngpu.threads")}, else all cores. BLAS threads are
#'   set by the BLAS library.
#' @param progress Show a progress bar on long runs.
#' @param verbose Print the device, precision, tiling and timings.
#' @param assay For a \code{SummarizedExperiment}, which assay to use.
#' @param devices GPU ids (0-based, as \code{gpuInfo()} lists them) to split
#'   the work across; \code{NULL} uses every visible GPU.
#'
#' @return A list with \code{index} (1-based node numbers) and
#'   \code{distance}, each an n-by-\code{k} matrix whose row i holds node
#'   i's neighbours, closest first. For correlation metrics the distance is
#'   \eqn{1 - r} (\eqn{1 - |r|} for \code{"abspearson"}). Attributes
#'   \code{backend} (\code{"cpu"} or \code{"gpu"}), \code{device} (its
#'   description), \code{precision} and \code{elapsed} say how it was
#'   computed; \code{timings} holds the engine's phases in seconds (what
#'   \code{verbose = TRUE} prints).
#'
#' @details Memory is bounded: work proceeds in tiles sized from
#'   \code{getOption("knngpu.cpu.memory")} (bytes, default 128 MB) or
#'   \code{getOption("knngpu.gpu.memory")}; the n-by-n distance matrix is
#'   never stored. Candidates may come from faster arithmetic, but every
#'   reported neighbour is re-ranked in float64 with a proven error margin.
#'
#' @seealso \code{\link{knnGraph}} for an edge list ready for igraph.
#' @examples
#' set.seed(1)
#' x <- matrix(rnorm(200 * 20), nrow = 200)
#' nn <- knnSearch(x, k = 5, metric = "euclidean")
#' nn$index[1:3, ]
#' # Neighbours of new points among the rows of x:
#' q <- matrix(rnorm(3 * 20), nrow = 3)
#' knnSearch(x, q, k = 2, metric = "euclidean")$distance
#' @export
knnSearch <- function(x, query = NULL, k = 10, metric = "pearson",
                      by = c("rows", "columns"), device = c("auto", "cpu",
                      "gpu"), threads = NULL, progress = interactive(),
                      verbose = FALSE, assay = 1L, devices = NULL) {
    by <- .checkChoice(by[1L], c("rows", "columns"), "by")
    metric <- .checkMetric(metric)
    ref <- .asNodes(x, by, assay, "x")
    q <- NULL
    if (!is.null(query)) {
        q <- .asNodes(query, by, assay, "query")
        if (nrow(q$values) != nrow(ref$values)) {
            stop(sprintf(paste("'query' has %d features but 'x' has %d;",
                               "both need the same features"),
                         nrow(q$values), nrow(ref$values)), call. = FALSE)
        }
    }
    available <- ncol(ref$values) - is.null(query)
    if (available < 1L) {
        stop("'x' needs at least 2 nodes to search against itself",
             call. = FALSE)
    }
    k <- .checkK(k, available)
    res <- .runEngine(ref, q, k, metric, device[1L], threads, progress,
                      verbose, devices)
    out <- list(index = res$index, distance = res$distance)
    attr(out, "backend") <- res$info$backend
    attr(out, "device") <- res$info$device
    attr(out, "precision") <- res$info$precision
    attr(out, "elapsed") <- res$info$elapsed
    attr(out, "timings") <- res$info
    out
}
