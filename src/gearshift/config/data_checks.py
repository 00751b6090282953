"""Checks of the data node: its keys differ by source (conf/data/*.yaml), so no schema
dataclass holds them; their types are checked first, by source (targets.py). `check_data`
checks a built-in source's values and that its files are there, before any run folder
exists; a source of your own is checked by its own code when it builds the datasets.
The checks of the sources read from disk are in disk_checks.py, loaded by a run of one.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from gearshift.config.rules import check_int, fail, locate

# The built-in sources by their _target_: the generated ones, checked here, with the names
# their conf/data files have; the others have a check of their own (a function of
# gearshift.config), whose module loads for its source only.
SYNTHETIC = {
    "gearshift.data.synthetic.synthetic_images": "synthetic",
    "gearshift.data.synthetic_regression.synthetic_regression": "synthetic_regression",
}
SOURCE_CHECKS = {
    "gearshift.data.tokens.synthetic_tokens": "token_targets.check_synthetic_tokens",
    "gearshift.data.tokens.token_files": "token_files.check_token_config",
    "gearshift.data.hf.hf": "disk_checks.check_hf",
    "gearshift.data.images.image_folder": "disk_checks.check_disk_data",
    "gearshift.data.images.cifar10": "disk_checks.check_disk_data",
    "gearshift.data.shards.shards": "disk_checks.check_disk_data",
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
    name = SYNTHETIC.get(target)
    if name is None:
        return  # a source of your own: its code checks its values when it builds the data
    check_int(cfg, "data.num_samples", 1)
    check_int(cfg, "data.num_val_samples", 0)
    for key in ("data.image_size", "data.channels"):
        check_int(cfg, key, 1)
    if name != "synthetic_regression":
        check_int(cfg, "data.num_classes", 2)
    for key, idle in DISK_ONLY.items():
        if cfg.data.get(key, idle) != idle:
            fail(f"data.{key}", cfg.data[key], "it applies to data read from disk only")
    samples = cfg.data.num_samples
    if cfg.dataloader.drop_last and cfg.batch_size != "auto" and samples < cfg.batch_size:
        allowed = f"with dataloader.drop_last=true it must be <= data.num_samples ({samples})"
        fail("batch_size", cfg.batch_size, allowed)


# data=tokens' and task=lm's values from the token folder's meta file (config/token_files.py)
def _token_vocab(path: str | None) -> int | None:
    from gearshift.config.token_files import meta_vocab_size

    return meta_vocab_size(path)


def _token_bytes(path: str | None) -> float | None:
    from gearshift.config.token_files import meta_bytes_per_token

    return meta_bytes_per_token(path)


OmegaConf.register_new_resolver("gearshift_token_vocab", _token_vocab)
OmegaConf.register_new_resolver("gearshift_token_bytes", _token_bytes)
