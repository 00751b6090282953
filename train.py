"""Train with gears from the command line: `python train.py amp=on accum=4` (see README)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

import gearshift

CONF = Path(__file__).parent / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> float:
    return gearshift.train(cfg)


if __name__ == "__main__":
    gearshift.preflight(CONF)  # bad input: one clear line and exit 2, before any run folder
    main()
