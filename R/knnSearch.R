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
#'   \code{"manhattan"}, \code{"sqeuclidean"} or \code{"bicor"}
#'   (WGCNA's biweight midcorrelation, see Details). \code{NULL}, the
#'   default, is \code{"pearson"}, or \code{"euclidean"} with
#'   \code{use.dimred} (scran's and bluster's choice on principal
#'   components).
#' @param by \code{"rows"} (the default) makes rows the nodes, e.g. genes of
#'   an expression matrix; \code{"columns"} makes columns (samples) the nodes.
#' @param device \code{"auto"} uses the GPU when the package was built with
#'   CUDA and a GPU is present, else the CPU (saying so once);
#'   \code{"cpu"} or \code{"gpu"} force one. The answer is the same.
#' @param threads CPU threads, a whole number from 1 to 1024 (larger counts
#'   are refused: OpenMP would try to start them all); \code{NULL} or 0 uses
#'   \code{getOption("knngpu.threads")}, else all cores. While other
#'   processes keep the cores busy, fewer threads run, as many as the cores
#'   they leave: OpenMP's waiting threads spin, and a thread more than the
#'   free cores then slows the search down. Where R started with
#'   \code{OMP_WAIT_POLICY=passive} in its environment, the waits sleep and
#'   the threads asked for are the threads used. BLAS threads are set by
#'   the BLAS library.
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
#'   the work across; \code{NULL} uses every visible GPU, or one for a
#'   search that takes milliseconds (where starting the others costs more
#'   than they save).
#' @param precision The arithmetic that finds candidates before every
#'   reported neighbour is re-ranked exactly in float64: the result is the
#'   same bits on every choice, only the time differs. \code{"auto"} (the
#'   default) starts on the cheapest (TF32 tensor cores on the GPU, float32
#'   BLAS on the CPU) and moves to a finer one by itself where the data
#'   need it; \code{"tf32"}, \code{"tf32x3"} (GPU only), \code{"fp32"} and
#'   \code{"fp64"} force one. The result's \code{precision} attribute says
#'   which ran; \link{knngpu-package} describes each.
#' @param BPPARAM A \code{BiocParallelParam} (BiocParallel) whose workers
#'   search blocks of the query nodes (of \code{x} itself without
#'   \code{query}), each against every reference node, on the worker's GPU
#'   where it has one (\code{device = "auto"}), else its CPUs. The default,
#'   \code{SerialParam()}, searches in this process. The result is the
#'   same, bit for bit, for any workers and block count (one block per
#'   worker, or \code{bptasks()} blocks when more).
#' @param checkpoint \code{NULL}, or a directory (created when missing;
#'   on a cluster, one that every node sees) where the \code{BPPARAM}
#'   workers write each block as it is finished. It is kept: a rerun of
#'   the same search (same data, \code{k}, \code{metric} and blocks) with
#'   it searches only the blocks that are not there, e.g. after a job that
#'   the scheduler cancelled, and gives the same bits. A directory that
#'   holds another search's blocks is refused. Remove it when done.
#' @param filepath \code{NULL} returns \code{index} and \code{distance}
#'   as matrices in memory; the path of a new file writes them, as the
#'   search produces them, to that HDF5 file's datasets \code{"index"}
#'   and \code{"distance"} and returns them as \code{HDF5Array} matrices
#'   (HDF5Array package), for results larger than memory. The bits are
#'   those of the in-memory result. Blocks of query nodes come from
#'   \code{BPPARAM}'s workers, else are searched in this process,
#'   \code{DelayedArray::getAutoBlockSize()} bytes of result (20 bytes a
#'   neighbour) at a time: a larger block size means fewer passes over
#'   the reference (each block of a self search is searched against every
#'   node). Compression and chunks are HDF5Array's
#'   (\code{setHDF5DumpCompressionLevel()}).
#' @param use \code{"everything"} (the default) refuses missing values;
#'   \code{"pairwise.complete.obs"} correlates each pair of nodes over the
#'   features both have, as \code{stats::cor(x, use =
#'   "pairwise.complete.obs")} and WGCNA's \code{cor(x, use = "p")} and
#'   \code{bicor(x, use = "p")} do (metrics \code{"pearson"},
#'   \code{"abspearson"}, \code{"cosine"} and \code{"bicor"}). See
#'   Details.
#' @param min.shared With \code{use = "pairwise.complete.obs"}, the fewest
#'   features a pair must share to be neighbours (default 4, WGCNA's
#'   smallest number of samples for a correlation).
#'
#' @return A list with \code{index} (1-based node numbers) and
#'   \code{distance}, each an n-by-\code{k} matrix (an \code{HDF5Matrix}
#'   with \code{filepath}) whose row i holds node i's neighbours, closest
#'   first. For correlation metrics the distance is
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
#'   \code{inst/bench/lowdim.R}); the bits are the same. On more features,
#'   Euclidean, squared Euclidean, Pearson, Spearman and cosine searches
#'   of 1000 nodes or more (up to 512 features) partition the nodes into
#'   clusters and skip the cluster pairs that cannot hold a neighbour,
#'   where a sample of rows shows that this prunes enough (structured
#'   data: principal components, cell types, genes at many levels,
#'   log-counts; measured by \code{inst/bench/clusters.R}) and where their
#'   arrays (about 12 bytes per value of the nodes) fit
#'   \code{getOption("knngpu.cpu.memory")} when it is set; the bits are
#'   the same again. \code{options(knngpu.algorithm = "tree" | "clusters" |
#'   "products")} forces one (\code{"auto"}, the default, chooses).
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
#'   between its blocks. Each worker writes its finished blocks to files
#'   in \code{checkpoint}, else in the transfer directory, which this
#'   session reads once all are written (so on a cluster that directory
#'   must be one every node sees, whatever the input). A worker's
#'   failure, or a job that ends without finishing its block (cancelled,
#'   out of time or memory), stops the search with an error naming the
#'   block, its first and last nodes, and the worker's message; no
#'   partial result is returned, but the finished blocks stay in
#'   \code{checkpoint} for a rerun. For a cluster, take
#'   \code{BiocParallel::BatchtoolsParam()} with a scheduler template (see
#'   the vignette). On the GPU, a reference (or query) larger than the
#'   device memory, or than \code{getOption("knngpu.gpu.memory")}, streams
#'   through the device in blocks of nodes whose results are merged on the
#'   host; the bits are the same.
#'
#'   Co-expression: \code{metric = "bicor"} is WGCNA's biweight
#'   midcorrelation (\code{WGCNA::bicor()} with \code{maxPOutliers = 1}):
#'   each node less its median, weighted by \eqn{(1 - u^2)^2} with
#'   \eqn{u = (x - median) / (9 MAD)}, scaled to unit length, falls back
#'   to Pearson's centring where its median absolute deviation is zero (as
#'   WGCNA's \code{pearsonFallback = "individual"} does); the
#'   correlation is then the dot product of two such nodes. The transform
#'   is computed once in float64 and the nodes searched as the exact
#'   cosine search does, on the GPU too; weight is the bicor, distance
#'   \eqn{1 - bicor}. Constant nodes are refused.
#'
#'   Missing values: with \code{use = "pairwise.complete.obs"}, NA and NaN
#'   are missing (Inf is still refused). Where the data hold none, the
#'   search is the one of \code{"everything"}, on any device. Where they
#'   do, each pair's correlation is computed in float64 over the features
#'   both nodes have (for bicor, the medians and deviations too, as
#'   \code{WGCNA::bicor(use = "p")} does). On the CPU, for the Pearson
#'   metrics and cosine, only the candidates that float32 matrix products
#'   with a proven error bound leave are computed so. On a GPU
#'   (\code{device = "gpu"}, or \code{"auto"} where one is used) every
#'   pair is computed there, with the CPU's own float64 arithmetic, on the
#'   first of \code{devices}, within
#'   \code{getOption("knngpu.gpu.memory")}, and the \code{precision}
#'   attribute says "fp64 pairwise-complete keys on the GPU": the result
#'   is the same on every device, bit for bit. Ties go to the smaller
#'   index as always. A pair that shares fewer than \code{min.shared}
#'   features, or on whose shared features a node is constant, is no pair
#'   of neighbours: a node with fewer than \code{k} partners has \code{NA}
#'   in its last places of \code{index} and \code{distance}, and
#'   \code{knnGraph()} gives it fewer edges.
#'
#'   Orientation: nodes are rows unless \code{by = "columns"}. A matrix
#'   with at least five times more columns than rows whose column names
#'   look like genes (probe sets, Ensembl or RefSeq identifiers, gene
#'   symbols) is most likely WGCNA's \code{datExpr} (samples x genes): left
#'   to its default, \code{by} then gets a message saying that the graph
#'   is of the samples and that \code{by = "columns"} makes it one of the
#'   genes; giving \code{by} silences it.
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
                      BPPARAM = BiocParallel::SerialParam(),
                      checkpoint = NULL, filepath = NULL,
                      use = c("everything", "pairwise.complete.obs"),
                      min.shared = 4L) {
    hint <- missing(by)
    by <- .checkChoice(by[1L], c("rows", "columns"), "by")
    metric <- .checkMetric(.defaultMetric(metric, use.dimred))
    use <- .checkUse(use, metric, min.shared)
    precision <- .checkPrecision(precision)
    ref <- .nodeSource(x, by, assay, "x", use.dimred, hint)
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
    BPPARAM <- .checkBPPARAM(if (missing(BPPARAM)) NULL else BPPARAM,
                             checkpoint)
    filepath <- .checkFilepath(filepath)
    way <- .searchUse(use, ref, q)
    res <- if (is.null(BPPARAM) && is.null(filepath)) {
        .runEngine(.readNodes(ref, threads = threads),
                   if (!is.null(q)) .readNodes(q, threads = threads), k,
                   metric, device[1L], threads, progress, verbose, devices,
                   precision = precision, use = way,
                   min.shared = use$min.shared)
    } else {
        .searchInBlocks(ref, q, k, metric, device[1L], threads, progress,
                        verbose, devices, BPPARAM, precision, checkpoint,
                        filepath, use = way, min.shared = use$min.shared)
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
