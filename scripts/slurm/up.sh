#!/usr/bin/env bash
# A real two-node SLURM cluster on this machine, for the SLURM tests and to try SLURM sweeps.
#
#   sudo scripts/slurm/up.sh      (or: make slurm-up)      then: sinfo, squeue, sbatch ...
#   sudo scripts/slurm/down.sh    (or: make slurm-down)
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge if they are missing, writes
# /etc/slurm/slurm.conf for this host (two nodes, node1 and node2, one partition `debug`),
# starts munged, slurmctld and one slurmd per node by hand (no systemd needed) and waits
# until both nodes are idle. Debian's slurmd is built with MULTIPLE_SLURMD, so both nodes
# run here: each slurmd (`slurmd -N node1`) has its own port, spool folder, log and pid
# file, and both nodes have NodeAddr 127.0.0.1, an address and not their name, which
# resolves nowhere (as on clusters whose node names are not host names: a job must take
# its peers' addresses from `scontrol show node`). Each node offers all of this host's CPUs
# and its memory less 1 GiB (the two share them). Running it again while the cluster is up
# changes nothing. There is no accounting daemon, so it also puts a small `sacct` on the
# PATH (sacct.sh) that answers from slurmctld's own job table: submitit then sees a job
# that died without a result as FAILED/CANCELLED/TIMEOUT instead of waiting for it forever.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/slurm/paths.sh
source "$HERE/paths.sh"

if [[ $EUID -ne 0 ]]; then
    echo "error: scripts/slurm/up.sh must run as root (it installs packages and starts daemons)" >&2
    exit 1
fi

install_packages() {
    local missing=()
    for bin in slurmctld slurmd sinfo munged; do
        command -v "$bin" >/dev/null || missing+=("$bin")
    done
    [[ ${#missing[@]} -eq 0 ]] && return
    if ! command -v apt-get >/dev/null; then
        echo "error: ${missing[*]} not found and there is no apt-get to install SLURM with" >&2
        exit 1
    fi
    echo "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

running() {  # any daemon of the cluster runs (of this cluster or of the one-node one before)
    alive "$SLURMCTLD_PID" || alive "$LEGACY_SLURMD_PID" && return 0
    for node in "${NODES[@]}"; do alive "$(slurmd_pid "$node")" && return 0; done
    return 1
}

alive() {  # alive PIDFILE: the process named in the pid file runs
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_config() {
    local host cpus mem_mib
    host="$(hostname -s)"
    cpus="$(nproc)"
    mem_mib=$(($(free -m | awk '/^Mem:/ {print $2}') - 1024))
    mkdir -p "$(dirname "$SLURM_CONF_FILE")"
    if [[ -f $SLURM_CONF_FILE ]] && ! grep -q "$CONF_MARKER" "$SLURM_CONF_FILE"; then
        echo "error: $SLURM_CONF_FILE exists and was not written by gearshift; not touching it" >&2
        exit 1
    fi
    local new
    new="$(mktemp)"
    cat >"$new" <<EOF
# $CONF_MARKER: a two-node test cluster written by scripts/slurm/up.sh; removed by down.sh.
ClusterName=gearshift
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
# Finished jobs stay in slurmctld's table for a day: the sacct stand-in answers from it.
MinJobAge=86400
KillWait=5
# A small cluster can afford to look at its queue often: a requeued job whose begin time has
# come starts within a second or two, not at the next backfill pass (30 s by default).
SchedulerParameters=bf_interval=1,sched_interval=2
StateSaveLocation=$SLURM_ROOT/state
SlurmdSpoolDir=$SLURM_ROOT/spool/%n
SlurmctldPidFile=$SLURMCTLD_PID
SlurmdPidFile=$(slurmd_pid %n)
SlurmctldLogFile=$SLURM_ROOT/log/slurmctld.log
SlurmdLogFile=$SLURM_ROOT/log/slurmd-%n.log
# Two slurmd on this host (MULTIPLE_SLURMD), told apart by their ports.
NodeName=${NODES[0]} NodeHostname=$host NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$host NodeAddr=127.0.0.1 Port=6828 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$new" "$SLURM_CONF_FILE"; then
        rm -f "$new"
        return 1  # unchanged
    fi
    install -m 644 "$new" "$SLURM_CONF_FILE"
    rm -f "$new"
}

start_munge() {
    if alive "$MUNGED_PID"; then return; fi
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    chmod 755 /run/munge
    runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGED_PID" --force
    munge -n | unmunge >/dev/null
}

start_slurm() {
    mkdir -p "$SLURM_ROOT"/{state,log,run}
    alive "$SLURMCTLD_PID" || slurmctld -c -f "$SLURM_CONF_FILE"
    for node in "${NODES[@]}"; do
        mkdir -p "$SLURM_ROOT/spool/$node"
        alive "$(slurmd_pid "$node")" || slurmd -f "$SLURM_CONF_FILE" -N "$node"
    done
}

ready() {  # ready NODE: the node can take jobs
    case "$(sinfo -h -N -n "$1" -o %t 2>/dev/null || true)" in
    idle | mix | alloc) return 0 ;;
    *) return 1 ;;
    esac
}

wait_for_nodes() {
    for _ in $(seq 60); do
        if ready "${NODES[0]}" && ready "${NODES[1]}"; then
            echo "slurm is up: nodes ${NODES[*]} in partition debug"
            sinfo -N
            return
        fi
        sleep 0.5
    done
    echo "error: nodes ${NODES[*]} did not become idle; see $SLURM_ROOT/log/ and sinfo -N:" >&2
    sinfo -N >&2 || true
    exit 1
}

install_packages
if write_config && running; then
    echo "slurm.conf changed: restarting slurmctld and slurmd"
    "$HERE/down.sh" --keep-config
fi
start_munge
start_slurm
install -m 755 "$HERE/sacct.sh" "$SACCT_SHIM"
wait_for_nodes
