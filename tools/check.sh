#!/bin/sh
# R CMD build, then R CMD check --no-manual of the tarball, which must end
# with no ERROR and no WARNING (NOTEs are listed, not fatal). Run from the
# root of the checkout, with the packages of tools/install.sh installed;
# .ci/run calls it on this machine and in the Debian 13 root. Arguments
# go to R CMD check (e.g. --no-tests where the suite has just run).
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
checkout=$(pwd)
# The build installs the package once to build the vignette: CPU-only is
# enough for that (the results are the same), and quick.
(cd "$work" && KNNGPU_CUDA=no R CMD build "$checkout")
(cd "$work" && R CMD check --no-manual "$@" knngpu_*.tar.gz) || true
log="$work/knngpu.Rcheck/00check.log"
cat "$log" 2>/dev/null || true
status=$(grep '^Status:' "$log" 2>/dev/null || echo "Status: no status line")
echo "R CMD check ($(R --version | head -1)): $status"
case "$status" in
*ERROR*|*WARNING*|*"no status"*) exit 1 ;;
esac
