#!/bin/sh
# Runs a command (by default the README's install and test commands) on
# Debian 13 (R 4.5, BiocNeighbors 2.x) inside a root that debootstrap
# builds from Debian's mirror. The root is kept in KNNGPU_DEBIAN13_ROOT
# (default /var/cache/knngpu/debian13) and reused once complete, so only
# the first run pays for debootstrap and the R packages.
#
# Usage (as root, from any checkout): sh tools/debian13.sh ["command"]
# The default command is the README's: sh tools/install.sh &&
# Rscript tools/run-tests.R
#
# Several checkouts may run it at once. Building the root and installing
# the distribution's packages (tools/install.sh --deps, quick when they
# are there) hold an exclusive lock; the commands then run under a shared
# one, each in its own copy of its checkout (/work/src/<checkout>) with
# its own R library (/work/lib/<checkout>, first in R_LIBS, where
# tools/install.sh installs knngpu), and in a private mount namespace, so
# no run's mounts or unmounts reach another run or the host. The mounts
# go on exit, failure and interrupt included.
set -eu
root=${KNNGPU_DEBIAN13_ROOT:-/var/cache/knngpu/debian13}
mirror=${KNNGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
checkout=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-"sh tools/install.sh && Rscript tools/run-tests.R"}

# Into a private mount namespace first: its mounts vanish with it.
if [ "${KNNGPU_DEBIAN13_NAMESPACE:-}" != "$$" ]; then
    exec unshare --mount --propagation private \
        sh -c 'export KNNGPU_DEBIAN13_NAMESPACE=$$; exec sh "$0" "$1"' \
        "$0" "$cmd"
fi

mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"

unmount() {
    for m in dev sys proc; do
        umount -R -l "$root/$m" 2>/dev/null || true
    done
}
key=$(printf '%s' "$checkout" | tr -c 'A-Za-z0-9._-' '_')
trap unmount EXIT
trap 'exit 130' INT TERM HUP

inside() {
    chroot "$root" /usr/bin/env -i HOME="/work/home/$key" \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 CI="${CI:-}" \
        R_LIBS="/work/lib/$key" "$@"
}

flock -x 9
if [ ! -f "$root/.knngpu-root-complete" ]; then
    # An incomplete root is built again; never through a mount into it.
    if grep -q " $root/" /proc/self/mounts; then
        echo "debian13.sh: $root has mounts; unmount them first" >&2
        exit 1
    fi
    rm -rf --one-file-system "$root"
    mkdir -p "$root"
    # A fresh host has no debootstrap: Debian's package brings it.
    if ! command -v debootstrap > /dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends debootstrap
    fi
    debootstrap --variant=minbase trixie "$root" "$mirror"
    touch "$root/.knngpu-root-complete"
fi
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mkdir -p "$root/work/lib/$key" "$root/work/home/$key"
# A copy, not a bind mount: the build inside must not touch this checkout.
rm -rf "$root/work/src/$key"
mkdir -p "$root/work/src/$key"
(cd "$checkout" && git ls-files -co --exclude-standard -z |
    xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$root/work/src/$key"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
inside sh -c "cd /work/src/$key && sh tools/install.sh --deps"

# The packages are in place: other checkouts may run beside this one.
flock -s 9
inside sh -c "cd /work/src/$key && $cmd"
