"""The study's parts by name: storage, sampler, pruner (shared by the sweeper and a trial's
reporter, which loads the same study from the same storage in the trial's process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")  # cmaes, gp: with their extras installed
PRUNERS = ("none", "median", "successive_halving", "hyperband")
PRUNER_KEY = "gearshift_pruner"  # the study's user attribute that names its pruner


class StudyError(ValueError):
    """A sweeper setting that is not allowed: the message names the key and the value."""


def journal_path(storage: str | None, sweep_dir: Path) -> Path | None:
    """The journal file `storage` names (null: <sweep dir>/study.journal); None for a
    database URL, which Optuna opens itself."""
    if storage is None:
        return sweep_dir / "study.journal"
    if "://" in storage:
        return None
    return Path(storage)


def check_journal_path(path: Path) -> None:
    """A journal file can be created at `path`: no file where a folder must go."""
    if path.is_dir():
        raise StudyError(f"hydra.sweeper.storage={str(path)!r} is not allowed; it is a folder")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StudyError(
            f"hydra.sweeper.storage={str(path)!r} is not allowed; {existing} is a file, "
            "not a folder"
        )


def open_storage(storage: str) -> Any:
    """A journal file (a path: works on a shared file system, no server) or a database URL."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if "://" in storage:
        return optuna.storages.RDBStorage(storage)
    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(storage))


def build_sampler(name: str, seed: int | None, grid: dict[str, list[Any]]) -> Any:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":

        class AskTellGridSampler(optuna.samplers.GridSampler):
            """GridSampler stops the study when its grid is walked, which outside
            `study.optimize` raises; the sweeper asks for no more than the grid holds."""

            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                pass

        return AskTellGridSampler(grid, seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise StudyError(
        f"hydra.sweeper.sampler={name!r} is not allowed; choose one of: {', '.join(SAMPLERS)}"
    )


def grid_size(grid: dict[str, list[Any]]) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


def check_sampler(name: str, not_gridded: list[str]) -> None:
    if name not in SAMPLERS:
        raise StudyError(
            f"hydra.sweeper.sampler={name!r} is not allowed; choose one of: {', '.join(SAMPLERS)}"
        )
    if name == "grid" and not_gridded:
        raise StudyError(
            f"hydra.sweeper.sampler='grid' is not allowed with interval params "
            f"({', '.join(not_gridded)}); the grid sampler needs choice(...) or range(...)"
        )
    extra = {"cmaes": "cmaes", "gp": "scipy"}.get(name)
    if extra is not None:
        import importlib.util

        if importlib.util.find_spec(extra) is None:
            raise StudyError(
                f"hydra.sweeper.sampler={name!r} is not allowed here; it needs the "
                f"{extra!r} package (pip install {extra})"
            )


def build_pruner(name: str, args: dict[str, Any]) -> Any:
    """Optuna's pruner `name` with its keyword arguments `args` (hydra.sweeper.pruner_args).
    median takes n_startup_trials, n_warmup_steps, interval_steps, n_min_trials;
    successive_halving min_resource, reduction_factor, min_early_stopping_rate,
    bootstrap_count; hyperband min_resource, max_resource, reduction_factor, bootstrap_count."""
    import optuna

    if name not in PRUNERS:
        raise StudyError(
            f"hydra.sweeper.pruner={name!r} is not allowed; choose one of: {', '.join(PRUNERS)}"
        )
    kind = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
    }[name]
    try:
        return kind(**args)
    except (TypeError, ValueError) as error:
        raise StudyError(
            f"hydra.sweeper.pruner_args={dict(args)!r} is not allowed for pruner {name!r}; {error}"
        ) from None
