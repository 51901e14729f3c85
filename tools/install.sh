#!/bin/sh
# Installs knngpu and what it needs on a fresh Debian/Ubuntu machine, all
# from the distribution's packages: R, the R packages the package, its
# tests, its vignette and its benchmarks use, and OpenBLAS for a fast BLAS;
# then this package from this checkout. The CUDA toolkit is optional and
# not installed here (configure finds one if present). Run from the root
# of the checkout.
set -eu
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    r-base-dev libopenblas0-pthread pandoc \
    r-cran-cli r-cran-testthat r-cran-roxygen2 r-cran-igraph r-cran-knitr \
    r-cran-rmarkdown r-cran-matrix r-cran-fnn r-cran-rann r-cran-dbscan \
    r-cran-wgcna r-bioc-biocneighbors r-bioc-bluster r-bioc-biocparallel \
    r-bioc-summarizedexperiment r-bioc-biobase r-bioc-biocstyle r-bioc-all \
    r-bioc-singlecellexperiment r-bioc-scran r-bioc-hdf5array \
    r-bioc-delayedarray r-cran-batchtools r-cran-withr \
    r-cran-seurat r-cran-seuratobject \
    >/dev/null

# --clean removes the build's objects, so the tree stays as checked out.
$SUDO R CMD INSTALL --clean .
