## Internal: a knnSearch() result written to an HDF5 file as its blocks of
## query nodes come (knnSearch(filepath =)), for results larger than
## memory; the matrices come back as HDF5Array objects, with the bits of
## the in-memory result.

## NULL, or filepath checked: the path of a file that does not exist yet,
## with HDF5Array installed to write it.
.checkFilepath <- function(filepath) {
    if (is.null(filepath)) return(NULL)
    if (!is.character(filepath) || length(filepath) != 1L ||
        is.na(filepath) || !nzchar(filepath)) {
        stop("'filepath' must be NULL or the path of an HDF5 file to write",
             call. = FALSE)
    }
    if (file.exists(filepath)) {
        stop("'filepath' names a file that exists already: give a new one",
             call. = FALSE)
    }
    if (!requireNamespace("HDF5Array", quietly = TRUE)) {
        stop("'filepath' needs the HDF5Array package (Bioconductor)",
             call. = FALSE)
    }
    filepath
}

## Query nodes per block of a search written to a file without BPPARAM:
## DelayedArray's block size (getAutoBlockSize(), bytes) of result, an
## index, a distance and a weight (4 + 8 + 8 bytes) for each neighbour.
.outputBlockNodes <- function(k) {
    max(1, floor(DelayedArray::getAutoBlockSize() / (20 * k)))
}

## Blocks 1..length(sizes), part(i) giving block i (sizes[i] rows of k
## neighbours, in row order), written as each comes: index and distance
## into the datasets "index" (integer) and "distance" (double) of a new
## HDF5 file, with HDF5Array's dump settings (chunks, compression), so
## that one block at a time is held. Returns list(index, distance) as
## HDF5Matrix objects and the blocks' infos; on error the file is
## removed.
.hdf5Blocks <- function(part, sizes, k, filepath) {
    dims <- c(sum(sizes), as.integer(k))
    grid <- DelayedArray::ArbitraryArrayGrid(list(as.integer(cumsum(sizes)),
                                                  dims[2L]))
    done <- FALSE
    on.exit(if (!done) unlink(filepath))
    sinks <- list(
        index = HDF5Array::HDF5RealizationSink(dims, type = "integer",
                                               filepath = filepath,
                                               name = "index"),
        distance = HDF5Array::HDF5RealizationSink(dims, type = "double",
                                                  filepath = filepath,
                                                  name = "distance"))
    infos <- vector("list", length(sizes))
    for (i in seq_along(sizes)) {
        res <- part(i)
        for (field in names(sinks)) {
            DelayedArray::write_block(sinks[[field]], grid[[i]],
                                      res[[field]])
        }
        infos[[i]] <- res$info
    }
    for (sink in sinks) DelayedArray::close(sink)
    done <- TRUE
    list(index = HDF5Array::HDF5Array(filepath, "index"),
         distance = HDF5Array::HDF5Array(filepath, "distance"),
         infos = infos)
}
