## cuVS as a benchmark peer, through peers/cuvs_knn.py (see its header):
## brute force, and the approximate NN-descent graph with its recall
## against an exact answer. The cuVS tree travels to the GPU machine as
## ../shared/peers/cuvs/README.md says; KNNGPU_CUVS_LD_LIBRARY_PATH gives
## the Python child the library path its env.sh sets (R's own would
## otherwise come first). Source from the repository root, after
## peers/faiss.R (whose faissFile() writes the data file both read).

cuvsPath <- "KNNGPU_CUVS_LD_LIBRARY_PATH"

cuvsAvailable <- function() peerImports("cuvs.neighbors", cuvsPath)

## cuVS's self graph of the first n rows of `file` (d columns): mode
## "exact" (brute force) or "nnd" (NN-descent); with nq > 0 (brute force
## only), the search of the nq rows after them among the n instead. With
## `exact` (an n x k 1-based index matrix) the recall of the answer
## against it. list(index = (n or nq) x k 1-based matrix, seconds = cuVS's
## median time from the float32 host array to host indices, recall = NA
## without `exact`).
cuvsSearch <- function(file, n, d, k, metric, mode = "exact",
                       exact = NULL, nq = 0L) {
    result <- tempfile()
    reference <- tempfile()
    on.exit(unlink(c(result, reference)))
    args <- c(file, sprintf("%d", as.integer(c(n + nq, d, k))), metric,
              sprintf("%d", as.integer(nq)), result, mode)
    if (!is.null(exact)) {
        writeBin(as.vector(t(exact - 1L)), reference, size = 4L)
        args <- c(args, reference)
    }
    line <- system2("env", c(peerLibraryPath(cuvsPath), "python3",
                             file.path("inst", "bench", "peers",
                                       "cuvs_knn.py"), args),
                    stdout = TRUE)
    last <- line[length(line)]
    seconds <- as.numeric(sub("^cuvs[-a-z]* total ([0-9.]+) .*$", "\\1",
                              last))
    recall <- grep("^recall ", line, value = TRUE)
    index <- matrix(readBin(result, "integer", (if (nq > 0) nq else n) * k),
                    ncol = k, byrow = TRUE) + 1L
    list(index = index, seconds = seconds,
         recall = if (length(recall)) as.numeric(sub("^recall ", "",
                                                     recall[1L])) else NA)
}
