"""Read a W&B transaction log (`run-*.wandb`) with W&B's own protobuf Record type.

wandb >= 0.19 dropped its Python reader of these files; the framing is LevelDB's log
format (32 KiB blocks of CRC-framed chunks after a 7-byte ':W&B' header), and each
record is a `wandb_internal_pb2.Record`, which wandb ships and parses here.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from helpers import seconds

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a chunk header
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block
            continue
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        if kind in (FULL, LAST):
            records.append(wandb_internal_pb2.Record.FromString(pending))
    return records


def finished_records(path: Path, timeout: float = 30.0) -> list:
    """The records once the run's exit record is on disk: W&B's service writes after finish()."""
    timeout = seconds(timeout)
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.2)


def history(path: Path) -> list[dict]:
    """Each `run.log` call's metrics, as {key: value}."""
    rows = []
    for record in finished_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
