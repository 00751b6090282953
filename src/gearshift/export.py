"""A checkpoint's model as files other tools load: `python -m gearshift.export resume=PATH out=DIR`.

    python -m gearshift.export resume=runs/my-run/checkpoints/best out=exported
    python -m gearshift.export resume=... format=hf out=gpt2-mine   # model=gpt only
    python -m gearshift.export resume=... out=exported --raw          # not the weight average

`format=torch` (the default), any model: OUT/model.pt, the consolidated state dict
(`torch.save`; `model.load_state_dict(torch.load("model.pt"))` into the class, no gearshift
needed), OUT/model.safetensors beside it when safetensors is installed, and OUT/model.json,
the model node (`_target_` and its arguments) that builds the class.

`format=hf`, the GPT: OUT/config.json and OUT/model.safetensors, a folder that
`transformers.GPT2LMHeadModel.from_pretrained(OUT)` loads with the same logits
(models/hf_gpt2.py; needs safetensors, `pip install 'gearshift[hf]'`), and that
`model.init_from=OUT` reads back.

The model is built from the checkpoint as evaluate.py builds it; without `--raw` a
checkpoint with a weight average exports the average. Files are written under temporary
names and renamed at the end. Bad input (an out folder that cannot be written, format=hf
for another model) ends with one `error:` line, exit 2, and nothing written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from gearshift.app import default_config_dir
from gearshift.config import ConfigError
from gearshift.config.schema import MODEL_KEYS
from gearshift.evaluate import BAD_INPUT, bad_input, load_model, split_resume
from gearshift.models import hf_gpt2
from gearshift.models.gpt import GPT

log = logging.getLogger("gearshift.export")

FORMATS = ("torch", "hf")


def split_export(overrides: list[str]) -> tuple[str, Path, list[str]]:
    """format= and out= (checked), and the other (config) overrides."""
    values = {"format": "torch", "out": None}
    rest = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key in values:
            values[key] = value
        else:
            rest.append(item)
    if values["format"] not in FORMATS:
        raise ConfigError(f"format={values['format']!r} is not allowed; choose one of: {', '.join(FORMATS)}")  # fmt: skip
    if not values["out"]:
        raise ConfigError("out=None is not allowed; give the folder to write: out=DIR")
    return values["format"], Path(values["out"]).expanduser(), rest


def check_writable(out: Path) -> None:
    """The folder `out` can be made and written; else one line (nothing is left behind)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={str(out)!r} is not allowed; it is a file, not a folder")
    existing = next((p for p in [out, *out.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"out={str(out)!r} is not allowed; {existing} cannot be written")


def write_atomic(path: Path, write) -> None:
    """`write(tmp)` then rename onto `path`: a cut-short export leaves no half file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def safetensors_module():
    try:
        import safetensors.torch
    except ImportError:
        return None
    return safetensors.torch


def export(path: Path, fmt: str, out: Path, overrides: list[str], config_dir: Path, raw: bool) -> list[Path]:  # fmt: skip
    """Write the checkpoint's model to `out` in `fmt`; the files written."""
    check_writable(out)
    model, cfg = load_model(path, overrides, config_dir, raw)
    model = model.cpu()
    st = safetensors_module()
    if fmt == "hf":
        if not isinstance(model, GPT):
            raise ConfigError(f"format='hf' is not allowed; it writes GPT-2 folders (model=gpt), this checkpoint holds a {type(model).__name__}")  # fmt: skip
        if st is None:
            raise ConfigError("format='hf' needs safetensors, an optional extra: pip install 'gearshift[hf]'")  # fmt: skip
        tensors, config = hf_gpt2.to_hf(model)
        files = {
            "model.safetensors": lambda p: st.save_file(tensors, str(p), metadata={"format": "pt"}),
            "config.json": lambda p: p.write_text(json.dumps(config, indent=1) + "\n"),
        }
    else:
        node = OmegaConf.to_container(cfg.model, resolve=True)
        node = {k: v for k, v in node.items() if k not in MODEL_KEYS and k != "checkpointing"}
        files = {
            "model.pt": lambda p: torch.save(model.state_dict(), p),
            "model.json": lambda p: p.write_text(json.dumps(node, indent=1) + "\n"),
        }
        if st is not None:  # shared (tied) tensors are written once
            files["model.safetensors"] = lambda p: st.save_model(model, str(p))
    out.mkdir(parents=True, exist_ok=True)
    for name, write in files.items():
        write_atomic(out / name, write)
    return [out / name for name in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", type=Path, default=None, help="default: ./conf")
    parser.add_argument("--raw", action="store_true", help="the trained weights, not their average")
    parser.add_argument("overrides", nargs="*", help="resume=PATH format=torch|hf out=DIR, config overrides")  # fmt: skip
    args = parser.parse_args(argv)
    config_dir = (args.config_dir or default_config_dir()).resolve()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        path, rest = split_resume(args.overrides)
        fmt, out, overrides = split_export(rest)
        written = export(path, fmt, out, overrides, config_dir, args.raw)
    except BAD_INPUT as error:
        return bad_input(error)
    for file in written:
        print(file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
