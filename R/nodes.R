## Internal: from what users hand in (matrices, data frames, sparse and
## DelayedArray/HDF5Array matrices, SummarizedExperiments, ExpressionSets,
## reduced dimensions) to the engine's layout, a features x nodes double
## matrix (src/engine/knn.h).

## Which container x is: "SummarizedExperiment" (a SingleCellExperiment
## too), "ExpressionSet", or NA for anything else (matrices, data frames,
## sparse and DelayedArray matrices). Only S4 objects can be either, so a
## plain matrix or data frame costs no class lookup: methods::is() is a
## search's largest fixed cost in R. Asked once per argument
## (.nodeSource()).
.containerKind <- function(x) {
    if (!isS4(x)) return(NA_character_)
    if (methods::is(x, "SummarizedExperiment")) {
        return("SummarizedExperiment")
    }
    if (methods::is(x, "ExpressionSet")) return("ExpressionSet")
    NA_character_
}

## The matrix inside the supported containers (container: .containerKind()
## of x), with samples in columns; with use.dimred, the reduced dimensions
## of a SingleCellExperiment's cells, cells in rows, named by the cells.
## Sparse (Matrix) and DelayedArray matrices stay as they are:
## .readNodes() reads them in blocks.
.extractMatrix <- function(x, assay, arg, use.dimred, container) {
    if (!is.null(use.dimred)) return(.reducedDims(x, use.dimred, arg))
    if (is.matrix(x) && !isS4(x)) return(x)
    if (identical(container, "SummarizedExperiment")) {
        if (!requireNamespace("SummarizedExperiment", quietly = TRUE)) {
            stop(sprintf("'%s' is a SummarizedExperiment but the package ",
                         arg), "SummarizedExperiment is not installed",
                 call. = FALSE)
        }
        return(SummarizedExperiment::assay(x, .chooseAssay(x, assay),
                                           withDimnames = TRUE))
    }
    if (identical(container, "ExpressionSet")) {
        if (!requireNamespace("Biobase", quietly = TRUE)) {
            stop(sprintf("'%s' is an ExpressionSet but Biobase is not ", arg),
                 "installed", call. = FALSE)
        }
        return(Biobase::exprs(x))
    }
    if (is.data.frame(x)) {
        numeric <- vapply(x, is.numeric, logical(1))
        if (!all(numeric)) {
            stop(sprintf("'%s' has non-numeric columns: %s", arg,
                         .nameNodes(names(x)[!numeric])), call. = FALSE)
        }
        m <- as.matrix(x)
        ## No columns or no rows: as.matrix() gives logical(0); the empty
        ## input is then refused as such (.nodeSource).
        if (!is.numeric(m)) storage.mode(m) <- "double"
        return(m)
    }
    x
}

.reducedDims <- function(x, use.dimred, arg) {
    if (!methods::is(x, "SingleCellExperiment")) {
        stop(sprintf("'use.dimred' needs '%s' to be a SingleCellExperiment",
                     arg), call. = FALSE)
    }
    available <- SingleCellExperiment::reducedDimNames(x)
    known <- if (is.character(use.dimred)) use.dimred %in% available
        else .isWholeNumber(use.dimred) && use.dimred >= 1 &&
            use.dimred <= length(available)
    if (length(use.dimred) != 1L || !isTRUE(known)) {
        stop(sprintf("'use.dimred' must name one of the reducedDims of '%s':",
                     arg), " ", paste0('"', available, '"', collapse = ", "),
             call. = FALSE)
    }
    m <- SingleCellExperiment::reducedDim(x, use.dimred)
    if (is.null(rownames(m))) rownames(m) <- colnames(x)
    m
}

