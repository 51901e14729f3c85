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
## How the results come back: each worker writes its blocks to files in a
## block directory, and this process reads them once all have run, so a
## block whose file is missing is one that did not finish, whatever ended
## it: a worker's error, or a job that its scheduler cancelled or that ran
## out of time or memory, which BatchtoolsParam reports without naming.
## The block directory is the search's `checkpoint` where one is given,
## else a new directory in the transfer directory, removed at the end.
##
## Resuming: a checkpoint follows batchtools' registry (a directory in
## which each job's result is written as it finishes; a rerun submits only
## the jobs not done), for any BPPARAM. BatchtoolsParam's own registry
## cannot serve: BiocParallel makes a new one on every bpstart(); nor can
## BPREDO, which keeps the finished results only in the R session that
## ran them. A key of the data, k, metric and blocks, written beside the
## blocks, keeps a rerun from taking another search's blocks.
##
## Equality with one process: a block of a self search is a query search
## of the block's nodes for k + 1 neighbours with each node then dropped
## from its own row, which ranks by the same exact keys as the self search,
## so every block count gives the same bits.

## BPPARAM as given, or NULL for one process (NULL, or a BiocParallelParam
## with one worker and at most one task), which a checkpoint cannot have.
.checkBPPARAM <- function(BPPARAM, checkpoint = NULL) {
    if (!is.null(BPPARAM) && !methods::is(BPPARAM, "BiocParallelParam")) {
        stop("'BPPARAM' must be NULL or a BiocParallelParam (e.g. ",
             "BiocParallel::SnowParam(4))", call. = FALSE)
    }
    if (is.null(BPPARAM) ||
        .blockCount(BPPARAM, .Machine$integer.max) == 1L) {
        if (!is.null(checkpoint)) {
            stop("'checkpoint' needs a 'BPPARAM' with more than one worker ",
                 "or task: it keeps the blocks that they search",
                 call. = FALSE)
        }
        return(NULL)
    }
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
                          precision = "auto", use = "everything",
                          min.shared = 1L) {
    force(list(metric, device, threads, devices, precision, use,
               min.shared))
    function(ref, query, k) {
        .runEngine(ref, query, k, metric, device, threads, FALSE, FALSE,
                   devices, precision = precision, use = use,
                   min.shared = min.shared)
    }
}

## knnSearch()'s and knnGraph()'s search in blocks (BPPARAM, or a result
## written to filepath): the arguments that every worker would check
## checked once here (a GPU, which only a worker may have, is the
## worker's to find), then .searchBlocks().
.searchInBlocks <- function(ref, query, k, metric, device, threads,
                            progress, verbose, devices, BPPARAM,
                            precision = "auto", checkpoint = NULL,
                            filepath = NULL, use = "everything",
                            min.shared = 1L) {
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
                                       precision, use, min.shared),
                         BPPARAM,
                         .checkpoint(checkpoint, c(metric = metric, use = use,
                                                   min.shared = min.shared)),
                         filepath)
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
## .engineRunner(); BPPARAM from .checkBPPARAM() (NULL: this process);
## checkpoint from .checkpoint(); filepath NULL, or an HDF5 file for the
## result, written as its blocks come (without BPPARAM, blocks of
## .outputBlockNodes() searched in this process). Returns list(index,
## distance, weight, info), one row per query row, as one engine run
## would; info$resumed counts the blocks read from the checkpoint rather
## than searched.
.searchBlocks <- function(ref, query, rows, k, search, BPPARAM,
                          checkpoint = NULL, filepath = NULL) {
    start <- .wallSeconds()
    n <- if (is.null(query)) ref$n else query$n
    if (is.null(rows)) rows <- seq_len(n)
    if (is.null(BPPARAM) && is.null(filepath)) {
        res <- .searchBlock(.readNodes(ref), query, rows, k, search)
        res$info$elapsed <- .wallSeconds() - start
        return(res)
    }
    if (is.null(BPPARAM)) {
        refNodes <- .readNodes(ref)
        blocks <- .splitRows(rows, ceiling(length(rows) /
                                           .outputBlockNodes(k)))
        res <- .collectBlocks(function(i) {
            .searchBlock(refNodes, query, blocks[[i]], k, search)
        }, lengths(blocks), k, filepath)
        res$info$elapsed <- .wallSeconds() - start
        return(res)
    }
    blocks <- .splitRows(rows, .blockCount(BPPARAM, length(rows)))
    handle <- .shareSources(ref, query)
    on.exit(unlink(dirname(handle$path), recursive = TRUE))
    store <- .blockStore(checkpoint, handle, k, blocks)
    on.exit({
        if (!store$keep) unlink(store$dir, recursive = TRUE)
        .workerForget()
    }, add = TRUE)
    todo <- which(!file.exists(.blockFile(store, seq_along(blocks))))
    if (length(todo)) {
        tasks <- lapply(todo, function(i) list(block = i, rows = blocks[[i]]))
        parts <- tryCatch(BiocParallel::bptry(.stoppingWorkers(
            BiocParallel::bplapply(tasks, .blockTask(handle, k, search, store),
                                   BPPARAM = BPPARAM), store, BPPARAM)),
            error = identity)
        .stopUnwritten(store, blocks, todo, parts,
                       if (is.null(query)) ref else query)
    }
    res <- .collectBlocks(function(i) readRDS(.blockFile(store, i)),
                          lengths(blocks), k, filepath)
    res$info$elapsed <- .wallSeconds() - start
    res$info$resumed <- length(blocks) - length(todo)
    res
}

