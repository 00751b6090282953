"""Turn a text file into token files for data=tokens (nanoGPT's layout).

    python scripts/prepare_text.py input.txt data/mytext                   # characters
    python scripts/prepare_text.py input.txt data/mytext --tokenizer gpt2  # GPT-2 BPE (tiktoken)
    python train.py task=lm data=tokens data.path=data/mytext

Writes OUTDIR/train.bin and OUTDIR/val.bin (flat token ids: uint16, or uint32 when the
vocabulary needs it) and OUTDIR/meta.json (vocab_size, dtype, tokenizer, max_token_id, the
token counts and, for characters, the table that decodes them). The last `--val-fraction`
of the tokens (10%) is the validation split. The text is read as it is (no newline
translation), so decoding train.bin then val.bin gives the file back.
Bad input: one `error:` line and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gearshift.config import ConfigError
from gearshift.data.text import TOKENIZERS, write_token_folder

log = logging.getLogger("prepare_text")


def prepare(
    file: Path, outdir: Path, tokenizer: str = "char", val_fraction: float = 0.1, encoding="utf-8"
) -> dict:
    """Tokenize `file` into `outdir`; returns the meta written. Bad input: ConfigError."""
    if not 0 < val_fraction < 1:
        raise ConfigError(f"--val-fraction={val_fraction} is not allowed; expected 0 < x < 1")
    try:
        with open(file, encoding=encoding, newline="") as stream:  # keep \r\n as it is
            text = stream.read()
    except (OSError, UnicodeDecodeError, LookupError) as error:
        raise ConfigError(f"FILE={str(file)!r} cannot be read as {encoding}: {error}") from None
    chosen = TOKENIZERS[tokenizer]
    coder = chosen.from_text(text) if tokenizer == "char" else chosen()
    ids = coder.encode(text)
    val_tokens = round(len(ids) * val_fraction)
    if val_tokens < 2 or len(ids) - val_tokens < 2:
        raise ConfigError(
            f"FILE={str(file)!r} is not allowed; its {len(ids)} tokens are too few for a "
            f"training and a validation split of 2 tokens or more (--val-fraction={val_fraction})"
        )
    split = len(ids) - val_tokens
    splits = {"train": ids[:split], "val": ids[split:]}
    meta = write_token_folder(
        outdir, splits, coder.vocab_size, {**coder.meta(), "source": file.name}
    )
    log.info(
        "%s: %d tokens (%s, vocabulary %d) -> %s: train.bin %d, val.bin %d (%s), meta.json",
        file, len(ids), tokenizer, coder.vocab_size, outdir, split, val_tokens, meta["dtype"],
    )  # fmt: skip
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="the text file")
    parser.add_argument("outdir", type=Path, help="the folder for train.bin, val.bin, meta.json")
    parser.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="char")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the last share: val.bin")
    parser.add_argument("--encoding", default="utf-8", help="the text file's encoding")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prepare(args.file, args.outdir, args.tokenizer, args.val_fraction, args.encoding)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
