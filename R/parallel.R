## Internal: searches split into blocks of query nodes, each block a
## BiocParallel task searching the whole reference (BPPARAM of knnGraph,
## knnSearch and KnngpuParam's searches).
##
## How the data reaches the workers: once per worker, not once per block.
## The task function holds only a small handle. Where the nodes live in
## files already (HDF5Array and other file-backed DelayedArray matrices),
## the handle is the matrix object itself, which names its file; anything
## else is saved once to a file in getOption("knngpu.transfer.dir",
## tempdir()) (on a cluster, a directory every node sees). A worker reads
## the reference into the engine's layout on its first block and keeps it
## for the others; each block then reads only its own query nodes.
##
## Equality with one process: a block of a self search is a query search
## of the block's nodes for k + 1 neighbours with each node then dropped
## from its own row, which ranks by the same exact keys as the self search,
## so every block count gives the same bits.

## BPPARAM as given, or NULL for one process (NULL, or a BiocParallelParam
## with one worker and at most one task).
.checkBPPARAM <- function(BPPARAM) {
    if (is.null(BPPARAM)) return(NULL)
    if (!methods::is(BPPARAM, "BiocParallelParam")) {
        stop("'BPPARAM' must be NULL or a BiocParallelParam (e.g. ",
             "BiocParallel::SnowParam(4))", call. = FALSE)
    }
    if (.blockCount(BPPARAM, .Machine$integer.max) == 1L) return(NULL)
    BPPARAM
}

## Blocks for n query nodes: one per worker, or BPPARAM's task count when
## it asks for more (smaller blocks balance uneven workers).
.blockCount <- function(BPPARAM, n) {
    wanted <- max(BiocParallel::bpnworkers(BPPARAM),
                  BiocParallel::bptasks(BPPARAM), 1L)
    as.integer(min(wanted, n))
}

## A layout that .asNodes() made, as a node source (.nodeSource()).
.layoutSource <- function(nodes) {
    list(matrix = nodes$values, kind = "dense", by = "columns",
         labels = nodes$labels, what = nodes$what, arg = nodes$arg,
         n = ncol(nodes$values), p = nrow(nodes$values))
}

## What a block search needs besides the nodes: runs the engine on
## (ref, query, k) with these settings. Made here so that the function
## carries nothing but them to the workers.
.engineRunner <- function(metric, device, threads, devices,
                          precision = "auto") {
    force(list(metric, device, threads, devices, precision))
    function(ref, query, k) {
        .runEngine(ref, query, k, metric, device, threads, FALSE, FALSE,
                   devices, precision = precision)
    }
}

## knnSearch()'s and knnGraph()'s search with BPPARAM: the arguments that
## every worker would check checked once here (a GPU, which only a worker
## may have, is the worker's to find), then .searchBlocks().
.searchInBlocks <- function(ref, query, k, metric, device, threads,
                            progress, verbose, devices, BPPARAM,
                            precision = "auto") {
    device <- .checkChoice(device, c("auto", "cpu", "gpu"), "device")
    precision <- .checkPrecision(precision,
                                 if (device != "auto") device)
    threads <- .workerThreads(.checkThreads(threads), BPPARAM)
    .checkFlag(progress, "progress")
    verbose <- .checkFlag(verbose, "verbose")
    devices <- .checkDeviceIds(devices)
    .transferDir()
    res <- .searchBlocks(ref, query, NULL, k,
                         .engineRunner(metric, device, threads, devices,
                                       precision),
                         BPPARAM)
    if (verbose) .reportRun(res$info)
    res
}

## CPU threads of each worker: as asked; else, for workers on this machine
## (SnowParam, MulticoreParam), the cores shared among them, since each
## engine would otherwise start a thread per core; else (a cluster's
## workers, each on its own node) all of the worker's cores.
.workerThreads <- function(threads, BPPARAM) {
    local <- methods::is(BPPARAM, "SnowParam") ||
        methods::is(BPPARAM, "MulticoreParam")
    if (threads > 0L || !local) return(threads)
    cores <- parallel::detectCores()
    if (is.na(cores)) return(0L)
    max(1L, as.integer(cores %/% BiocParallel::bpnworkers(BPPARAM)))
}

## Searches the query nodes `rows` (all when NULL) among the nodes of
## `ref` for k neighbours each; query NULL is a self search of ref. ref and
## query are node sources (.nodeSource(), .layoutSource()); search is an
## .engineRunner(); BPPARAM from .checkBPPARAM() (NULL: this process).
## Returns list(index, distance, weight, info), one row per query row, as
## one engine run would.
.searchBlocks <- function(ref, query, rows, k, search, BPPARAM) {
    start <- .wallSeconds()
    n <- if (is.null(query)) ref$n else query$n
    if (is.null(rows)) rows <- seq_len(n)
    if (is.null(BPPARAM)) {
        res <- .searchBlock(.readNodes(ref), query, rows, k, search)
        res$info$elapsed <- .wallSeconds() - start
        return(res)
    }
    blocks <- split(rows, cut(seq_along(rows), .blockCount(BPPARAM,
                                                           length(rows)),
                              labels = FALSE))
    handle <- .shareSources(ref, query)
    on.exit({
        unlink(dirname(handle$path), recursive = TRUE)
        .workerForget()
    })
    parts <- BiocParallel::bptry(BiocParallel::bplapply(
        blocks, .blockTask(handle, k, search), BPPARAM = BPPARAM))
    .stopFailedBlock(parts, blocks, if (is.null(query)) ref else query)
    .bindBlocks(parts, .wallSeconds() - start)
}

