"""Turn a text file into token files for data=tokens (nanoGPT's layout).

    python scripts/prepare_text.py input.txt data/mytext                   # characters
    python scripts/prepare_text.py input.txt data/mytext --tokenizer gpt2  # GPT-2 BPE (tiktoken)
    python train.py task=lm data=tokens data.path=data/mytext
    python scripts/prepare_text.py data/wiki-parquet data/wiki --column text   # a Hugging Face dataset

A Hugging Face dataset (`--column`; the extra `gearshift[hf]`): FILE is a save_to_disk
folder, a folder of Parquet/Arrow files or one such file, as `data=hf` reads them; the rows
of the text column of `--split` (train) are joined by newlines, in order, into one text.

Writes OUTDIR/train.bin and OUTDIR/val.bin (flat token ids: uint16, or uint32 when the
vocabulary needs it) and OUTDIR/meta.json (vocab_size, dtype, tokenizer, max_token_id, the
token counts, bytes_per_token (the text's UTF-8 bytes over its tokens: task=lm's val_bpb)
and, for characters, the table that decodes them). The last `--val-fraction`
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


def read_dataset_text(path: Path, column: str, split: str = "train") -> str:
    """The rows of a Hugging Face dataset's text `column`, joined by newlines."""
    from gearshift.data.hf import check_columns, load, splits

    try:
        rows, _ = splits(load(str(path), None)[0], split, None)
    except ConfigError as error:  # data=hf's keys are this script's arguments here
        message = str(error).replace("data.path=", "FILE=").replace("data.split=", "--split=")
        raise ConfigError(message) from None
    try:
        check_columns(rows, {"column": column})
    except ConfigError as error:
        raise ConfigError(str(error).replace("data.column=", "--column=")) from None
    texts = rows[column]
    if texts and not isinstance(texts[0], str):
        raise ConfigError(
            f"--column={column!r} is not allowed; it holds {type(texts[0]).__name__}, not text"
        )
    return "\n".join(texts)


def prepare(
    file: Path,
    outdir: Path,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    encoding="utf-8",
    column: str | None = None,
    split: str = "train",
) -> dict:
    """Tokenize `file` (or a dataset's text `column`) into `outdir`; returns the meta
    written. Bad input: ConfigError."""
    if not 0 < val_fraction < 1:
        raise ConfigError(f"--val-fraction={val_fraction} is not allowed; expected 0 < x < 1")
    if column is not None:
        text = read_dataset_text(file, column, split)
    else:
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
    # val_bpb (task=lm): the loss per token over the bytes a token stands for, on average
    bytes_per_token = len(text.encode("utf-8")) / len(ids)
    meta = write_token_folder(
        outdir, splits, coder.vocab_size,
        {**coder.meta(), "source": file.name, "bytes_per_token": bytes_per_token},
    )  # fmt: skip
    log.info(
        "%s: %d tokens (%s, vocabulary %d) -> %s: train.bin %d, val.bin %d (%s), meta.json",
        file, len(ids), tokenizer, coder.vocab_size, outdir, split, val_tokens, meta["dtype"],
    )  # fmt: skip
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="the text file (--column: the dataset)")
    parser.add_argument("outdir", type=Path, help="the folder for train.bin, val.bin, meta.json")
    parser.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="char")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the last share: val.bin")
    parser.add_argument("--encoding", default="utf-8", help="the text file's encoding")
    parser.add_argument("--column", help="FILE is a Hugging Face dataset: its text column")
    parser.add_argument("--split", default="train", help="--column: the dataset's split")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prepare(
            args.file, args.outdir, args.tokenizer, args.val_fraction, args.encoding,
            args.column, args.split,
        )  # fmt: skip
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
