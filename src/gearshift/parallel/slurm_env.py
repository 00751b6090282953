"""SLURM's variables as the ranks' (torchrun's), and where rank 0 of a job `srun` started
listens: loaded only under `srun` with several tasks and no torchrun (distributed.py
`ranks_from_environment`)."""

from __future__ import annotations

import os
import re
import subprocess


def adopt_slurm_environment() -> None:
    """Under `srun` with several tasks and no torchrun, SLURM's variables name the ranks."""
    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=os.environ["SLURM_NTASKS"],
        LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
        MASTER_ADDR=os.environ.get("MASTER_ADDR")
        or slurm_master_address(os.environ.get("SLURM_JOB_NODELIST", "localhost")),
        MASTER_PORT=os.environ.get("MASTER_PORT")
        or str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000),
    )


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "gpu[07-09,12],cpu3" -> "gpu07"."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    prefix, ranges = match[1], match[2]
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def slurm_master_address(nodelist: str) -> str:
    """Where rank 0 listens: the address of the job's first node. A node's name need not
    resolve (clusters name nodes apart from their hosts, and several slurmd may share one
    host), so it is the node's NodeAddr from `scontrol show node`, the first of the list
    `scontrol show hostnames` expands; the name itself where scontrol cannot say."""
    first = first_slurm_host(nodelist)
    try:
        names = _scontrol("show", "hostnames", nodelist).split()
        first = names[0] if names else first
        address = re.search(r"\bNodeAddr=(\S+)", _scontrol("show", "node", "-o", first))
    except (OSError, subprocess.SubprocessError):
        return first
    return address[1] if address else first


def _scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout
