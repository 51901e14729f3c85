## FAISS flat search as a benchmark peer, through peers/faiss_knn.py (see
## its header), shared by inst/bench/shapes.R and inst/bench/cpu.R. Source
## from the repository root.

## The library path of a peer's Python child: R puts its own (and the
## system's libpython) first, which a Python built elsewhere (pyenv) then
## loads in place of its own, losing its site-packages. The environment
## variable `variable` sets the child's (on the GPU machine, the peer's:
## KNNGPU_PEER_LD_LIBRARY_PATH for FAISS, see
## ../shared/peers/faiss-gpu/README.md); else it has none.
peerLibraryPath <- function(variable = "KNNGPU_PEER_LD_LIBRARY_PATH") {
    path <- Sys.getenv(variable)
    if (nzchar(path)) paste0("LD_LIBRARY_PATH=", path)
    else c("-u", "LD_LIBRARY_PATH")
}

## Whether python3 can import `module` with that library path (a benchmark
## skips the peer, saying so, where it cannot).
peerImports <- function(module,
                        variable = "KNNGPU_PEER_LD_LIBRARY_PATH") {
    status <- suppressWarnings(system2(
        "env", c(peerLibraryPath(variable), "python3", "-c",
                 shQuote(paste("import", module))),
        stdout = FALSE, stderr = FALSE))
    identical(as.integer(status), 0L)
}

faissAvailable <- function() peerImports("faiss")

## Writes x (n x d) once for faissSearch(): a float64 file, row-major.
faissFile <- function(x) {
    file <- tempfile(fileext = ".f64")
    writeBin(as.vector(t(x)), file)
    file
}

## FAISS's search on `device` ("cpu" or "gpu") of the first n rows of
## `file` (d columns): a self search, or with nq > 0 the search of the nq
## rows after them among the n. list(index = (n or nq) x k 1-based matrix,
## seconds = FAISS's own time from the float64 arrays to the indices,
## Python's start and the file read excluded; the median of `reps` runs
## after a warm-up where reps > 1).
faissSearch <- function(file, n, d, k, metric, device, nq = 0L, reps = 1L) {
    result <- tempfile()
    on.exit(unlink(result))
    line <- system2("env", c(peerLibraryPath(), "python3",
                             file.path("inst", "bench", "peers",
                                       "faiss_knn.py"),
                             file, sprintf("%d", as.integer(c(n, d, k))),
                             metric, device, result,
                             sprintf("%d", as.integer(c(nq, reps)))),
                    stdout = TRUE)
    seconds <- as.numeric(sub("^faiss total ([0-9.]+) .*$", "\\1",
                              line[length(line)]))
    rows <- if (nq > 0) nq else n
    index <- matrix(readBin(result, "integer", rows * k), ncol = k,
                    byrow = TRUE) + 1L
    list(index = index, seconds = seconds)
}
