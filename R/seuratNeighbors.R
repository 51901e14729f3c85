#' Seurat's FindNeighbors(), exact, with knngpu's search
#'
#' Builds the nearest-neighbour (\code{nn}) and shared-nearest-neighbour
#' (\code{snn}) graphs of a Seurat object's cells as
#' \code{Seurat::FindNeighbors()} does, from knngpu's exact search (on the
#' GPU where there is one), and stores them in the object under the names
#' FindNeighbors gives them (\code{RNA_nn}, \code{RNA_snn} for an RNA
#' assay's PCA), so that \code{FindClusters()} and \code{RunUMAP(graph = )}
#' work unchanged.
#'
#' @param object A Seurat object (SeuratObject package).
#' @param reduction The dimensional reduction whose embeddings are searched.
#' @param dims Which of its dimensions to use.
#' @param k.param Neighbours per cell, the cell itself included, as
#'   FindNeighbors counts them.
#' @param prune.SNN SNN weights (Jaccard indices) below this are set to 0
#'   and dropped.
#' @param graph.name Names for the stored graphs; \code{NULL} takes
#'   FindNeighbors' names: the reduction's assay, then \code{"_nn"} and
#'   \code{"_snn"} (\code{".nn"} for a Neighbor object).
#' @param return.neighbor \code{TRUE} stores a \code{Neighbor} object (the
#'   cells' neighbour indices and Euclidean distances, each cell first in
#'   its own row) instead of the graphs, as FindNeighbors does.
#' @param compute.SNN Whether to store the SNN graph too.
#' @param ... Passed to \code{\link{knnSearch}}: \code{device},
#'   \code{threads}, \code{devices}, \code{precision}, \code{BPPARAM},
#'   \code{progress}, \code{verbose}.
#'
#' @return \code{object} with the graphs (class \code{Graph}, their
#'   \code{DefaultAssay} the reduction's) or the Neighbor object added.
#'
#' @details The graphs equal those of \code{FindNeighbors(object, reduction,
#'   dims, k.param = , prune.SNN = , nn.method = "rann", nn.eps = 0)}, its
#'   exact method: each cell's row of the nn graph holds 1 for itself and
#'   its \code{k.param - 1} nearest cells by Euclidean distance; the SNN
#'   weight of two cells is \eqn{s / (2 k - s)} with s the cells their
#'   lists share, k = \code{k.param}, pruned below \code{prune.SNN}, with
#'   a diagonal of 1. Ties at equal distance go to the smaller cell index
#'   (RANN's order of exact ties, such as duplicate cells, is its own).
#'   The SNN graph is computed from the neighbour lists by knngpu's engine,
#'   without the product of the nn graph with its transpose. Unlike
#'   FindNeighbors, no command is logged in the object.
#'
#' @seealso \code{\link{knnSearch}}, \code{\link{knnGraph}} (\code{snn =
#'   "jaccard"} is the same weight without pruning and diagonal).
#' @examples
#' if (requireNamespace("SeuratObject", quietly = TRUE)) {
#'     set.seed(1)
#'     counts <- matrix(rpois(50 * 300, 1), 50, 300,
#'                      dimnames = list(paste0("g", 1:50),
#'                                      paste0("cell", 1:300)))
#'     obj <- SeuratObject::CreateSeuratObject(counts)
#'     pcs <- matrix(rnorm(300 * 10), 300, 10,
#'                   dimnames = list(colnames(obj), paste0("PC_", 1:10)))
#'     obj[["pca"]] <- SeuratObject::CreateDimReducObject(
#'         embeddings = pcs, key = "PC_", assay = "RNA")
#'     obj <- seuratNeighbors(obj, dims = 1:10, k.param = 20)
#'     names(obj@graphs)
#' }
#' @export
seuratNeighbors <- function(object, reduction = "pca", dims = 1:10,
                            k.param = 20, prune.SNN = 1/15,
                            graph.name = NULL, return.neighbor = FALSE,
                            compute.SNN = !return.neighbor, ...) {
    if (!requireNamespace("SeuratObject", quietly = TRUE)) {
        stop("seuratNeighbors() needs the SeuratObject package",
             call. = FALSE)
    }
    if (!methods::is(object, "Seurat")) {
        stop("'object' must be a Seurat object", call. = FALSE)
    }
    return.neighbor <- .checkFlag(return.neighbor, "return.neighbor")
    compute.SNN <- .checkFlag(compute.SNN, "compute.SNN")
    if (!is.numeric(prune.SNN) || length(prune.SNN) != 1L ||
        is.na(prune.SNN)) {
        stop("'prune.SNN' must be a number (Jaccard indices below it are ",
             "dropped)", call. = FALSE)
    }
    embeddings <- .seuratEmbeddings(object, reduction, dims)
    n <- nrow(embeddings)
    if (n < 2L) stop("'object' needs at least 2 cells", call. = FALSE)
    if (!.isWholeNumber(k.param) || k.param < 1) {
        stop("'k.param' must be a whole number from 1", call. = FALSE)
    }
    if (k.param > n) {
        warning("'k.param' is larger than the number of cells; using ",
                n - 1L, " (the number of cells - 1), as FindNeighbors does",
                call. = FALSE)
        k.param <- n - 1L
    }
    k.param <- as.integer(k.param)
    nn <- .seuratRanked(embeddings, k.param, ...)
    assay <- SeuratObject::DefaultAssay(object[[reduction]])
    if (return.neighbor) {
        name <- if (is.null(graph.name)) paste0(assay, ".nn") else graph.name
        object[[name[1L]]] <- methods::new(
            "Neighbor", nn.idx = nn$index, nn.dist = nn$distance,
            alg.info = list(), cell.names = rownames(embeddings))
        return(object)
    }
    graphs <- list(nn = .seuratNnGraph(nn$index, rownames(embeddings)))
    if (compute.SNN) {
        graphs$snn <- .seuratSnnGraph(nn$index, k.param, prune.SNN,
                                      rownames(embeddings))
    }
    if (is.null(graph.name)) graph.name <- paste0(assay, "_", names(graphs))
    for (i in seq_len(min(length(graph.name), length(graphs)))) {
        graph <- graphs[[i]]
        SeuratObject::DefaultAssay(graph) <- assay
        object[[graph.name[[i]]]] <- graph
    }
    object
}

