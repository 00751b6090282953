"""The gear advisor on a config, without training: `python -m gearshift.advise [overrides...]`.

    python -m gearshift.advise batch_size=12 model=simple_cnn model.conv_bias=true
    python -m gearshift.advise --device cuda experiment=fast   # advise for a GPU from a laptop

Composes the config as train.py would (same conf/ tree, same checks), builds the model on
the meta device (no memory, no compute), prints the findings and exits 0; a bad config is
one line and exit 2, as with train.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from gearshift.app import default_config_dir, preflight
from gearshift.config_advice import advise_config
from gearshift.engine.precision import resolve_amp
from gearshift.engine.runtime import resolve_device
from gearshift.models.factory import build_model, memory_layout
from gearshift.observe.findings import Finding


def target_device(cfg: DictConfig, choice: str | None) -> torch.device:
    if choice is None:
        return resolve_device(cfg.device)
    return torch.device(choice)


def amp_dtype_for(cfg: DictConfig, device: torch.device) -> torch.dtype | None:
    if cfg.amp.dtype == "auto" and device.type == "cuda" and not torch.cuda.is_available():
        return torch.bfloat16  # advising for a GPU elsewhere: assume one from Ampere on
    return resolve_amp(cfg.amp.dtype, device).dtype


def build_on_meta(cfg: DictConfig) -> torch.nn.Module:
    """The config's model with its structure and shapes, but no storage behind them."""
    layout = memory_layout(cfg.memory_format.channels_last)
    meta = torch.device("meta")
    with meta:
        return build_model(cfg.model, meta, layout)


def format_findings(findings: list[Finding], cfg: DictConfig, device: torch.device) -> str:
    head = (
        f"gearshift advisor: {len(findings) or 'no'} finding(s) for "
        f"model {cfg.model._target_} on {device}, batch_size {cfg.batch_size}"
    )
    lines = [head]
    for finding in findings:
        lines += [f"[{finding.id}] {finding.message}", f"    fix: {finding.fix}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="the device to advise for (default: the config's; cuda needs no GPU here)",
    )
    parser.add_argument("--config-dir", type=Path, default=None, help="default: ./conf")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for train.py")
    args = parser.parse_args(argv)
    config_dir = (args.config_dir or default_config_dir()).resolve()
    try:
        preflight(config_dir, argv=args.overrides)  # a bad value: one line, as with train.py
    except SystemExit as exit:
        return int(exit.code or 0)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose("config", overrides=args.overrides)
    device = target_device(cfg, args.device)
    findings = advise_config(cfg, build_on_meta(cfg), device, amp_dtype_for(cfg, device))
    print(format_findings(findings, cfg, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
