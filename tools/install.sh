#!/bin/sh
# Installs knngpu and what it needs on a fresh Debian/Ubuntu machine, all
# from the distribution's packages: R, the R packages the package, its
# tests, its vignette and its benchmarks use, and OpenBLAS for a fast BLAS;
# then this package from a tarball built from this checkout, so that its
# vignette is installed too (vignette("knngpu")). The CUDA toolkit is
# optional and not installed here (configure finds one if present). Run
# from the root of the checkout; with --deps it installs the distribution's
# packages only. Packages already installed are not asked for again, so a
# second run goes straight to building knngpu.
set -eu
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
packages="r-base-dev libopenblas0-pthread pandoc
    r-cran-cli r-cran-testthat r-cran-roxygen2 r-cran-igraph r-cran-knitr
    r-cran-rmarkdown r-cran-matrix r-cran-fnn r-cran-rann r-cran-dbscan
    r-cran-wgcna r-bioc-biocneighbors r-bioc-bluster r-bioc-biocparallel
    r-bioc-summarizedexperiment r-bioc-biobase r-bioc-biocstyle r-bioc-all
    r-bioc-singlecellexperiment r-bioc-scran r-bioc-hdf5array
    r-bioc-delayedarray r-cran-batchtools r-cran-withr
    r-cran-seurat r-cran-seuratobject"
# shellcheck disable=SC2086 # the list is split into package names
installed=$(dpkg-query -W -f '${Status}\n' $packages 2>/dev/null |
    grep -c '^install ok installed$' || true)
if [ "$installed" -ne "$(echo $packages | wc -w)" ]; then
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $packages \
        >/dev/null
fi
[ "${1:-}" = "--deps" ] && exit 0

# The tarball carries the built vignette; its build installs the package
# once, CPU-only (the vignette's results are the same on either device),
# into a library of its own.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
checkout=$(pwd)
(cd "$work" && KNNGPU_CUDA=no R CMD build --no-manual "$checkout" \
    >build.log 2>&1) || { cat "$work/build.log"; exit 1; }
$SUDO R CMD INSTALL "$work"/knngpu_*.tar.gz
