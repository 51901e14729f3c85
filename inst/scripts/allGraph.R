## The main job: the exact Pearson kNN graph (k = 10) of the genes of the ALL
## leukemia microarray (Bioconductor's ALL: 12625 probes x 128 patients).
## Prints the device, the time and the first edges, and writes every edge to
## a CSV file (first argument, default ALL-pearson-k10.csv).
suppressPackageStartupMessages({
    library(knngpu)
    library(ALL)
    library(Biobase)
})
data(ALL)
out <- commandArgs(trailingOnly = TRUE)[1]
if (is.na(out)) out <- "ALL-pearson-k10.csv"

edges <- knnGraph(exprs(ALL), k = 10, metric = "pearson", verbose = TRUE)
cat(sprintf("device:    %s\nprecision: %s\ntime:      %.2f s\n",
            attr(edges, "device"), attr(edges, "precision"),
            attr(edges, "elapsed")))
print(head(edges, 10), row.names = FALSE)
utils::write.csv(edges, out, row.names = FALSE)
cat(sprintf("wrote %d edges between %d genes to %s\n", nrow(edges),
            nrow(attr(edges, "nodes")), out))