## The cells x dims embeddings of a reduction, checked.
.seuratEmbeddings <- function(object, reduction, dims) {
    if (!is.character(reduction) || length(reduction) != 1L ||
        !reduction %in% SeuratObject::Reductions(object)) {
        stop("'reduction' must name one of the reductions of 'object': ",
             paste0('"', SeuratObject::Reductions(object), '"',
                    collapse = ", "), call. = FALSE)
    }
    embeddings <- SeuratObject::Embeddings(object[[reduction]])
    if (!is.numeric(dims) || !length(dims) || anyNA(dims) ||
        any(dims < 1 | dims > ncol(embeddings) | dims != round(dims))) {
        stop(sprintf(paste("'dims' must be dimensions of '%s', from 1 to",
                           "%d"), reduction, ncol(embeddings)),
             call. = FALSE)
    }
    embeddings[, dims, drop = FALSE]
}

## FindNeighbors' ranked lists: each cell first, then its k.param - 1
## nearest cells; n x k.param index and Euclidean distance matrices.
.seuratRanked <- function(embeddings, k.param, ...) {
    n <- nrow(embeddings)
    self <- seq_len(n)
    if (k.param == 1L) {
        return(list(index = matrix(self), distance = matrix(0, n, 1L)))
    }
    found <- knnSearch(embeddings, k = k.param - 1L, metric = "euclidean",
                       by = "rows", ...)
    list(index = cbind(self, found$index, deparse.level = 0),
         distance = cbind(0, found$distance, deparse.level = 0))
}

## The nn Graph: 1 at each cell's row for every cell of its list.
.seuratNnGraph <- function(index, cells) {
    n <- nrow(index)
    graph <- Matrix::sparseMatrix(i = rep(seq_len(n), each = ncol(index)),
                                  j = as.numeric(t(index)), x = 1,
                                  dims = c(n, n))
    graph <- methods::as(graph, "Graph")
    rownames(graph) <- cells
    colnames(graph) <- cells
    graph
}

## The SNN Graph as Seurat's ComputeSNN() gives it: s / (k + (k - s)) for
## cells whose lists share s cells, pruned below `prune`, diagonal 1.
## knngpu's Jaccard weight (knn_snn.c) of the lists without the cells
## themselves, each counted in its own, is the same quotient of the same
## integers.
.seuratSnnGraph <- function(index, k.param, prune, cells) {
    n <- nrow(index)
    edges <- if (k.param > 1L) {
        .snnEdges(index[, -1L, drop = FALSE], "jaccard")
    } else {
        data.frame(from = integer(), to = integer(), weight = double())
    }
    edges <- edges[edges$weight >= prune, , drop = FALSE]
    diagonal <- if (1 >= prune) seq_len(n) else integer()
    graph <- Matrix::sparseMatrix(
        i = c(edges$from, edges$to, diagonal),
        j = c(edges$to, edges$from, diagonal),
        x = c(edges$weight, edges$weight, rep(1, length(diagonal))),
        dims = c(n, n), dimnames = list(cells, cells))
    SeuratObject::as.Graph(graph)
}
