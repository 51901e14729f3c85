#' Exact k-nearest neighbours of every node, or of query nodes
#'
#' Finds, for each node (a row of \code{x} by default), the \code{k} closest
#' nodes under \code{metric}, exactly: the result equals a float64 reference,
#' with ties at equal distance broken by the smaller node index. Each row is
#' sorted by (reported distance, index), and the k-th place too goes to the
#' smallest index among the nodes that report its distance. The shape
#' of the result is that of \code{BiocNeighbors::findKNN()} /
#' \code{BiocNeighbors::queryKNN()} and \code{FNN::get.knnx()}.
#'
#' @param x A numeric matrix (genes in rows, samples in columns, as
#'   expression matrices are stored), a data.frame of numeric columns, a
#'   \code{SummarizedExperiment} (a \code{SingleCellExperiment} with
#'   \code{use.dimred}) or an \code{ExpressionSet}; sparse
#'   (\code{Matrix}) and \code{DelayedArray} matrices, such as
#'   \code{HDF5Array}s on disk, also inside those containers, are read in
#'   blocks (see Details). These are the reference nodes.
#' @param query \code{NULL} to search \code{x} against itself (a node is
#'   never its own neighbour, but a duplicate of it is, at distance 0), or
#'   nodes of the same kind as \code{x} with the same features.
#' @param k Number of neighbours, a whole number from 1 to the number of
#'   candidate nodes.
#' @param metric One of \code{"pearson"}, \code{"cosine"},
#'   \code{"euclidean"}, \code{"spearman"} (Pearson of ranks),
#'   \code{"abspearson"} (\eqn{|r|}, unsigned co-expression),
#'   \code{"manhattan"} or \code{"sqeuclidean"}. \code{NULL}, the default,
#'   is \code{"pearson"}, or \code{"euclidean"} with \code{use.dimred}
#'   (scran's and bluster's choice on principal components).
#' @param by \code{"rows"} (the default) makes rows the nodes, e.g. genes of
#'   an expression matrix; \code{"columns"} makes columns (samples) the nodes.
#' @param device \code{"auto"} uses the GPU when the package was built with
#'   CUDA and a GPU is present, else the CPU (saying so once);
#'   \code{"cpu"} or \code{"gpu"} force one. The answer is the same.
#' @param threads CPU threads, a whole number from 1 to 1024 (larger counts
#'   are refused: OpenMP would try to start them all); \code{NULL} or 0 uses
#'   \code{getOption("knngpu.threads")}, else all cores. BLAS threads are
#'   set by the BLAS library.
#' @param progress Show a progress bar on long runs.
#' @param verbose Print the device, precision, tiling and timings.
#' @param assay For a \code{SummarizedExperiment}, which assay to use (a
#'   name or number); \code{NULL}, the default, takes \code{"logcounts"}
#'   where there is one (scater's convention), else the first.
#' @param use.dimred For a \code{SingleCellExperiment}, the name (or number)
#'   of a \code{reducedDim()} (e.g. \code{"PCA"}) to search instead of an
#'   assay: the cells are then the nodes (rows of the reduced dimensions,
#'   named by the cells), as scran and bluster do it.
#' @param devices GPU ids (0-based, as \code{gpuInfo()} lists them) to split
#'   the work across; \code{NULL} uses every visible GPU.
#' @param precision The arithmetic that finds candidates before the exact
#'   float64 re-rank; the result is the same bits on every choice, only
#'   the time differs. \code{"auto"} (the default) starts on the cheapest
#'   (TF32 tensor cores on the GPU, float32 BLAS on the CPU) and goes on in
#'   the next (split TF32 on the GPU, float64 BLAS on the CPU) once the
#'   data show its proven margin lets too many candidates through, e.g.
#'   nodes whose neighbours are nearly equidistant; on the GPU a search
#'   still crowded there goes on in float64 (DGEMM, on the FP64 tensor
#'   cores of an A100, H100 or H200; on cards whose float64 runs at 1/32
#'   of float32 or less it is slow, but the only arithmetic that resolves
#'   such data). On the GPU, TF32
#'   candidates are first rescored in float32 (a read of their values,
#'   where split TF32 would redo every product), which keeps data such as
#'   single-cell log-counts on TF32; the \code{precision} attribute then
#'   says "fp32 rescored". The fused GPU kernel takes its TF32 rung's
#'   products from fp16 copies of the vectors, each node scaled by a power
#'   of two (the same 10 mantissa bits, rounded to nearest, within TF32's
#'   margins, at twice the rate); the attribute then ends "(tf32 tiles:
#'   fp16 fused products)". Split TF32
#'   (\code{"tf32x3"}) writes each float32 value as the sum of two TF32
#'   values and adds three tensor-core products, for nearly float32's
#'   accuracy in about 0.6 of its time; where its arrays do not fit in GPU
#'   memory the climb goes to float64 on a GPU that runs it at half
#'   float32's rate, else to float32. \code{"tf32"}, \code{"tf32x3"} (GPU
#'   only), \code{"fp32"} and \code{"fp64"} (both) force one; the
#'   result's \code{precision} attribute says which ran.
#' @param BPPARAM A \code{BiocParallelParam} (BiocParallel) whose workers
#'   search blocks of the query nodes (of \code{x} itself without
#'   \code{query}), each against every reference node, on the worker's GPU
#'   where it has one (\code{device = "auto"}), else its CPUs. The default,
#'   \code{SerialParam()}, searches in this process. The result is the
#'   same, bit for bit, for any workers and block count (one block per
#'   worker, or \code{bptasks()} blocks when more).
#'
#' @return A list with \code{index} (1-based node numbers) and
#'   \code{distance}, each an n-by-\code{k} matrix whose row i holds node
#'   i's neighbours, closest first. For correlation metrics the distance is
#'   \eqn{1 - r} (\eqn{1 - |r|} for \code{"abspearson"}). Attributes
#'   \code{assay} or \code{reducedDim} (for a \code{SummarizedExperiment}:
#'   the assay or reduced dimensions searched),
#'   \code{backend} (\code{"cpu"} or \code{"gpu"}), \code{device} (its
#'   description), \code{precision} and \code{elapsed} say how it was
#'   computed; \code{timings} holds the engine's phases in seconds (what
#'   \code{verbose = TRUE} prints) and \code{pairs_once}, whether a GPU
#'   self search computed each pair of nodes once (the fused path beyond
#'   one tile, on one GPU or shared by several).
#'
#' @details Memory is bounded: work proceeds in tiles sized from
#'   \code{getOption("knngpu.cpu.memory")} (bytes, default 64 MB) or
#'   \code{getOption("knngpu.gpu.memory")} (bytes of device memory for the
#'   nodes and the tiles together; by default what the GPU has free); the
#'   n-by-n distance matrix is never stored. Candidates may come from
#'   faster arithmetic, but every reported neighbour is re-ranked in
#'   float64 with a proven error margin.
#'
#'   Ties: the order is that of the distances as reported, then of the node
#'   index, so a user (or BiocNeighbors) who checks "ties go to the smaller
#'   index" on the returned values sees it hold. Where float64 cannot tell
#'   distances apart (squared distances past 1e308 become \code{Inf}, values
#'   near 1e-300 give 0), the nodes tie and the smallest indices win.
#'
#'   With the CPU and a distance metric (\code{"euclidean"},
#'   \code{"sqeuclidean"}, \code{"manhattan"}) on few features (up to 6
#'   from 500 nodes, up to 8 from 8000), the search uses an exact k-d tree
#'   instead of the scan of every pair, where it is faster (measured by
#'   \code{inst/bench/lowdim.R}); the bits are the same.
#'   \code{options(knngpu.algorithm = "tree" | "products")} forces one
#'   (\code{"auto"}, the default, chooses).
#'
#'   Bad input stops with an error that names the argument and the first
#'   offending nodes: NA, NaN or Inf values (reported first, whatever the
#'   metric), and nodes the metric cannot use (constant nodes for the
#'   correlations, all-zero nodes for cosine). Node names that igraph
#'   would refuse as vertex names (NA, empty or repeated) are made unique
#'   with a message: NA and empty names become the node's number, repeats
#'   get \code{make.unique()}'s suffixes.
#'
#'   Large data: a \code{DelayedArray} (e.g. an \code{HDF5Array}) or
#'   sparse matrix is read block by block (DelayedArray's
#'   \code{rowAutoGrid()}/\code{colAutoGrid()}, sized by
#'   \code{getAutoBlockSize()}) straight into the engine's dense float64
#'   layout, features x nodes, so no other dense copy of the whole matrix
#'   is made; when R cannot allocate that layout, the error says how much
#'   memory it needs. With \code{BPPARAM}, the data reaches each worker
#'   once, not once per block: an HDF5-backed matrix as its file name
#'   (the workers read the file), anything else saved once to
#'   \code{getOption("knngpu.transfer.dir", tempdir())} (on a cluster, set
#'   it to a directory every node sees); a worker keeps the reference
#'   between its blocks. A worker's failure stops the search with an
#'   error naming the block, its first and last nodes, and the worker's
#'   message; no partial result is returned. For a cluster, take
#'   \code{BiocParallel::BatchtoolsParam()} with a scheduler template (see
#'   the vignette). On the GPU, a reference (or query) larger than the
#'   device memory, or than \code{getOption("knngpu.gpu.memory")}, streams
#'   through the device in blocks of nodes whose results are merged on the
#'   host; the bits are the same.
#'
#'   Ctrl-C stops a search within a second on the CPU and the GPU; memory
#'   is released first, then R's own interrupt is signalled, so
#'   \code{tryCatch(..., interrupt = )} sees it as an interrupt.
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
knnSearch <- function(x, query = NULL, k = 10, metric = NULL,
                      by = c("rows", "columns"), device = c("auto", "cpu",
                      "gpu"), threads = NULL, progress = interactive(),
                      verbose = FALSE, assay = NULL, devices = NULL,
                      precision = c("auto", "tf32", "fp32", "fp64", "tf32x3"),
                      use.dimred = NULL,
                      BPPARAM = BiocParallel::SerialParam()) {
    by <- .checkChoice(by[1L], c("rows", "columns"), "by")
    metric <- .checkMetric(.defaultMetric(metric, use.dimred))
    precision <- .checkPrecision(precision)
    ref <- .nodeSource(x, by, assay, "x", use.dimred)
    q <- NULL
    if (!is.null(query)) {
        q <- .nodeSource(query, by, assay, "query", use.dimred)
        if (q$p != ref$p) {
            stop(sprintf(paste("'query' has %d features but 'x' has %d;",
                               "both need the same features"), q$p, ref$p),
                 call. = FALSE)
        }
    }
    available <- ref$n - is.null(query)
    if (available < 1L) {
        stop("'x' needs at least 2 nodes to search against itself",
             call. = FALSE)
    }
    k <- .checkK(k, available)
    BPPARAM <- .checkBPPARAM(if (missing(BPPARAM)) NULL else BPPARAM)
    res <- if (is.null(BPPARAM)) {
        .runEngine(.readNodes(ref), if (!is.null(q)) .readNodes(q), k,
                   metric, device[1L], threads, progress, verbose, devices,
                   precision = precision)
    } else {
        .searchInBlocks(ref, q, k, metric, device[1L], threads, progress,
                        verbose, devices, BPPARAM, precision)
    }
    out <- list(index = res$index, distance = res$distance)
    for (field in names(ref$input)) attr(out, field) <- ref$input[[field]]
    attr(out, "backend") <- res$info$backend
    attr(out, "device") <- res$info$device
    attr(out, "precision") <- res$info$precision
    attr(out, "elapsed") <- res$info$elapsed
    attr(out, "timings") <- res$info
    out
}
