"""Shard sets written by other tools (webdataset's writers, img2dataset, `tar` by hand): the
member index that data=shards reads, built from the tar headers when index.json is absent.

A sample is the tar members that share a key, as WebDataset groups them: the member's path
up to the first dot of its file name (`a/000123.jpg`, `a/000123.cls` are sample `a/000123`,
extensions `jpg` and `cls`). The image is the first of jpg, jpeg, png, webp the sample
holds; the label comes from `data.label_key`: `cls` or `txt` (an integer, or a class name),
`json` (its "label" field) or `json.<field>`; `auto` takes the first of cls, txt, json.

Building reads every header and the small label members, never an image: tarfile steps
from header to header with a seek over each member's data. A tar cut short (a partial copy)
is refused there: tarfile would stop quietly at the cut and lose the members after it. One
index per tar is cached outside the data folder (which may be read-only): under
`$GEARSHIFT_CACHE` or `$XDG_CACHE_HOME/gearshift` (~/.cache/gearshift), keyed by the tar's
absolute path, size, mtime and the label key, so a changed tar is indexed again and the
others are not.

Shard lists are written as webdataset users write them: a folder of tars, one tar, or a
brace list `/data/train-{000000..000099}.tar` (ranges zero-padded as written, `{a,b}`),
or a glob `/data/train-*.tar`. In one folder the names say the splits, as those tools
write them (`train-000000.tar`, `val-000000.tar`; `splits_by_name`).

Why not the `webdataset` package: its reader is a sequential iterator over tar streams
(no member offsets), while data=shards reads any sample with one `os.pread` and resumes a
stream at any member with one seek (data/shards.py); the parts it would give are the key
rule and brace expansion, a few lines each here, against a dependency (and `braceexpand`)
that the template does not otherwise need.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from gearshift.config import ConfigError

log = logging.getLogger(__name__)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")  # the first a sample holds is its image
AUTO_LABEL_KEYS = ("cls", "txt", "json")  # data.label_key=auto: the first a sample holds
CACHE_FORMAT = "gearshift-tar-index/1"
LABEL_KEY = re.compile(r"auto|[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?")
GZIP_MAGIC = b"\x1f\x8b"
# The words of a shard's name that mark its split, as webdataset's and img2dataset's users
# name them; "test" shards are neither trained on nor validated (held out for the end).
SPLIT_WORDS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: `{000..003}` (zero-padded when an end is), `{a,b}`;
    several braces multiply, left to right."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end() :]
    span = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if span:
        first, last = span.groups()
        padded = (len(first) > 1 and first[0] == "0") or (len(last) > 1 and last[0] == "0")
        width = max(len(first), len(last)) if padded else 0
        step = 1 if int(last) >= int(first) else -1
        items = [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    elif "," in body:
        items = body.split(",")
    else:  # `{x}`: no list, kept as written (as bash does)
        return [head + "{" + body + "}" + rest for rest in expand_braces(tail)]
    return [head + item + rest for item in items for rest in expand_braces(tail)]


def shard_files(path: str, key: str = "data.path") -> list[Path]:
    """The tars `path` names: a folder's *.tar (sorted), one .tar, a brace list or a glob."""
    where = Path(path).expanduser()
    if where.is_dir():
        return sorted(where.glob("*.tar"))
    files = []
    for name in expand_braces(path):
        if any(c in name for c in "*?["):  # a glob: what matches, in name order
            files += sorted(Path(p) for p in glob.glob(os.path.expanduser(name)))
        else:
            files.append(Path(name).expanduser())
    if not files:
        raise ConfigError(f"{key}={path!r} is not allowed; no .tar file matches it")
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise ConfigError(
            f"{key}={path!r} is not allowed; {len(missing)} of the {len(files)} shards it "
            f"names do not exist (the first: {missing[0]}); expected a folder of .tar files, "
            "one .tar or a brace list such as /data/train-{000000..000099}.tar"
        )
    return files


def name_split(file: Path) -> str | None:
    """The split a shard's name marks: "train", "val" or "test" where a word of it (between
    -, _ and .) is one of SPLIT_WORDS (`train-000000.tar`, `imagenet-validation-03.tar`)."""
    words = re.split(r"[-_.]", file.name.lower())
    return next((SPLIT_WORDS[w] for w in words if w in SPLIT_WORDS), None)


