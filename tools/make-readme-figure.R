## Draws man/figures/README-network.png, the gene co-expression network shown
## in README.md: the union Pearson kNN graph (k = 10) of the 2000 most
## variable probes of the ALL data set, coloured by Louvain module, as in the
## vignette. Run from the repository root with knngpu installed:
##
##     Rscript tools/make-readme-figure.R
##
## Needs igraph, Biobase and ALL. The edges are drawn without antialiasing
## in a plain light grey: 16,000 blended translucent lines make a PNG of
## several hundred KB, this one stays well under 300 KB.

suppressPackageStartupMessages({
    library(knngpu)
    library(igraph)
    library(Biobase)
    library(ALL)
})

output <- file.path("man", "figures", "README-network.png")
if (!dir.exists(dirname(output))) {
    stop("run this script from the root of the knngpu repository",
         call. = FALSE)
}

data(ALL)
expr <- exprs(ALL)
sds <- apply(expr, 1, sd)
x <- expr[order(sds, decreasing = TRUE)[seq_len(2000)], ]

union <- knnGraph(x, k = 10, metric = "pearson", symmetrize = "union")
gUnion <- toIgraph(union)
set.seed(42)
modules <- cluster_louvain(gUnion, weights = E(gUnion)$weight)
membershipOf <- membership(modules)

set.seed(1)
layout <- norm_coords(layout_with_fr(gUnion))
big <- which(sizes(modules) >= 20)
moduleColours <- grDevices::palette.colors(length(big) + 2,
                                           "Polychrome 36")[-(1:2)]
colour <- rep("grey70", vcount(gUnion))
inBig <- membershipOf %in% big
colour[inBig] <- moduleColours[match(membershipOf[inBig], big)]

png(output, width = 800, height = 800, res = 110, type = "cairo",
    antialias = "none")
par(mar = c(2, 0, 0, 0))
plot(gUnion, layout = layout, rescale = FALSE, vertex.size = 2,
     vertex.label = NA, vertex.color = colour, vertex.frame.color = NA,
     edge.color = "grey85", edge.width = 0.4)
centre <- apply(layout, 2, function(xy) tapply(xy, membershipOf, median))
text(centre[big, 1], centre[big, 2], labels = big, font = 2)
mtext(sprintf(paste("ALL: %d most variable probes, Pearson kNN graph",
                    "(k = %d, union), %d Louvain modules"),
              nrow(x), attr(union, "k"), length(modules)),
      side = 1, line = 0.5, cex = 0.9)
invisible(dev.off())
message(sprintf("wrote %s (%.0f KB)", output, file.size(output) / 1024))
