#!/usr/bin/env bash
# gearshift-test-cluster: `sacct` for the local test cluster, which has no accounting daemon.
# Installed on the PATH by scripts/slurm/up.sh, removed by down.sh. It answers from
# slurmctld's own job table (`squeue -t all`, which keeps finished jobs for MinJobAge),
# so tools that poll sacct (submitit) see COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
# Understands: -j/--jobs, -o/--format, -P/--parsable2, -p/--parsable, -n/--noheader;
# -X, -a, -S, -E and -u are accepted and ignored (one line per job; steps are not listed).
set -euo pipefail

declare -A CODE=(
    [jobid]="JobID %i" [jobidraw]="JobIDRaw %A" [jobname]="JobName %j" [state]="State %T"
    [nodelist]="NodeList %N" [partition]="Partition %P" [user]="User %u" [account]="Account %a"
    [elapsed]="Elapsed %M" [timelimit]="Timelimit %l" [start]="Start %S" [end]="End %e"
    [submit]="Submit %V" [alloccpus]="AllocCPUS %C" [nnodes]="NNodes %D" [reason]="Reason %r"
)

fields="JobID,JobName,Partition,State,NodeList"
jobs=() parsable="" header=1
while [[ $# -gt 0 ]]; do
    case "$1" in
    -j | --jobs) IFS=, read -ra more <<<"$2"; jobs+=("${more[@]}"); shift ;;
    --jobs=*) IFS=, read -ra more <<<"${1#*=}"; jobs+=("${more[@]}") ;;
    -j*) IFS=, read -ra more <<<"${1#-j}"; jobs+=("${more[@]}") ;;
    -o | --format) fields="$2"; shift ;;
    --format=*) fields="${1#*=}" ;;
    -P | --parsable2) parsable=2 ;;
    -p | --parsable) parsable=1 ;;
    -n | --noheader) header=0 ;;
    -X | --allocations | -a | --allusers) ;;
    -S | --starttime | -E | --endtime | -u | --user) shift ;;
    --starttime=* | --endtime=* | --user=*) ;;
    *)
        echo "sacct (gearshift test cluster): option $1 is not supported here" >&2
        exit 1
        ;;
    esac
    shift
done

names=() format=""
IFS=, read -ra wanted <<<"$fields"
for field in "${wanted[@]}"; do
    key="${field%%%*}"  # sacct allows Name%width
    entry="${CODE[${key,,}]:-}"
    if [[ -z $entry ]]; then
        echo "sacct (gearshift test cluster): field $field is not supported; use: ${!CODE[*]}" >&2
        exit 1
    fi
    names+=("${entry% *}")
    format+="${format:+|}${entry#* }"
done

rows() {
    if [[ ${#jobs[@]} -eq 0 ]]; then
        squeue -h -r -t all -o "$format"
        return
    fi
    for job in "${jobs[@]}"; do  # one call each: an unknown id must not hide the others
        squeue -h -r -t all -j "${job%%.*}" -o "$format" 2>/dev/null || true
    done
}

emit() {  # emit LINE(|-separated): in the output format asked for
    case "$parsable" in
    2) echo "$1" ;;
    1) echo "$1|" ;;
    *) IFS='|' read -ra cells <<<"$1"; printf '%-20s ' "${cells[@]}"; echo ;;
    esac
}

if [[ $header -eq 1 ]]; then emit "$(IFS='|'; echo "${names[*]}")"; fi
rows | sort -u -V | while IFS= read -r line; do emit "$line"; done