## One block in this process: its query nodes read (or, in a self search,
## taken from ref) and searched.
.searchBlock <- function(refNodes, query, rows, k, search) {
    if (!is.null(query)) {
        return(search(refNodes, .readNodes(query, rows), k))
    }
    if (identical(as.integer(rows), seq_len(ncol(refNodes$values)))) {
        return(search(refNodes, NULL, k))
    }
    .dropSelf(search(refNodes, .nodesSubset(refNodes, rows), k + 1L),
              rows, k)
}

.nodesSubset <- function(nodes, rows) {
    nodes$values <- nodes$values[, rows, drop = FALSE]
    nodes$labels <- nodes$labels[rows]
    nodes
}

## Self-search rows from a query search of nodes `rows` for k + 1: each
## node dropped from its own row (or, where it is not among them, the last
## column: then k + 1 others all rank before it).
.dropSelf <- function(res, rows, k) {
    own <- res$index == rows
    drop <- ifelse(rowSums(own) > 0L, max.col(own, ties.method = "first"),
                   k + 1L)
    keep <- matrix(TRUE, length(rows), k + 1L)
    keep[cbind(seq_along(rows), drop)] <- FALSE
    for (field in c("index", "distance", "weight")) {
        res[[field]] <- matrix(t(res[[field]])[t(keep)], ncol = k,
                               byrow = TRUE)
    }
    res
}

## The handle a task carries: the sources themselves when their matrices
## are files already, else the path of one file holding them.
.shareSources <- function(ref, query) {
    sources <- list(ref = ref, query = query)
    token <- basename(tempfile("knngpu"))
    if (all(vapply(sources, .fileBacked, logical(1)))) {
        return(list(token = token, sources = sources, path = character()))
    }
    path <- .privateFile(.transferDir(), token)
    saveRDS(sources, path, compress = FALSE)
    Sys.chmod(path, "0600", use_umask = FALSE)
    list(token = token, sources = NULL, path = path)
}

## A path for a file only this user reads, in a shared directory: inside
## a directory of its own, new (mkdir fails on any existing name, a
## planted link included, so nothing is followed) and of mode 0700.
## Unlink the file's directory to remove both.
.privateFile <- function(dir, token) {
    for (attempt in seq_len(100L)) {
        home <- tempfile(paste0(token, "-"), tmpdir = dir)
        if (dir.create(home, showWarnings = FALSE, mode = "0700")) {
            Sys.chmod(home, "0700", use_umask = FALSE)
            return(file.path(home, "sources.rds"))
        }
    }
    stop("could not create a directory of its own in option ",
         "'knngpu.transfer.dir'", call. = FALSE)
}

## getOption("knngpu.transfer.dir", tempdir()), checked: one existing
## directory.
.transferDir <- function() {
    dir <- getOption("knngpu.transfer.dir", tempdir())
    if (!is.character(dir) || length(dir) != 1L || is.na(dir) ||
        !dir.exists(dir)) {
        stop("option 'knngpu.transfer.dir' must name an existing directory",
             call. = FALSE)
    }
    dir
}

## Whether a source (or NULL) names its data by file: a DelayedArray whose
## seeds are all on disk (path() answers for each of them).
.fileBacked <- function(source) {
    if (is.null(source)) return(TRUE)
    if (source$kind != "delayed") return(FALSE)
    paths <- tryCatch(DelayedArray::seedApply(source$matrix,
                                              BiocGenerics::path),
                      error = function(e) NULL)
    length(paths) > 0L && all(nzchar(unlist(paths)))
}

## The task function: the reference in the engine's layout, read on a
## worker's first block and kept (one search's worth, by token) for the
## next, then one block searched.
.blockTask <- function(handle, k, search) {
    force(list(handle, k, search))
    function(rows) {
        shared <- .workerShared(handle)
        .searchBlock(shared$ref, shared$query, rows, k, search)
    }
}

.workerShared <- function(handle) {
    kept <- .state$shared
    if (identical(kept$token, handle$token)) return(kept)
    .state$shared <- NULL
    sources <- if (length(handle$path)) readRDS(handle$path)
               else handle$sources
    kept <- list(token = handle$token, ref = .readNodes(sources$ref),
                 query = sources$query)
    .state$shared <- kept
    kept
}

## Drops what .workerShared() kept (the master runs blocks itself with
## SerialParam-like params, and must not keep a reference after a search).
.workerForget <- function() .state$shared <- NULL

## Stops naming the first block whose worker failed (with its first and
## last query node) and the worker's error; nothing of the others is
## returned.
.stopFailedBlock <- function(parts, blocks, source) {
    failed <- which(!BiocParallel::bpok(parts))
    if (!length(failed)) return(invisible(NULL))
    first <- failed[1L]
    rows <- blocks[[first]]
    why <- parts[[first]]
    why <- if (inherits(why, "condition")) conditionMessage(why)
           else as.character(why)
    stop(sprintf(paste("a BiocParallel worker failed on block %d of %d",
                       "('%s' %s %s to %s; %d block(s) failed): %s"), first,
                 length(blocks), source$arg, source$what,
                 source$labels[rows[1L]], source$labels[rows[length(rows)]],
                 length(failed), why), call. = FALSE)
}

## The blocks' results in row order, with one description of the run: the
## devices and precisions the workers used, the blocks, the wall time.
.bindBlocks <- function(parts, elapsed) {
    bind <- function(field) do.call(rbind, lapply(parts, `[[`, field))
    infos <- lapply(parts, `[[`, "info")
    about <- function(field) {
        paste(unique(vapply(infos, `[[`, character(1), field)),
              collapse = "; ")
    }
    info <- infos[[1L]]
    for (field in c("backend", "device", "precision")) {
        info[[field]] <- about(field)
    }
    info$blocks <- length(parts)
    info$elapsed <- elapsed
    list(index = bind("index"), distance = bind("distance"),
         weight = bind("weight"), info = info)
}
