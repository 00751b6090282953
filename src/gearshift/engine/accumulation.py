"""Gradient accumulation (docs/gears.md tip 13): an optimizer step's window of micro-batches."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any


class Window:
    """The micro-batches of one optimizer step: the next `size` batches of `batches`."""

    def __init__(self, batches: Iterator[Any], size: int) -> None:
        self.batches, self.size = batches, size

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Any]:
        return islice(self.batches, self.size)
