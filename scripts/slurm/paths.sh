# Where the local test cluster keeps its files (sourced by up.sh, down.sh).
# shellcheck disable=SC2034  # used by the scripts that source this file
SLURM_ROOT=/var/lib/gearshift-slurm
SLURM_CONF_FILE=/etc/slurm/slurm.conf  # where sinfo, sbatch and friends look by default
CONF_MARKER="gearshift-test-cluster"   # up.sh and down.sh only touch files that carry it
SLURMCTLD_PID=$SLURM_ROOT/run/slurmctld.pid
# Two slurmd on this host, one per node (Debian's build has MULTIPLE_SLURMD): each node has
# its own port, spool folder, log and pid file (%n in slurm.conf: the node's name).
NODES=(node1 node2)
slurmd_pid() { echo "$SLURM_ROOT/run/slurmd-$1.pid"; }  # slurmd_pid NODE
LEGACY_SLURMD_PID=$SLURM_ROOT/run/slurmd.pid  # the one slurmd of the one-node cluster before
MUNGED_PID=/run/munge/munged.pid
SACCT_SHIM=/usr/local/bin/sacct
