## Internal: what a search reports to the user (verbose = TRUE).

## Wall-clock seconds to the microsecond: proc.time() rounds down to
## milliseconds on Unix, which a small GPU search does not outlast by much.
.wallSeconds <- function() as.numeric(Sys.time())

.reportRun <- function(info) {
    if (!is.null(info$blocks)) return(.reportBlocks(info))
    gpu <- info$backend == "gpu"
    message(sprintf(paste0("knngpu: %d nodes x %d features, %s, k = %d on %s",
                           " [%s]\n"), info$nodes, info$features, info$metric,
                    info$k, info$device, info$precision),
            if (gpu) sprintf("knngpu: setup %.3f s, ", info$seconds_setup)
            else "knngpu: ",
            sprintf("prepare %.3f s, search %.3f s, re-rank %.3f s, ",
                    info$seconds_prepare, info$seconds_search,
                    info$seconds_rerank),
            if (gpu) sprintf("copy-out %.3f s, ", info$seconds_collect),
            sprintf(paste0("total %.3f s; %.1f candidates per node; ",
                           "tiles %d x %d"), info$elapsed, info$candidates,
                    info$row_tile, info$col_tile),
            if (isTRUE(info$pairs_once)) "; each pair computed once")
}

## A search in blocks (BPPARAM): where the blocks ran, how many a
## checkpoint held already, and the wall time; each block's phases are the
## worker's.
.reportBlocks <- function(info) {
    message(sprintf(paste0("knngpu: %d nodes x %d features, %s, k = %d in ",
                           "%d blocks%s on %s [%s]; total %.3f s"),
                    info$nodes, info$features, info$metric, info$k,
                    info$blocks,
                    if (isTRUE(info$resumed > 0L)) {
                        sprintf(" (%d read from the checkpoint)",
                                info$resumed)
                    } else "",
                    info$device, info$precision, info$elapsed))
}
