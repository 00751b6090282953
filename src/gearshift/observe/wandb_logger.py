"""`logger=wandb`: online when an API key is configured, else offline into the run folder
(`wandb sync` uploads it later)."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gearshift.config.schema import LoggerConfig
from gearshift.observe.logger_backend import Backend

log = logging.getLogger(__name__)


def wandb_mode(configured: str) -> str:
    """`auto`: the user's own WANDB_MODE, else online with an API key (WANDB_API_KEY, or
    `wandb login`'s netrc entry for the W&B host), else offline."""
    if configured != "auto":
        return configured
    if os.environ.get("WANDB_MODE"):  # the user's own W&B setting wins over our guess
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if netrc.netrc().authenticators(host) is not None else "offline"
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


class WandbLogger(Backend):
    label = "W&B"

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict, name: str | None) -> None:
        mode = self.mode = wandb_mode(cfg.mode)

        def start() -> None:
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

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._guarded("log", lambda: self.run.log(metrics, step=step))

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        def send() -> None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

        self._guarded("table", send)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        # one row per text; the step is a column too, so the tables of several steps compare
        rows = [[step, i, text] for i, text in enumerate(texts)]
        self.log_table(key, ["step", "index", "text"], rows, step)

    def log_file(self, path: Path, name: str, kind: str) -> None:
        if self.mode != "online":  # offline, the file is in the run folder already
            return
        self._guarded("artifact", lambda: self.run.log_artifact(str(path), name=name, type=kind))

    def close(self, summary: dict[str, Any] | None) -> None:
        self.run.summary.update(summary or {})
        self.run.finish()
