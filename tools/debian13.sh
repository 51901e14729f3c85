#!/bin/sh
# Runs the README's install and test commands on Debian 13 (R 4.5,
# BiocNeighbors 2.x) inside a root that debootstrap builds from Debian's
# mirror. The root is kept in KNNGPU_DEBIAN13_ROOT (default
# /var/cache/knngpu/debian13) and reused when it is already complete, so
# only the first run pays for debootstrap and the R packages.
#
# Usage: sh tools/debian13.sh [command run in the checkout's copy]
# The default command is the README's: sh tools/install.sh &&
# Rscript tools/run-tests.R
set -eu
root=${KNNGPU_DEBIAN13_ROOT:-/var/cache/knngpu/debian13}
mirror=${KNNGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
checkout=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-"sh tools/install.sh && Rscript tools/run-tests.R"}

if [ ! -f "$root/.knngpu-root-complete" ]; then
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase trixie "$root" "$mirror"
    touch "$root/.knngpu-root-complete"
fi

cleanup() {
    for m in work/knngpu dev/pts dev proc sys; do
        umount "$root/$m" 2>/dev/null || true
    done
}
trap cleanup EXIT INT TERM
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
rm -rf "$root/work/knngpu"
mkdir -p "$root/work/knngpu"
# A copy, not a bind mount: the build inside must not touch this checkout.
(cd "$checkout" && git ls-files -co --exclude-standard -z |
    xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$root/work/knngpu"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 CI="${CI:-}" \
    sh -c "cd /work/knngpu && $cmd"
