## Internal: the single-cell defaults of the verbs, those of the tools
## users compare with (scran, bluster, scater).

## The metric when none is given: Euclidean on reduced dimensions, as
## scran and bluster search PCs; Pearson, the co-expression metric,
## otherwise.
.defaultMetric <- function(metric, use.dimred) {
    if (!is.null(metric)) return(metric)
    if (is.null(use.dimred)) "pearson" else "euclidean"
}

## The assay of a SummarizedExperiment to search: as given, else
## "logcounts" where there is one (scater's convention), else the first.
.chooseAssay <- function(x, assay) {
    if (!is.null(assay)) return(assay)
    if ("logcounts" %in% SummarizedExperiment::assayNames(x)) "logcounts"
    else 1L
}

## What of x was searched, for the result's attributes: list(reducedDim =
## its name or number) or list(assay = its name, else number); empty for
## anything but a SummarizedExperiment (container: .containerKind() of x).
.nodeInput <- function(x, assay, use.dimred, container) {
    if (!is.null(use.dimred)) return(list(reducedDim = use.dimred))
    if (!identical(container, "SummarizedExperiment")) return(list())
    assay <- .chooseAssay(x, assay)
    named <- SummarizedExperiment::assayNames(x)
    if (is.numeric(assay) && length(named) >= assay && nzchar(named[assay])) {
        assay <- named[assay]
    }
    list(assay = assay)
}
