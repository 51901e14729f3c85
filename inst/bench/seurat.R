## seuratNeighbors() against Seurat's own FindNeighbors() with its exact
## method (nn.method = "rann", nn.eps = 0) on one Seurat object: the nn and
## snn Graphs must be identical, and FindClusters() must give the same
## clusters on both; the times of both are printed beside.
##
## Usage, from the repository root, with knngpu and Seurat installed:
##   Rscript inst/bench/seurat.R [--cells=20000] [--dims=10] [--k=20]
##                               [--prune=0.0666667] [--device=auto]
##   --cells   cells of the object: a mixture of 15 Gaussian clusters of
##             different sizes and spreads in 30 principal components
##             (set.seed(20261126)), so that FindClusters() has real
##             clusters to find and no two cells are at equal distance
##   --dims    the first dims components are searched (FindNeighbors'
##             dims = 1:dims)
##   --k       k.param; --prune: prune.SNN (default Seurat's 1/15)
##   --device  knngpu's device
##
## Exits with status 1 where anything differs, so that it serves as a
## check too.

suppressPackageStartupMessages({
    library(knngpu)
    library(Seurat)
})
source("tools/args.R")

cells <- as.integer(argValue("cells", "20000"))
dims <- seq_len(as.integer(argValue("dims", "10")))
k <- as.integer(argValue("k", "20"))
prune <- as.numeric(argValue("prune", as.character(1 / 15)))
device <- argValue("device", "auto")

## A Seurat object of `cells` cells whose "pca" reduction is a mixture of
## Gaussian clusters (the counts are a placeholder: only the reduction is
## searched).
clusteredObject <- function(cells, seed) {
    set.seed(seed)
    groups <- 15L
    pcs <- 30L
    centres <- matrix(stats::rnorm(groups * pcs, sd = 4), groups)
    member <- sample(groups, cells, replace = TRUE,
                     prob = stats::runif(groups, 0.3, 1))
    spread <- stats::runif(groups, 0.5, 2)[member]
    embedding <- centres[member, ] +
        matrix(stats::rnorm(cells * pcs), cells) * spread
    names <- paste0("cell", seq_len(cells))
    dimnames(embedding) <- list(names, paste0("PC_", seq_len(pcs)))
    counts <- matrix(stats::rpois(20 * cells, 1), 20, cells,
                     dimnames = list(paste0("g", 1:20), names))
    obj <- SeuratObject::CreateSeuratObject(
        Matrix::Matrix(counts, sparse = TRUE))
    obj[["pca"]] <- SeuratObject::CreateDimReducObject(
        embeddings = embedding, key = "PC_", assay = "RNA")
    obj
}

seconds <- function(expr) {
    start <- Sys.time()
    force(expr)
    as.numeric(Sys.time()) - as.numeric(start)
}

cat(sprintf("knngpu %s, Seurat %s, SeuratObject %s, R %s, %d cores, %s\n",
            utils::packageVersion("knngpu"), utils::packageVersion("Seurat"),
            utils::packageVersion("SeuratObject"), getRversion(),
            parallel::detectCores(), format(Sys.time(), tz = "UTC",
                                            usetz = TRUE)))
obj <- clusteredObject(cells, 20261126)
cat(sprintf("%d cells, dims 1:%d, k.param %d, prune.SNN %.6g\n", cells,
            length(dims), k, prune))

theirs <- NULL
mine <- NULL
tSeurat <- seconds(theirs <- FindNeighbors(
    obj, dims = dims, k.param = k, prune.SNN = prune, nn.method = "rann",
    nn.eps = 0, verbose = FALSE))
tKnngpu <- seconds(mine <- seuratNeighbors(
    obj, dims = dims, k.param = k, prune.SNN = prune, device = device,
    progress = FALSE))
cat(sprintf("%-46s %8.2f s\n",
            "FindNeighbors(nn.method = \"rann\", nn.eps = 0)", tSeurat))
cat(sprintf("%-46s %8.2f s\n", "seuratNeighbors()", tKnngpu))

same <- c(
    graphs = identical(sort(names(mine@graphs)), sort(names(theirs@graphs))),
    nn = identical(mine[["RNA_nn"]], theirs[["RNA_nn"]]),
    snn = identical(mine[["RNA_snn"]], theirs[["RNA_snn"]]))
cat(sprintf("nn graph: %d non-zeros, snn graph: %d non-zeros\n",
            length(theirs[["RNA_nn"]]@x), length(theirs[["RNA_snn"]]@x)))

clustersOf <- function(o) {
    FindClusters(o, graph.name = "RNA_snn", verbose = FALSE)$seurat_clusters
}
ours <- clustersOf(mine)
reference <- clustersOf(theirs)
same["clusters"] <- identical(ours, reference)
cat(sprintf("FindClusters: %d clusters\n", nlevels(reference)))
for (what in names(same)) {
    cat(sprintf("identical %-9s %s\n", what, same[[what]]))
}
if (!all(same)) quit(status = 1)
