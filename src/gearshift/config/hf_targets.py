"""The keys of data=hf (a Hugging Face dataset), typed, and its values checked: targets.py's
description of the source and its `check_data` check; loaded by a run of data=hf only. It
shares disk_checks.py's checks of the image values (the decoder, the normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from omegaconf import DictConfig

from gearshift.config.disk_checks import check_decoder, check_image_values, check_normalisation
from gearshift.config.disk_targets import BATCH_DTYPES, DECODERS, ImagesNode
from gearshift.config.rules import check_choice, fail


@dataclass
class HfNode(ImagesNode):
    name: str | None
    split: str
    val_split: str | None
    decoder: Literal[DECODERS]
    streaming: bool


def check_hf(cfg: DictConfig) -> None:
    """data=hf: the values data=imagefolder checks, and one place to read from."""
    data = cfg.data
    check_image_values(cfg, "hf")
    if data.channels not in (1, 3):
        fail("data.channels", data.channels, "hf takes 1 or 3")
    check_choice(cfg, "data.batch_dtype", BATCH_DTYPES)
    check_decoder(data)
    check_normalisation(data)
    if (data.path is None) == (data.name is None):
        fail(
            "data.path",
            data.path,
            "data=hf reads either data.path (a save_to_disk folder or data files) or "
            "data.name (a dataset in the local cache): set one of them",
        )
    if data.path is not None and not Path(data.path).expanduser().exists():
        fail("data.path", data.path, "no such file or folder")
