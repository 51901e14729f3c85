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
#' @useDynLib knngpu, .registration = TRUE
#' @importFrom cli cli_progress_bar
#' @keywords internal
"_PACKAGE"
