## The engine's progress bars use cli's C API, which needs cli's namespace
## loaded: hence the import of cli below.

#' knngpu: exact k-nearest-neighbour graphs of expression matrices
#'
#' Builds exact kNN graphs (Pearson, cosine, Euclidean, Spearman, |Pearson|,
#' Manhattan, squared Euclidean) of the genes or samples of an expression
#' matrix on NVIDIA GPUs, with a CPU engine that gives the same answer.
#' Start with \code{\link{knnGraph}} and the vignette:
#' \code{vignette("knngpu", package = "knngpu")}.
#'
#' @section Precision:
#' Fast arithmetic only finds candidates; every reported neighbour is
#' re-ranked in float64 with a proven error margin, so the edges are the
#' same bits whichever arithmetic ran. The \code{precision} argument of
#' the verbs chooses it; \code{"auto"} climbs the rungs below in order, to
#' the next one where the margin of the current one lets too many
#' candidates through (nodes whose neighbours are nearly equidistant).
#' \describe{
#'   \item{\code{"tf32"} (GPU)}{TF32 tensor-core products. The fused
#'     kernel multiplies fp16 copies of the vectors, each node scaled by a
#'     power of two (the same 10 mantissa bits, within TF32's margins); the
#'     \code{precision} attribute then ends "(tf32 tiles: fp16 fused
#'     products)". Before climbing, the GPU rescores its TF32 candidates
#'     in float32 ("fp32 rescored"), which keeps data such as single-cell
#'     log-counts on TF32.}
#'   \item{\code{"tf32x3"} (GPU)}{Split TF32: each float32 value as the sum
#'     of two TF32 values, three tensor-core products a pair; nearly
#'     float32's accuracy in about 0.6 of its time.}
#'   \item{\code{"fp32"}}{float32 products (BLAS on the CPU, where it is
#'     the first rung).}
#'   \item{\code{"fp64"}}{float64 products (DGEMM on the GPU, on the FP64
#'     tensor cores of an A100, H100 or H200; slow on cards whose float64
#'     runs at 1/32 of float32 or less, but the one arithmetic that
#'     resolves replicates of a few profiles). Where split TF32's arrays
#'     do not fit in GPU memory, the climb goes to float64 on a GPU with
#'     fast float64, else to float32.}
#' }
#' The vignette's section on the GPU shows the rungs on real data.
#'
#' @section Options:
#' \describe{
#'   \item{\code{knngpu.threads}}{CPU threads when \code{threads = NULL}
#'     (default: all cores).}
#'   \item{\code{knngpu.cpu.memory}}{Bytes for the CPU's tiles (default
#'     64 MB). A graph of nodes with 16 features or more computes each
#'     pair's product once, for both nodes, where every node's candidate
#'     pool fits in three quarters of it (about \code{(2k + 16) * 16 + 8k}
#'     bytes a node: some 58000 nodes at \code{k = 15}); a larger budget
#'     buys that for more nodes, at the cost of memory. Where it is set,
#'     the search by clusters also keeps its arrays (about 12 bytes per
#'     value of the nodes) within it, or leaves the search to the scan.}
#'   \item{\code{knngpu.gpu.memory}}{Bytes of device memory a GPU search
#'     may use for its nodes and tiles (default: what the GPU has free);
#'     nodes past half of it stream through the device in blocks. A
#'     pairwise-complete search keeps its nodes' float32 values there
#'     and computes its products in chunks of the rows the rest holds.}
#'   \item{\code{knngpu.algorithm}}{\code{"auto"}, \code{"products"},
#'     \code{"tree"} or \code{"clusters"}: how the CPU searches (the bits
#'     are the same).}
#'   \item{\code{knngpu.block.nodes}}{Nodes per block of a search streamed
#'     in blocks; 0 (the default) streams only what a GPU cannot hold, a
#'     positive number forces blocks on either device (the bits are the
#'     same; for tests and tuning).}
#'   \item{\code{knngpu.transfer.dir}}{Where a search with \code{BPPARAM}
#'     saves an in-memory matrix once for its workers, and where they
#'     write their blocks when the search has no \code{checkpoint}
#'     (default \code{tempdir()}; on a cluster, a directory every node
#'     sees).}
#' }
#' The environment variable \code{KNNGPU_SELECT} (\code{"warp"},
#' \code{"radix"}: a panel of products, then that selection kernel;
#' \code{"fused"}: products and selection in one kernel, where it can run,
#' each pair of nodes computed once in a self search on one GPU;
#' \code{"fused_rows"}: the same kernel, every node's row walking every
#' node)
#' forces the GPU's candidate selection, for measurements; the candidate
#' arithmetic is the verbs' \code{precision} argument. The bits are the
#' same.
#'
#' @useDynLib knngpu, .registration = TRUE
#' @importFrom cli cli_progress_bar
#' @keywords internal
"_PACKAGE"