def splits_by_name(files: list[Path], source: str) -> dict[str, list[Path]] | None:
    """A folder's shards by the split their names mark, {"train": [...], "val": [...],
    "test": [...]}; None where no name marks one (`000000.tar`, ...: one training split)."""
    marked = {file: name_split(file) for file in files}
    if not any(marked.values()):
        return None
    unmarked = [file.name for file, split in marked.items() if split is None]
    if unmarked:
        raise ConfigError(
            f"data.path={source!r} is not allowed; its shards' names mark their splits "
            f"(train-*, val-*, validation-*, test-*) but {unmarked[0]} marks none: rename it "
            "or move it out"
        )
    splits = {split: [f for f in files if marked[f] == split] for split in ("train", "val", "test")}
    if not splits["train"]:
        raise ConfigError(
            f"data.path={source!r} is not allowed; its shards' names mark no training shards "
            f"(train-*.tar), only {', '.join(s + '-*' for s in splits if splits[s])}"
        )
    return splits


def split_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member's path as WebDataset splits it; None: no extension."""
    folder, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem:  # `README`, `.hidden`: not a sample's member
        return None
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def _label_value(raw: bytes, label_key: str, where: str) -> int | str:
    """A label member's bytes -> an integer label or a class name."""
    try:
        text = raw.decode("utf-8").strip()
        if label_key.split(".")[0] == "json":
            field = label_key.partition(".")[2] or "label"
            value = json.loads(text)[field]
            text = str(value).strip()
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        what = f"{type(error).__name__}: {error}" if not isinstance(error, KeyError) else ""
        field = label_key.partition(".")[2] or "label"
        raise ConfigError(
            f"data.label_key={label_key!r} is not allowed; {where} holds no label"
            + (f" ({what})" if what else f" (no {field!r} field)")
            + "; expected an integer or a class name"
            + (", or set data.label_key=json.<field>" if label_key.startswith("json") else "")
        ) from None
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def scan_tar(path: Path, label_key: str, source: str, setting: str = "data.path") -> dict[str, Any]:
    """One tar's index entry from its headers: the image members' offsets and sizes, and the
    labels (read from their small members). Bad: ConfigError naming `setting`=`source`."""
    with open(path, "rb") as handle:
        if handle.read(2) == GZIP_MAGIC:
            raise ConfigError(
                f"{setting}={source!r} is not allowed; shard {path} is compressed (gzip): "
                "data=shards seeks into uncompressed tars; gunzip it"
            )
    try:
        with tarfile.open(path, "r:") as tar:
            samples = _read_headers(tar, path, f"{setting}={source!r}")
            members, offsets, sizes, labels = [], [], [], []
            for key, parts in samples.items():
                image = next((e for e in IMAGE_KEYS if e in parts), None)
                wanted = AUTO_LABEL_KEYS if label_key == "auto" else (label_key.split(".")[0],)
                label = next((e for e in wanted if e in parts), None)
                if image is None:
                    raise ConfigError(
                        f"{setting}={source!r} is not allowed; sample {path}:{key} holds "
                        f"{', '.join(sorted(parts))}: no image ({', '.join(IMAGE_KEYS)})"
                    )
                if label is None:
                    raise ConfigError(
                        f"data.label_key={label_key!r} is not allowed; sample {path}:{key} holds "
                        f"{', '.join(sorted(parts))}: no {' or '.join(wanted)} member; set "
                        "data.label_key to the extension that holds the label (cls, txt, "
                        "json, json.<field>)"
                    )
                file = tar.extractfile(parts[label])
                assert file is not None  # a regular file
                key_used = label_key if label_key != "auto" else label
                where = f"{path}:{parts[label].name}"
                labels.append(_label_value(file.read(), key_used, where))
                members.append(parts[image].name)
                offsets.append(parts[image].offset_data)
                sizes.append(parts[image].size)
    except (tarfile.TarError, OSError) as error:
        raise ConfigError(
            f"{setting}={source!r} is not allowed; shard {path} is not a readable tar "
            f"({type(error).__name__}: {error}); write it again"
        ) from None
    return {
        "file": str(path),
        "samples": len(members),
        "members": members,
        "offsets": offsets,
        "sizes": sizes,
        "labels": labels,
    }


def _read_headers(
    tar: tarfile.TarFile, path: Path, named: str
) -> dict[str, dict[str, tarfile.TarInfo]]:
    """The tar's file members by sample key and extension, read header by header (the data
    between is skipped with a seek); a member past the file's end, or a file that ends
    without the end-of-archive blocks, is a shard cut short (a partial copy): ConfigError."""
    length = path.stat().st_size
    samples: dict[str, dict[str, tarfile.TarInfo]] = {}
    last = None
    for info in tar:
        end = info.offset_data + info.size
        if end > length:
            raise _truncated(named, path, length, f", member {info.name} ends at byte {end}")
        key_extension = split_name(info.name) if info.isfile() else None
        if key_extension is not None:
            key, extension = key_extension
            samples.setdefault(key, {})[extension] = info
        last = info
    _check_end(tar, path, named, length, last)
    return samples


