## seuratNeighbors() (R/seuratNeighbors.R) against Seurat's own
## FindNeighbors(nn.method = "rann", nn.eps = 0), its exact method.

## A Seurat object of n cells with random principal components (no two
## cells at equal distance, so that RANN's order of ties does not matter).
seuratObject <- function(n, seed) {
    set.seed(seed)
    counts <- matrix(stats::rpois(30 * n, 1), 30, n,
                     dimnames = list(paste0("g", 1:30), paste0("c", 1:n)))
    ## Sparse, as SeuratObject 5 would otherwise convert it with a warning.
    obj <- SeuratObject::CreateSeuratObject(
        Matrix::Matrix(counts, sparse = TRUE))
    pcs <- matrix(stats::rnorm(n * 12), n, 12,
                  dimnames = list(colnames(obj), paste0("PC_", 1:12)))
    obj[["pca"]] <- SeuratObject::CreateDimReducObject(
        embeddings = pcs, key = "PC_", assay = "RNA")
    obj
}

test_that("the nn and snn Graphs are FindNeighbors' and cluster alike", {
    skip_if_not_installed("Seurat")
    obj <- seuratObject(1500, 81)
    theirs <- Seurat::FindNeighbors(obj, dims = 1:10, k.param = 20,
                                    nn.method = "rann", nn.eps = 0,
                                    verbose = FALSE)
    mine <- seuratNeighbors(obj, dims = 1:10, k.param = 20, device = "cpu")
    expect_setequal(names(mine@graphs), c("RNA_nn", "RNA_snn"))
    expect_identical(mine@graphs[names(theirs@graphs)], theirs@graphs)
    expect_identical(
        Seurat::FindClusters(mine, verbose = FALSE)$seurat_clusters,
        Seurat::FindClusters(theirs, verbose = FALSE)$seurat_clusters)
    ## Other k.param, no pruning, fewer dims, another name.
    theirs <- Seurat::FindNeighbors(obj, dims = 2:6, k.param = 7,
                                    prune.SNN = 0, nn.method = "rann",
                                    graph.name = c("a", "b"),
                                    verbose = FALSE)
    mine <- seuratNeighbors(obj, dims = 2:6, k.param = 7, prune.SNN = 0,
                            graph.name = c("a", "b"), device = "cpu")
    expect_identical(mine[["a"]], theirs[["a"]])
    expect_identical(mine[["b"]], theirs[["b"]])
})

test_that("return.neighbor stores FindNeighbors' Neighbor object", {
    skip_if_not_installed("Seurat")
    obj <- seuratObject(400, 82)
    theirs <- suppressMessages(Seurat::FindNeighbors(
        obj, dims = 1:8, k.param = 9, nn.method = "rann",
        return.neighbor = TRUE, verbose = FALSE))
    mine <- seuratNeighbors(obj, dims = 1:8, k.param = 9,
                            return.neighbor = TRUE, device = "cpu")
    expect_identical(names(mine@neighbors), "RNA.nn")
    expect_identical(mine[["RNA.nn"]]@nn.idx, theirs[["RNA.nn"]]@nn.idx)
    expect_equal(mine[["RNA.nn"]]@nn.dist, theirs[["RNA.nn"]]@nn.dist,
                 tolerance = 1e-14)
    expect_identical(mine[["RNA.nn"]]@cell.names,
                     theirs[["RNA.nn"]]@cell.names)
})

test_that("seuratNeighbors() names its bad arguments", {
    skip_if_not_installed("SeuratObject")
    obj <- seuratObject(50, 83)
    expect_error(seuratNeighbors(obj, reduction = "umap"),
                 "'reduction' must name one of the reductions of 'object': ")
    expect_error(seuratNeighbors(obj, dims = 1:13),
                 "'dims' must be dimensions of 'pca', from 1 to 12")
    expect_error(seuratNeighbors(obj, k.param = 0), "'k.param' must be")
    expect_error(seuratNeighbors(matrix(1)), "'object' must be a Seurat")
    expect_warning(small <- seuratNeighbors(obj, k.param = 60,
                                            device = "cpu"),
                   "'k.param' is larger than the number of cells")
    expect_identical(unname(Matrix::rowSums(small[["RNA_nn"]])),
                     rep(49, 50))
})