## Which kind of matrix m is, for .readNodes(): "dense" (an R matrix),
## "sparse" (a Matrix package matrix of doubles), "delayed" (a DelayedArray
## matrix, e.g. HDF5-backed), or NA for anything else. A DelayedArray whose file
## is gone is an error naming the argument `arg`.
.matrixKind <- function(m, arg) {
    if (is.matrix(m) && !isS4(m)) {
        return(if (is.numeric(m)) "dense" else NA_character_)
    }
    if (methods::is(m, "dMatrix")) return("sparse")
    if (methods::is(m, "DelayedMatrix")) {
        type <- tryCatch(DelayedArray::type(m), error = function(e) {
            stop(sprintf("could not read '%s': %s", arg,
                         conditionMessage(e)), call. = FALSE)
        })
        return(if (type %in% c("double", "integer")) "delayed"
               else NA_character_)
    }
    NA_character_
}

## Node labels: the row (or column) names, else 1-based numbers. Names
## that igraph would refuse as vertex names (NA, empty, repeated) are made
## unique with a message: NA and empty names become the node's number,
## then make.unique() appends ".1", ".2", ... to repeats.
.nodeLabels <- function(m, by, arg) {
    labels <- if (by == "rows") rownames(m) else colnames(m)
    if (is.null(labels)) {
        return(seq_len(if (by == "rows") nrow(m) else ncol(m)))
    }
    missing <- is.na(labels) | !nzchar(labels)
    repeated <- duplicated(labels) & !missing
    if (!any(missing | repeated)) return(labels)
    bad <- which(missing | labels %in% labels[repeated])
    labels[missing] <- as.character(which(missing))
    fixed <- make.unique(labels)
    message(sprintf(paste("knngpu: '%s' has %d NA, empty or repeated %s",
                          "names (%s); using %s instead"), arg, length(bad),
                    if (by == "rows") "row" else "column",
                    .nameNodes(bad), .nameNodes(fixed[bad])))
    fixed
}

## Where the nodes of x are, before any value is read: the matrix (plain,
## sparse or DelayedArray), which of its margins are the nodes, the node
## labels, the nodes' annotation (.nodeAnnotation()), and the argument's
## name and what its nodes are, for messages. hint: whether `by` was left
## to its default, so that a matrix that looks transposed gets a message
## (.orientationHint()).
.nodeSource <- function(x, by, assay = 1L, arg = "x", use.dimred = NULL,
                        hint = FALSE) {
    if (!is.null(use.dimred) && by != "rows") {
        stop("'by' must be \"rows\" with 'use.dimred': the cells are the ",
             "rows of reducedDim()", call. = FALSE)
    }
    container <- .containerKind(x)
    m <- .extractMatrix(x, assay, arg, use.dimred, container)
    kind <- .matrixKind(m, arg)
    if (is.na(kind)) {
        stop(sprintf(paste("'%s' must be a numeric matrix, a data.frame of",
                           "numeric columns, a sparse (Matrix) or",
                           "DelayedArray/HDF5Array matrix, a",
                           "SummarizedExperiment or an ExpressionSet"), arg),
             call. = FALSE)
    }
    if (kind == "sparse") .checkSparse(m, arg)
    what <- if (by == "rows") "rows" else "columns"
    shape <- if (by == "rows") dim(m) else rev(dim(m))  # nodes, features
    if (shape[1L] < 1L) {
        stop(sprintf("'%s' has no %s (nodes)", arg, what), call. = FALSE)
    }
    if (shape[2L] < 1L) {
        stop(sprintf("'%s' has zero features: its %s are empty", arg, what),
             call. = FALSE)
    }
    if (hint && by == "rows" && is.na(container)) {
        .orientationHint(m, arg)
    }
    list(matrix = m, kind = kind, by = by, labels = .nodeLabels(m, by, arg),
         annotation = .nodeAnnotation(x, by, use.dimred, shape[1L],
                                      container),
         what = what, arg = arg, n = shape[1L], p = shape[2L],
         input = .nodeInput(x, assay, use.dimred, container))
}

