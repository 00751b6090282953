"""Samples from a GPT checkpoint: `python -m gearshift.generate resume=PATH prompt="..."`.

    python -m gearshift.generate resume=runs/my-run/checkpoints/best prompt="the cat"
    python -m gearshift.generate resume=... prompt="the" max_new_tokens=200 temperature=0.8 \\
        top_k=40 num_samples=3 seed=1
    python -m gearshift.generate resume=... prompt="the" temperature=0   # greedy
    python -m gearshift.generate resume=... prompt="the" --raw  # the trained weights, not the average

The model is built from the checkpoint's config as evaluate.py builds it (build.py
`build_parts`, no optimizer) and samples with a KV cache (models/sampling.py). Without
`--raw` a checkpoint with a weight average (`ema.decay`) samples from the average. The
prompt is encoded and the samples decoded with the token folder's vocabulary
(`data=tokens`: meta.json/meta.pkl characters, or GPT-2's byte pairs through tiktoken);
data without one (`data=synthetic_tokens`) takes and prints token ids (`prompt="3 14 15"`).
Without `prompt=`, the samples start from the vocabulary's first token (id 0), as the
task's samples do with `task.sample_prompt=null`: every data has it.
Other `key=value` arguments are config overrides (`device=cpu`, `amp=bf16`).

Bad input (a prompt with characters outside the vocabulary, a checkpoint of another
model than the GPT, a bad value) ends with one `error:` line and exit 2.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from gearshift.app import default_config_dir
from gearshift.config import ConfigError
from gearshift.data.text import codec_for
from gearshift.evaluate import BAD_INPUT, bad_input, load_model, split_resume
from gearshift.models.gpt import GPT
from gearshift.models.sampling import generate

log = logging.getLogger("gearshift.generate")


@dataclass
class Options:
    """The sampling keys of the command line (the others are config overrides)."""

    prompt: str | None = None  # None: the vocabulary's first token, which every data has
    max_new_tokens: int = 100
    temperature: float = 1.0  # zero: greedy
    top_k: int | None = None
    num_samples: int = 1
    seed: int = 0


def split_options(overrides: list[str]) -> tuple[Options, list[str]]:
    """The sampling options (checked) and the remaining config overrides."""
    options, rest = Options(), []
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in Options.__dataclass_fields__:
            rest.append(item)
            continue
        setattr(options, key, value)  # converted below
    for key, kind, minimum in (
        ("max_new_tokens", int, 1),
        ("num_samples", int, 1),
        ("seed", int, 0),
        ("top_k", int, 1),
        ("temperature", float, 0.0),
    ):
        value = getattr(options, key)
        if value is None or not isinstance(value, str):
            continue
        if key == "top_k" and value in ("null", "none", ""):
            options.top_k = None
            continue
        try:
            number = kind(value)
        except ValueError:
            number = None
        if number is None or number < minimum or number != number:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"{key}={value!r} is not allowed; expected {what} >= {minimum}")
        setattr(options, key, number)
    return options, rest


def load_gpt(
    path: Path, overrides: list[str], config_dir: Path, raw: bool
) -> tuple[GPT, DictConfig]:
    """The checkpoint's GPT (evaluate.py `load_model`), or one line for another model."""
    model, cfg = load_model(path, overrides, config_dir, raw)
    if not isinstance(model, GPT):
        raise ConfigError(
            f"resume={str(path)!r} is not allowed; it holds a {type(model).__name__}, "
            "and generation needs model=gpt (gearshift.models.GPT)"
        )
    return model, cfg


def sample(
    path: Path, options: Options, overrides: list[str], config_dir: Path, raw: bool
) -> list[str]:
    """`options.num_samples` continuations of the prompt, decoded (the prompt included)."""
    model, cfg = load_gpt(path, overrides, config_dir, raw)
    codec = codec_for(cfg.data)
    # as task.sample_prompt=null: "\n" is not in every vocabulary (nor are ids in text's)
    prompt = np.zeros(1, dtype=np.int64) if options.prompt is None else None
    try:
        prompt = codec.encode(options.prompt) if prompt is None else prompt
    except ValueError as error:
        raise ConfigError(f"prompt={options.prompt!r} is not allowed; {error}") from None
    if len(prompt) == 0:
        raise ConfigError(f"prompt={options.prompt!r} is not allowed; it encodes to no token")
    device = model.wte.weight.device
    idx = torch.as_tensor(prompt, device=device).long().repeat(options.num_samples, 1)
    generator = torch.Generator(device=device).manual_seed(options.seed)
    out = generate(
        model, idx, options.max_new_tokens, options.temperature, options.top_k,
        generator=generator,
    )  # fmt: skip
    return [codec.decode(row) for row in out.cpu().numpy()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", type=Path, default=None, help="default: ./conf")
    parser.add_argument("--raw", action="store_true", help="the trained weights, not their average")
    parser.add_argument(
        "overrides", nargs="*",
        help="resume=PATH prompt=... max_new_tokens= temperature= top_k= num_samples= seed=, "
        "and config overrides",
    )  # fmt: skip
    args = parser.parse_args(argv)
    config_dir = (args.config_dir or default_config_dir()).resolve()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        path, rest = split_resume(args.overrides)
        options, overrides = split_options(rest)
        samples = sample(path, options, overrides, config_dir, args.raw)
    except BAD_INPUT as error:
        return bad_input(error)
    for i, text in enumerate(samples):
        if len(samples) > 1:
            print(f"--- sample {i + 1}")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
