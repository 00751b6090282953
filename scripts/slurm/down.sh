#!/usr/bin/env bash
# Stop the local test cluster of up.sh: cancel its jobs, stop both slurmd, slurmctld and munged
# by the PIDs in their pid files, remove the sacct stand-in and (unless --keep-config) the
# slurm.conf that up.sh wrote. Logs stay in /var/lib/gearshift-slurm/log. Safe to run twice.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/slurm/paths.sh
source "$HERE/paths.sh"

if [[ $EUID -ne 0 ]]; then
    echo "error: scripts/slurm/down.sh must run as root" >&2
    exit 1
fi

stop() {  # stop NAME PIDFILE: TERM, up to 10 s to exit, then KILL
    local name=$1 pidfile=$2 pid
    [[ -s $pidfile ]] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid"
        fi
        echo "stopped $name ($pid)"
    fi
    rm -f "$pidfile"
}

ours() {  # ours FILE: FILE exists and was written by up.sh
    [[ -f $1 ]] && grep -q "$CONF_MARKER" "$1"
}

if [[ -s $SLURMCTLD_PID ]] && kill -0 "$(cat "$SLURMCTLD_PID")" 2>/dev/null; then
    jobs="$(squeue -h -o %A 2>/dev/null || true)"
    if [[ -n $jobs ]]; then
        # shellcheck disable=SC2086  # one job id per word
        scancel $jobs || true
        sleep 1  # let slurmd's steps end the jobs' processes
    fi
fi
for node in "${NODES[@]}"; do
    stop "slurmd $node" "$(slurmd_pid "$node")"
done
stop slurmd "$LEGACY_SLURMD_PID"
stop slurmctld "$SLURMCTLD_PID"
stop munged "$MUNGED_PID"
if ours "$SACCT_SHIM"; then rm -f "$SACCT_SHIM"; fi
if [[ ${1:-} != --keep-config ]] && ours "$SLURM_CONF_FILE"; then rm -f "$SLURM_CONF_FILE"; fi
echo "slurm is down"
