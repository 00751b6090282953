"""Checks of the data node: its keys differ by source (conf/data/*.yaml), so no schema
dataclass holds them; their types are checked first, by source (targets.py). `check_data`
checks a built-in source's values and that its files are there, before any run folder
exists; a source of your own is checked by its own code when it builds the datasets.
The checks of the sources read from disk are in disk_checks.py, loaded by a run of one.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from gearshift.config.rules import check_int, fail

# The built-in data sources by their _target_, with the names their conf/data files have;
# their values are checked here, before any run folder exists. A source of your own is
# checked by its own code when it builds the datasets.
SOURCES = {
    "gearshift.data.synthetic.synthetic_images": "synthetic",
    "gearshift.data.synthetic_regression.synthetic_regression": "synthetic_regression",
    "gearshift.data.images.image_folder": "imagefolder",
    "gearshift.data.images.cifar10": "cifar10",
    "gearshift.data.shards.shards": "shards",
}
# Sources with a check of their own, by _target_: data=synthetic_tokens's below, data=hf's in
# config/disk_checks.py and data=tokens's in config/token_files.py (each loaded for its
# sources only).
SOURCE_CHECKS: dict[str, Callable[[DictConfig], None]] = {}
# Data keys that only act on data read from disk, with their do-nothing values.
DISK_ONLY = {
    "path": None,
    "stage_to": None,
    "download": False,
    "decode": "host",
    "augment": False,
    "mean": None,
    "std": None,
    "batch_dtype": "uint8",
    "decoder": "auto",
    "stage_format": "copy",
}


def check_data(cfg: DictConfig) -> None:
    """The data node's values for its source; some against the run's (batch_size, device)."""
    target = cfg.data.get("_target_")
    if not target:
        fail("data._target_", target, "name the source: a function that returns the datasets")
    if target in SOURCE_CHECKS:
        SOURCE_CHECKS[target](cfg)
        return
    name = SOURCES.get(target)
    if name is None:
        return  # a source of your own: its code checks its values when it builds the data
    from_disk = not name.startswith("synthetic")
    check_int(cfg, "data.num_samples", 1, optional=from_disk)
    check_int(cfg, "data.num_val_samples", 0, optional=from_disk)
    for key in ("data.image_size", "data.channels"):
        check_int(cfg, key, 1)
    if name != "synthetic_regression":
        check_int(cfg, "data.num_classes", 2)
    if from_disk:
        from gearshift.config.disk_checks import check_disk_data  # a run of these sources only

        check_disk_data(cfg, name)
        return
    for key, idle in DISK_ONLY.items():
        if cfg.data.get(key, idle) != idle:
            fail(f"data.{key}", cfg.data[key], "it applies to data read from disk only")
    if (
        cfg.dataloader.drop_last
        and cfg.batch_size != "auto"
        and cfg.data.num_samples < cfg.batch_size
    ):
        fail(
            "batch_size",
            cfg.batch_size,
            f"with dataloader.drop_last=true it must be <= data.num_samples ({cfg.data.num_samples})",
        )


def _check_synthetic_tokens(cfg: DictConfig) -> None:
    """data=synthetic_tokens: windows of data.block_size tokens below data.vocab_size."""
    check_int(cfg, "data.num_samples", 1)
    check_int(cfg, "data.num_val_samples", 0)
    for key in ("data.block_size", "data.vocab_size", "data.successors"):
        check_int(cfg, key, 1)


SOURCE_CHECKS["gearshift.data.tokens.synthetic_tokens"] = _check_synthetic_tokens


def _check_token_files(cfg: DictConfig) -> None:
    from gearshift.config.token_files import check_token_config

    check_token_config(cfg)


SOURCE_CHECKS["gearshift.data.tokens.token_files"] = _check_token_files


# data=tokens' and task=lm's values from the token folder's meta file (config/token_files.py)
def _token_vocab(path: str | None) -> int | None:
    from gearshift.config.token_files import meta_vocab_size

    return meta_vocab_size(path)


def _token_bytes(path: str | None) -> float | None:
    from gearshift.config.token_files import meta_bytes_per_token

    return meta_bytes_per_token(path)


OmegaConf.register_new_resolver("gearshift_token_vocab", _token_vocab)
OmegaConf.register_new_resolver("gearshift_token_bytes", _token_bytes)


def _check_hf(cfg: DictConfig) -> None:
    from gearshift.config.disk_checks import check_hf

    check_hf(cfg)


SOURCE_CHECKS["gearshift.data.hf.hf"] = _check_hf