## rows in `count` blocks of consecutive rows, as even as they divide.
.splitRows <- function(rows, count) {
    if (count <= 1L) return(list(rows))
    unname(split(rows, cut(seq_along(rows), count, labels = FALSE)))
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
    own <- !is.na(res$index) & res$index == rows
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

## A search's checkpoint: NULL, or the directory (an existing one, or one
## to create) with the metric (and the missing-value handling, `use` and
## `min.shared`), which with the data, k and blocks makes the key of its
## blocks.
.checkpoint <- function(checkpoint, metric) {
    if (is.null(checkpoint)) return(NULL)
    if (!is.character(checkpoint) || length(checkpoint) != 1L ||
        is.na(checkpoint) || !nzchar(checkpoint)) {
        stop("'checkpoint' must be NULL or the path of a directory",
             call. = FALSE)
    }
    list(dir = checkpoint, metric = metric)
}

## Where the workers write their blocks (see the top of this file):
## list(dir, keep, count, stop), keep saying whether the files outlast the
## search, stop the file (.stoppingWorkers()) that stops the workers.
.blockStore <- function(checkpoint, handle, k, blocks) {
    count <- length(blocks)
    if (is.null(checkpoint)) {
        dir <- file.path(.transferDir(), paste0(handle$token, "-blocks"))
        if (!dir.create(dir, mode = "0700")) {
            stop("cannot create a directory in option ",
                 "'knngpu.transfer.dir'", call. = FALSE)
        }
        return(list(dir = dir, keep = FALSE, count = count,
                    stop = file.path(dir, "stop")))
    }
    dir <- checkpoint$dir
    if (!dir.exists(dir) && !dir.create(dir, recursive = TRUE)) {
        stop("'checkpoint' names a directory that cannot be created: ", dir,
             call. = FALSE)
    }
    key <- .searchKey(handle, k, checkpoint$metric, blocks)
    keyFile <- file.path(dir, "search.key")
    if (file.exists(keyFile)) {
        if (!identical(readLines(keyFile, warn = FALSE), key)) {
            stop("'checkpoint' holds the blocks of another search (other ",
                 "data, k, metric or block count): give a new directory",
                 call. = FALSE)
        }
    } else if (length(list.files(dir, all.files = TRUE, no.. = TRUE))) {
        stop("'checkpoint' must be a new or empty directory, or one that ",
             "the same search wrote", call. = FALSE)
    } else {
        writeLines(key, keyFile)
    }
    stopFile <- file.path(dir, "stop")
    unlink(stopFile)
    list(dir = dir, keep = TRUE, count = count, stop = stopFile)
}

## Evaluates `run` (the workers' bplapply()) so that an interrupt of this
## process stops the workers too: at the interrupt, before any frame
## unwinds, the store's stop file appears, which the workers' searches
## watch with its directory (src/callbacks.c). BiocParallel would
## otherwise wait, while unwinding, for the blocks that its workers are
## searching (SnowParam), or leave them searching (MulticoreParam). The
## file stays for workers that have not looked yet: the store's
## directory goes with it, or a rerun on a checkpoint removes it.
## A MulticoreParam that bplapply() starts forks a process per block,
## which after its block waits until this process reads its result:
## after an interrupt nothing would, and each would keep its memory for
## the rest of the session, so they are read here (.collectForked()).
.stoppingWorkers <- function(run, store, BPPARAM) {
    forked <- methods::is(BPPARAM, "MulticoreParam") &&
        !BiocParallel::bpisup(BPPARAM)
    stopped <- FALSE
    on.exit({
        if (stopped && forked) .collectForked(store)
        unlink(list.files(store$dir, "^worker-[0-9]+$", full.names = TRUE))
    })
    withCallingHandlers(run, interrupt = function(condition) {
        stopped <<- TRUE
        file.create(store$stop, showWarnings = FALSE)
    })
}

## Reads (parallel::mccollect()) the results of the processes that this
## process forked for the store's blocks (each named itself in the store,
## .blockTask()) and that stopped after an interrupt, which lets them
## exit; waits for them at most `seconds`.
.collectForked <- function(store, seconds = 2) {
    pids <- as.integer(sub("^worker-", "",
                           list.files(store$dir, "^worker-[0-9]+$")))
    limit <- .wallSeconds() + seconds
    while (length(pids) && .wallSeconds() < limit) {
        done <- parallel::mccollect(pids, wait = FALSE, timeout = 0.05)
        pids <- setdiff(pids, as.integer(names(done)))
    }
    invisible(NULL)
}

## What decides a search's bits: its data (the transfer file's checksum,
## or the file-backed sources, which name their files), k, the metric and
## the blocks, as one checksum.
.searchKey <- function(handle, k, metric, blocks) {
    data <- if (length(handle$path)) unname(tools::md5sum(handle$path))
            else handle$sources
    file <- tempfile("knngpu-key")
    on.exit(unlink(file))
    saveRDS(list(data = data, k = k, metric = metric, blocks = blocks), file,
            compress = FALSE)
    unname(tools::md5sum(file))
}

.blockFile <- function(store, block) {
    file.path(store$dir, sprintf("block-%d-of-%d.rds", block, store$count))
}

## A block's result, written under another name and then renamed, so that
## a worker ended while writing leaves no file that looks finished.
.writeBlock <- function(store, block, res) {
    part <- tempfile(".block", tmpdir = store$dir)
    saveRDS(res, part, compress = FALSE)
    if (!file.rename(part, .blockFile(store, block))) {
        unlink(part)
        stop(sprintf("cannot write block %d to %s", block, store$dir),
             call. = FALSE)
    }
    invisible(TRUE)
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
## next, then one block, list(block, rows), searched and written; none
## once the store's stop file exists, which also stops a search under way.
.blockTask <- function(handle, k, search, store) {
    force(list(handle, k, search, store))
    function(task) {
        if (file.exists(store$stop) || !dir.exists(store$dir)) {
            stop("the search was stopped: the R session that started it ",
                 "was interrupted", call. = FALSE)
        }
        file.create(file.path(store$dir, paste0("worker-", Sys.getpid())))
        .Call(C_knn_stop_file, store$stop)
        on.exit(.Call(C_knn_stop_file, NULL))
        shared <- .workerShared(handle)
        .writeBlock(store, task$block,
                    .searchBlock(shared$ref, shared$query, task$rows, k,
                                 search))
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

## Stops naming the first block of `todo` that was not written (with its
## first and last query node) and why: the first error a worker raised on
## an unwritten block (a block left unevaluated after another's error is
## not the one named), else that its worker ended without writing it, a
## job the scheduler cancelled or ended, with what BiocParallel said.
## parts: bplapply()'s results for `todo`, or the condition it stopped
## with.
.stopUnwritten <- function(store, blocks, todo, parts, source) {
    missing <- todo[!file.exists(.blockFile(store, todo))]
    if (!length(missing)) return(invisible(NULL))
    ended <- paste("its worker ended without writing it (a job cancelled,",
                   "or out of time or memory)")
    if (inherits(parts, "condition")) {
        first <- missing[1L]
        why <- paste0(ended, "; BiocParallel: ", conditionMessage(parts))
    } else {
        errors <- parts[match(missing, todo)]
        raised <- vapply(errors, function(e) {
            inherits(e, "condition") && !inherits(e, "unevaluated_error")
        }, logical(1))
        at <- if (any(raised)) which(raised)[1L] else 1L
        first <- missing[at]
        why <- if (any(raised)) conditionMessage(errors[[at]]) else ended
    }
    rows <- blocks[[first]]
    kept <- length(blocks) - length(missing)
    stop(sprintf(paste("a BiocParallel worker failed on block %d of %d",
                       "('%s' %s %s to %s; %d block(s) failed): %s%s"),
                 first, length(blocks), source$arg, source$what,
                 source$labels[rows[1L]], source$labels[rows[length(rows)]],
                 length(missing), why,
                 if (store$keep && kept) {
                     sprintf(paste0("; %d finished block(s) stay in ",
                                    "'checkpoint' for a rerun"), kept)
                 } else ""), call. = FALSE)
}

## The blocks' results in row order, part(i) giving block i's (sizes[i]
## rows of k), with one description of the run: the devices and
## precisions the blocks used, and their count. Bound in memory, or, with
## filepath, written to that HDF5 file as each comes (.hdf5Blocks(); no
## weight then).
.collectBlocks <- function(part, sizes, k, filepath) {
    if (is.null(filepath)) {
        parts <- lapply(seq_along(sizes), part)
        bind <- function(field) do.call(rbind, lapply(parts, `[[`, field))
        res <- list(index = bind("index"), distance = bind("distance"),
                    weight = bind("weight"))
        infos <- lapply(parts, `[[`, "info")
    } else {
        res <- .hdf5Blocks(part, sizes, k, filepath)
        infos <- res$infos
        res$infos <- NULL
    }
    about <- function(field) {
        paste(unique(vapply(infos, `[[`, character(1), field)),
              collapse = "; ")
    }
    info <- infos[[1L]]
    for (field in c("backend", "device", "precision")) {
        info[[field]] <- about(field)
    }
    info$blocks <- length(sizes)
    res$info <- info
    res
}
