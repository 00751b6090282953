"""`distributed.nproc_per_node=N`: start N ranks on this machine with torch's elastic
launcher (what torchrun uses); each rank sets up logging like Hydra would and trains."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gearshift.data.loading import cpu_count
from gearshift.parallel.distributed import ranks_from_environment
from gearshift.trainer import fit


def launch_local(cfg: DictConfig, run_dir: Path, run_name: str | None) -> dict[str, Any]:
    """Start `distributed.nproc_per_node` ranks here with torch's elastic launcher (what
    torchrun uses) and return rank 0's summary."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.distributed.nproc_per_node,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=cfg.distributed.max_restarts,
        monitor_interval=0.5,
    )
    # Like torchrun: without a setting of the user's, ranks split the CPUs instead of each
    # starting a thread per core (which oversubscribes them, many times slower).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // config.nproc_per_node)))
    results = elastic_launch(config, run_rank)(cfg, str(run_dir), run_name)
    return results[0]


def run_rank(cfg: DictConfig, run_dir: str, run_name: str | None) -> dict[str, Any]:
    """One rank started by `launch_local`: log like Hydra would, then train."""
    ranks = ranks_from_environment()
    handlers: list[logging.Handler] = []
    if ranks.is_zero:
        from rich.logging import RichHandler

        file = logging.FileHandler(Path(run_dir) / "train.log")
        file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        handlers = [RichHandler(show_path=False), file]
    level = logging.INFO if ranks.is_zero else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s", handlers=handlers or None, force=True)
    return fit(cfg, Path(run_dir), run_name).summary
