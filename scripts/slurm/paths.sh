# Where the local test cluster keeps its files (sourced by up.sh, down.sh).
# shellcheck disable=SC2034  # used by the scripts that source this file
SLURM_ROOT=/var/lib/gearshift-slurm
SLURM_CONF_FILE=/etc/slurm/slurm.conf  # where sinfo, sbatch and friends look by default
CONF_MARKER="gearshift-test-cluster"   # up.sh and down.sh only touch files that carry it
SLURMCTLD_PID=$SLURM_ROOT/run/slurmctld.pid
SLURMD_PID=$SLURM_ROOT/run/slurmd.pid
MUNGED_PID=/run/munge/munged.pid
SACCT_SHIM=/usr/local/bin/sacct
