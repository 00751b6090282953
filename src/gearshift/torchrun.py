"""`python -m gearshift.torchrun ARGS`: torchrun (its own parser and launch, the same ARGS),
with unusable input ending in one line.

Input that the ranks find unusable as they build (bad data, task or checkpoint; a bad
override) ends as it does in one process: rank 0's `error:` line, once, and exit 2. Plain
`torchrun` prints that line too, but its agent is a process of its own that a training
script cannot reach: it then logs its ChildFailedError report and exits 1. Here rank 0
writes its line to a note (run_endings.ERROR_NOTE) instead, the agent's failure report is dropped
once the note exists, and the line is printed when every rank has exited. Anything else
(a training failure, a signal, the rendezvous) ends as under torchrun.

    python -m gearshift.torchrun --standalone --nproc_per_node=2 train.py data=hf ...
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from gearshift.run_endings import ERROR_NOTE, EXIT_BAD_CONFIG


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from gearshift.local_ranks import quiet_shutdown

    with tempfile.TemporaryDirectory(prefix="gearshift-torchrun-") as scratch:
        note = Path(scratch) / "error.txt"
        os.environ[ERROR_NOTE] = str(note)  # the ranks inherit it
        with quiet_shutdown(note):
            try:
                run(parse_args(argv))
            except ChildFailedError:
                if not note.exists():
                    raise  # not unusable input: torchrun's own report
                print(f"error: {note.read_text()}", file=sys.stderr)
                return EXIT_BAD_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main())