## The nodes' own annotation as a data.frame with one row per node, for
## the vertices of the graph: rowData() or colData() of a
## SummarizedExperiment (colData for the cells of use.dimred),
## fData() or pData() of an ExpressionSet; only columns of plain values
## (igraph's vertex attributes), renamed where they would take the name
## of the node column ("name"). NULL where there is none. container:
## .containerKind() of x.
.nodeAnnotation <- function(x, by, use.dimred, n, container) {
    if (is.na(container)) return(NULL)
    rows <- by == "rows" && is.null(use.dimred)
    table <- if (container == "SummarizedExperiment") {
        if (rows) SummarizedExperiment::rowData(x)
        else SummarizedExperiment::colData(x)
    } else {
        if (rows) Biobase::fData(x) else Biobase::pData(x)
    }
    if (is.null(table) || ncol(table) == 0L) return(NULL)
    columns <- Filter(function(column) {
        is.atomic(column) && is.null(dim(column)) && length(column) == n
    }, lapply(stats::setNames(seq_len(ncol(table)), colnames(table)),
              function(j) table[[j]]))
    if (!length(columns)) return(NULL)
    names(columns) <- make.unique(c("name", names(columns)))[-1L]
    out <- as.data.frame(columns, stringsAsFactors = FALSE,
                         optional = TRUE)
    rownames(out) <- NULL
    out
}

## A message where the nodes are probably not what the user meant: a
## matrix with far more columns than rows whose column names look like
## genes is most likely WGCNA's datExpr (samples in rows, genes in
## columns), of whose rows, the samples, the graph would be. Cells x PCs
## and genes x samples have more rows than columns and never get it.
.orientationHint <- function(m, arg) {
    columns <- colnames(m)
    if (is.null(columns) || ncol(m) < 5 * nrow(m)) return(invisible(NULL))
    if (mean(.geneLike(columns)) < 0.5) return(invisible(NULL))
    message(sprintf(paste0(
        "knngpu: '%s' has %d rows and %d columns named like genes: %s; ",
        "its rows are the nodes, so this is a graph of %d samples. For ",
        "the genes of a samples x genes matrix (WGCNA's datExpr), use ",
        "by = \"columns\"; by = \"rows\" keeps the samples and silences ",
        "this message."), arg, nrow(m), ncol(m),
        .nameNodes(columns[seq_len(min(3L, ncol(m)))], ncol(m)), nrow(m)))
}

## Whether names look like genes: microarray probe sets, Ensembl,
## RefSeq and Illumina identifiers, or gene symbols (letters and digits,
## starting with a letter) that are not sample, cell or component names
## (GSM123, Sample1, V1, PC1, cell barcodes).
.geneLike <- function(names) {
    names <- as.character(names)
    probe <- grepl(paste0("_at$|_st$|^ENS[A-Z]*[GT][0-9]{6,}|",
                          "^[NX][MR]_[0-9]+|^ILMN_[0-9]+"), names)
    symbol <- grepl("^[A-Za-z][A-Za-z0-9]*([.-][A-Za-z0-9]+)*$", names) &
        nchar(names) >= 2L
    sample <- grepl(paste0("^(GSM|GSE|SRR|ERR|DRR|SRX|SAM[NE]|TCGA|",
                           "sample|Sample|SAMPLE|S|s|V|X|cell|Cell|PC|",
                           "pc|Dim|dim|tSNE|UMAP|comp|Comp)[-_.]?[0-9]+$|",
                           "^[ACGT]{8,}"), names)
    probe | (symbol & !sample)
}

## The nodes `rows` (all when NULL) of a source in the engine's layout, as
## .asNodes() returns them. Non-finite values and nodes the metric cannot
## use are left to the engine, which finds them as it reads the values
## anyway (.stopBadNodes names them). threads: as the search's (NULL: the
## option's), for the layout's own threads.
.readNodes <- function(source, rows = NULL, threads = NULL) {
    threads <- .checkThreads(threads)
    m <- source$matrix
    labels <- source$labels
    ## A worker that unserialised an HDF5Matrix has not loaded the package
    ## of its methods, without which `[` refuses it.
    if (source$kind == "delayed") loadNamespace(attr(class(m), "package"))
    if (!is.null(rows)) {
        m <- if (source$by == "rows") m[rows, , drop = FALSE]
             else m[, rows, drop = FALSE]
        labels <- labels[rows]
    }
    values <- if (source$kind == "dense") {
        .Call(C_knn_nodes, m, source$by == "rows", threads)
    } else {
        .readBlocks(m, source, threads)
    }
    list(values = values, labels = labels, what = source$what,
         arg = source$arg)
}

