#!/bin/sh
# Runs a command against a one-node SLURM cluster on this machine: Debian's
# slurmctld, slurmd and munge (installed with apt-get when missing; the same
# package names on Debian 12 and 13), each started with its files in a
# fresh directory and stopped, with that directory removed, whatever the
# command's outcome. The cluster is as small as a scheduler gets: this
# host as its one node with 2 CPUs, processes tracked without cgroups
# (proctrack/linuxproc), no accounting.
#
# Usage: sh tools/slurm-local.sh "<command>"
# The command runs with SLURM_CONF naming the cluster's configuration (the
# SLURM commands and batchtools read it) and KNNGPU_SLURM=1, which
# tests/testthat/test-slurm.R waits for. Must run as root (the daemons
# and the jobs run as root). KNNGPU_SLURM_PORT (default 6817) is the
# controller's port; the node's is the next one. Tested with Debian 12's
# SLURM 22.05 and munge 0.5.15 and Debian 13's SLURM 24.11 and munge
# 0.5.16.
set -eu
cmd=${1:?usage: sh tools/slurm-local.sh \"<command>\"}
port=${KNNGPU_SLURM_PORT:-6817}
if [ "$(id -u)" != 0 ]; then
    echo "tools/slurm-local.sh must run as root: it starts the daemons" >&2
    exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
    ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

work=$(mktemp -d /tmp/knngpu-slurm.XXXXXX)
pids=""
stop_all() {
    status=$?
    # Nothing below may stop the cleanup, a reader of the logs that has
    # gone included.
    set +e
    trap '' PIPE
    # Jobs first, while the controller can still cancel them; then the
    # daemons, newest first.
    scancel --user="$(id -un)" 2>/dev/null || true
    for pid in $pids; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in $pids; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$status" -ne 0 ]; then
        for log in "$work"/*.log; do
            [ -f "$log" ] && { echo "== $log"; tail -n 30 "$log"; }
        done
    fi
    rm -rf "$work"
    exit "$status"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Records a daemon's pid, newest first: stop_all stops them in the
# reverse order of their start.
started() {
    pids="$1 $pids"
}

mkdir -p "$work/state" "$work/spool" "$work/munge"
chmod 755 "$work/munge"
mungekey --create --keyfile="$work/munge/munge.key" >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$work/munge/munge.key" bs=1 count=1024 2>/dev/null
chmod 600 "$work/munge/munge.key"
socket="$work/munge/munge.socket"
munged --foreground --force --socket="$socket" \
    --key-file="$work/munge/munge.key" --log-file="$work/munged.log" \
    --pid-file="$work/munge/munged.pid" \
    --seed-file="$work/munge/munged.seed" >"$work/munged.out" 2>&1 &
started $!

host=$(hostname -s)
memory=$(awk '/^MemTotal:/ { print int($2 / 1024 / 2) }' /proc/meminfo)
cat >"$work/slurm.conf" <<EOF
ClusterName=knngpu
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$work/slurm.conf"

# munged answers once its socket exists.
i=0
until [ -S "$socket" ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] || { echo "munged did not start" >&2; exit 1; }
    sleep 0.1
done

slurmctld -D -c -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
started $!
slurmd -D -N "$host" -f "$SLURM_CONF" >"$work/slurmd.out" 2>&1 &
started $!

i=0
until [ "$(sinfo -h -n "$host" -o %T 2>/dev/null)" = idle ]; do
    i=$((i + 1))
    [ "$i" -le 120 ] || { echo "the SLURM node did not become idle" >&2
                          sinfo >&2 || true; exit 1; }
    sleep 0.5
done

# batchtools asks squeue for the jobs of $USER, which a CI shell may not
# set.
USER=$(id -un) KNNGPU_SLURM=1 sh -c "$cmd"
