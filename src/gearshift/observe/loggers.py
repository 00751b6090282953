"""Where metrics go besides the console (docs/observing.md, "Loggers"): the backends
`logger=` selects, one or several, each loaded only then."""

from __future__ import annotations

from pathlib import Path

from gearshift.config.schema import LoggerConfig
from gearshift.observe.logger_backend import NullLogger


def build_logger(
    cfg: LoggerConfig,
    run_dir: Path,
    config: dict,
    name: str | None,
    start_step: int = 0,
    enabled: bool = True,
) -> NullLogger:
    """The backends `cfg` (the logger node) selects; `start_step`: the step a resumed run
    continues from (0 for a new one). Not `enabled` (ranks other than 0): none."""
    if not enabled:
        return NullLogger()
    backends: list[NullLogger] = []
    if cfg.wandb and cfg.mode != "disabled":
        from gearshift.observe.wandb_logger import WandbLogger

        backends.append(WandbLogger(cfg, run_dir, config, name))
    if cfg.tensorboard:
        from gearshift.observe.tensorboard_logger import TensorBoardLogger

        backends.append(TensorBoardLogger(run_dir / "tensorboard", start_step))
    if cfg.csv:
        from gearshift.observe.csv_logger import CsvLogger

        backends.append(CsvLogger(run_dir / "metrics.csv", start_step))
    if len(backends) < 2:  # none (logger=none) or the one backend, called as it is
        return backends[0] if backends else NullLogger()
    from gearshift.observe.several_loggers import Loggers

    return Loggers(backends)