def _truncated(named: str, path: Path, length: int, what: str) -> ConfigError:
    return ConfigError(
        f"{named} is not allowed; shard {path} is truncated: it holds {length} "
        f"bytes{what}; copy or write it again"
    )


def _check_end(
    tar: tarfile.TarFile, path: Path, named: str, length: int, last: tarfile.TarInfo | None
) -> None:
    """After the last header tarfile read, the end-of-archive blocks (zeros): tarfile stops
    quietly at the end of the file or at a header it cannot parse, which is how a shard cut
    short (a partial copy) or overwritten looks: the members after it would be lost."""
    after = f"member {last.name}" if last is not None else "the start"
    assert tar.fileobj is not None
    tar.fileobj.seek(tar.offset)
    block = tar.fileobj.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE:
        raise _truncated(
            named, path, length,
            f" and ends after {after} (byte {tar.offset}), where a header or the "
            "end-of-archive blocks belong",
        )  # fmt: skip
    if block.count(0) != len(block):
        raise ConfigError(
            f"{named} is not allowed; shard {path} does not parse: the header at "
            f"byte {tar.offset}, after {after}, is not a tar header; write it again"
        )


def cache_root() -> Path:
    if os.environ.get("GEARSHIFT_CACHE"):
        return Path(os.environ["GEARSHIFT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "gearshift"


def _cache_file(path: Path, label_key: str) -> Path:
    status = path.stat()
    identity = f"{path.resolve()}|{status.st_size}|{status.st_mtime_ns}|{label_key}"
    digest = hashlib.sha1(identity.encode()).hexdigest()[:16]
    return cache_root() / "tar-index" / f"{path.stem}-{digest}.json"


def _cached_scan(
    path: Path, label_key: str, source: str, setting: str
) -> tuple[dict[str, Any], bool]:
    """(the tar's entry, whether it came from the cache); a cache that cannot be written is
    only logged (the next start indexes it again)."""
    cache = _cache_file(path, label_key)
    try:
        cached = json.loads(cache.read_text())
        if cached.get("format") == CACHE_FORMAT:
            return {**cached["entry"], "file": str(path)}, True
    except (OSError, ValueError, KeyError):
        pass
    entry = scan_tar(path, label_key, source, setting)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps({"format": CACHE_FORMAT, "entry": entry}))
        os.replace(temporary, cache)  # atomic: ranks indexing at once never read half a file
    except OSError as error:
        log.warning("data: cannot cache the index of %s in %s (%s)", path, cache.parent, error)
    return entry, False


def index_from_headers(
    files: list[Path],
    label_key: str,
    source: str,
    classes: list[str] | None = None,
    setting: str = "data.path",
) -> dict[str, Any]:
    """An index like index.json's for `files`: "classes" None where the labels are integers,
    else the sorted class names (or `classes`, a training split's, for validation) with the
    labels their positions."""
    if not files:
        raise ConfigError(f"{setting}={source!r} is not allowed; it holds no .tar files")
    start, fresh = time.perf_counter(), 0
    shards = []
    for file in files:
        entry, cached = _cached_scan(file, label_key, source, setting)
        fresh += not cached
        shards.append(entry)
    log.info(
        "data: %d shards of %s indexed from their tar headers in %.2f s (%d from the cache in %s)",
        len(files), source, time.perf_counter() - start, len(files) - fresh, cache_root(),
    )  # fmt: skip
    labels = [label for shard in shards for label in shard["labels"]]
    if all(isinstance(label, int) for label in labels):
        return {"classes": None, "shards": shards}
    names = sorted({str(label) for label in labels}) if classes is None else classes
    positions = {name: n for n, name in enumerate(names)}
    for shard in shards:
        unknown = [str(x) for x in shard["labels"] if str(x) not in positions]
        if unknown:
            raise ConfigError(
                f"{setting}={source!r} is not allowed; shard {shard['file']} has the class "
                f"{unknown[0]!r}, which the training shards lack"
            )
        shard["labels"] = [positions[str(x)] for x in shard["labels"]]
    return {"classes": names, "shards": shards}
