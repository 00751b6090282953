"""`logger=csv`: <run folder>/metrics.csv, one step,name,value row per metric and logged step."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from gearshift.observe.logger_backend import Backend

CSV_COLUMNS = ("step", "name", "value")


class CsvLogger(Backend):
    """`path` in long format, one `step,name,value` row per metric and logged step.

    A metric that first appears late (val/... at the first validation) is just more rows,
    so the file never needs a new header. Each log step's rows are flushed, so a killed
    run keeps them. A resumed run keeps the rows up to its checkpoint's step, drops those
    the interrupted run logged after it (it logs them again) and appends.
    """

    label = "CSV"

    def __init__(self, path: Path, start_step: int) -> None:
        def start() -> None:
            kept = _csv_rows_up_to(path, start_step) if path.exists() else []
            tmp = path.with_name(f".{path.name}.tmp")
            with tmp.open("w", newline="") as file:
                csv.writer(file).writerows([CSV_COLUMNS, *kept])
            os.replace(tmp, path)  # whole or not at all
            self.file = path.open("a", newline="")
            self.writer = csv.writer(self.file)

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        def write() -> None:
            self.writer.writerows(
                (step, name, value) for name, value in metrics.items() if value is not None
            )
            self.file.flush()

        self._guarded("log", write)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        def write() -> None:  # `key/i` rows whose value is the text (csv quotes line breaks)
            self.writer.writerows((step, f"{key}/{i}", text) for i, text in enumerate(texts))
            self.file.flush()

        self._guarded("text", write)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.file.close()


def _csv_rows_up_to(path: Path, step: int) -> list[list[str]]:
    """The complete rows of an earlier metrics.csv up to `step` (a run killed while
    writing may have left half a line at the end: it is dropped)."""
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(complete.splitlines()))[1:]  # after the header
    return [row for row in rows if len(row) == len(CSV_COLUMNS) and int(row[0]) <= step]
