"""Where metrics go besides the console: Weights & Biases and the run's summary.json.

W&B is online when an API key is configured and offline into the run folder otherwise
(`wandb sync` uploads it later). A W&B failure, at start or mid-run, is logged once as a
warning and training goes on without it.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def has_wandb_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def wandb_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    if os.environ.get("WANDB_MODE"):  # the user's own W&B setting wins over our guess
        return os.environ["WANDB_MODE"]
    return "online" if has_wandb_api_key() else "offline"


class NullLogger:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table (the profiler's operators); a backend without tables ignores it."""

    def log_file(self, path: Path, name: str, kind: str) -> None:
        """A file worth keeping with the run (the profiler's trace); W&B uploads it online."""


class WandbLogger(NullLogger):
    def __init__(self, cfg: DictConfig, run_dir: Path, config: dict, name: str | None) -> None:
        self.run = None
        mode = self.mode = wandb_mode(cfg.mode)
        try:
            import wandb

            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group,
                tags=list(cfg.tags),
                name=name,
                dir=str(run_dir),
                config=config,
                mode=mode,
                settings=wandb.Settings(console="off", quiet=True),
            )
            # offline runs get no name until synced; their id names the folder to sync
            log.info("W&B run %s (%s)", self.run.name or self.run.id, mode)
        except Exception as error:
            log.warning("W&B is off for this run: %s", error)

    def _call(self, action: str, fn, *args, **kwargs) -> None:
        if self.run is None:
            return
        try:
            fn(*args, **kwargs)
        except Exception as error:
            log.warning("W&B %s failed, going on without it: %s", action, error)
            self.run = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._call("log", lambda: self.run.log(metrics, step=step))

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        def send() -> None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

        self._call("table", send)

    def log_file(self, path: Path, name: str, kind: str) -> None:
        if self.mode != "online":  # offline, the file is in the run folder already
            return

        def upload() -> None:
            import wandb

            artifact = wandb.Artifact(name, type=kind)
            artifact.add_file(str(path))
            self.run.log_artifact(artifact)

        self._call("artifact", upload)

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        def close() -> None:
            self.run.summary.update(summary or {})
            self.run.finish()

        self._call("finish", close)
        self.run = None


def build_logger(cfg: DictConfig, run_dir: Path, config: dict, name: str | None) -> NullLogger:
    if cfg.name == "none" or cfg.mode == "disabled":
        return NullLogger()
    return WandbLogger(cfg, run_dir, config, name)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file and rename it over `path`: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