## A sparse or DelayedArray matrix in the engine's layout, read one block
## of nodes at a time, so no dense copy but the layout itself and one
## block exists. DelayedArray's grid (rowAutoGrid / colAutoGrid, sized by
## getAutoBlockSize()) sets the blocks of a DelayedArray; a sparse matrix
## is transposed first when its rows are the nodes (cheap while sparse),
## so its blocks are column slices.
.readBlocks <- function(m, source, threads) {
    if (source$kind == "sparse" && source$by == "rows") m <- Matrix::t(m)
    by_rows <- source$kind == "delayed" && source$by == "rows"
    n <- if (by_rows) nrow(m) else ncol(m)
    values <- .allocLayout(source, n)
    for (block in .nodeBlocks(m, source$kind, by_rows)) {
        dense <- .readBlock(m, block, by_rows, source)
        values[, block] <- .Call(C_knn_nodes, dense, by_rows, threads)
    }
    values
}

## Nodes `block` of m as a dense matrix, or an error naming the argument
## and the nodes that could not be read (a moved HDF5 file, a bad seed).
.readBlock <- function(m, block, by_rows, source) {
    tryCatch(as.matrix(if (by_rows) m[block, , drop = FALSE]
                       else m[, block, drop = FALSE]),
             error = function(e) {
                 stop(sprintf("could not read %s %d to %d of '%s': %s",
                              source$what, block[1L], block[length(block)],
                              source$arg, conditionMessage(e)), call. = FALSE)
             })
}

## Consecutive blocks of node numbers, as ranges: DelayedArray's automatic
## grid for a DelayedArray, blocks of about 16 MB of dense values for a
## sparse matrix.
.nodeBlocks <- function(m, kind, by_rows) {
    n <- if (by_rows) nrow(m) else ncol(m)
    size <- if (kind == "delayed") {
        grid <- if (by_rows) DelayedArray::rowAutoGrid(m)
                else DelayedArray::colAutoGrid(m)
        dims <- dim(grid[[1L]])
        if (by_rows) dims[1L] else dims[2L]
    } else {
        max(1L, floor(2^21 / nrow(m)))
    }
    starts <- seq.int(1L, n, by = size)
    lapply(starts, function(s) seq.int(s, min(n, s + size - 1L)))
}

## The p x n double matrix of the layout, or an error that says how much
## memory it needs: the engine works on dense float64 values.
.allocLayout <- function(source, n) {
    tryCatch(matrix(0, source$p, n), error = function(e) {
        stop(sprintf(paste("'%s' needs %s of memory as the engine's dense",
                           "float64 layout (%d features x %d nodes), more",
                           "than R could allocate: %s"), source$arg,
                     .formatBytes(8 * as.double(source$p) * n), source$p,
                     n, conditionMessage(e)), call. = FALSE)
    })
}

.formatBytes <- function(bytes) {
    units <- c("bytes", "KB", "MB", "GB", "TB")
    power <- min(length(units) - 1L, max(0L, floor(log(bytes, 1024))))
    sprintf("%.1f %s", bytes / 1024^power, units[power + 1L])
}

## Converts x to what the engine takes: a double matrix with one column per
## node (features x nodes), plus the node labels and the argument's name
## for messages.
.asNodes <- function(x, by, assay = 1L, arg = "x", use.dimred = NULL) {
    .readNodes(.nodeSource(x, by, assay, arg, use.dimred))
}
