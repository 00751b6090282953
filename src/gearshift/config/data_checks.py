"""Checks of the data node: its keys differ by source (conf/data/*.yaml), so no schema
dataclass holds them; their types are checked first, by source (targets.py). `check_data`
checks a built-in source's values and that its files are there, before any run folder
exists; a source of your own is checked by its own code when it builds the datasets.
The checks of the sources read from disk are in disk_checks.py, loaded by a run of one.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from gearshift.config.rules import check_int, fail, locate

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
# Sources with a check of their own (a function of gearshift.config), by _target_: each
# module loads for its source only.
SOURCE_CHECKS = {
    "gearshift.data.tokens.synthetic_tokens": "token_targets.check_synthetic_tokens",
    "gearshift.data.tokens.token_files": "token_files.check_token_config",
    "gearshift.data.hf.hf": "disk_checks.check_hf",
}
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
        locate("data._target_", f"gearshift.config.{SOURCE_CHECKS[target]}")(cfg)
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


# data=tokens' and task=lm's values from the token folder's meta file (config/token_files.py)
def _token_vocab(path: str | None) -> int | None:
    from gearshift.config.token_files import meta_vocab_size

    return meta_vocab_size(path)


def _token_bytes(path: str | None) -> float | None:
    from gearshift.config.token_files import meta_bytes_per_token

    return meta_bytes_per_token(path)


OmegaConf.register_new_resolver("gearshift_token_vocab", _token_vocab)
OmegaConf.register_new_resolver("gearshift_token_bytes", _token_bytes)
