"""`logger=tensorboard`: event files in <run folder>/tensorboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gearshift.observe.logger_backend import Backend


class TensorBoardLogger(Backend):
    """Scalars into `folder` (`tensorboard --logdir runs`), one tag per metric name."""

    label = "TensorBoard"

    def __init__(self, folder: Path, start_step: int) -> None:
        def start() -> None:
            from torch.utils.tensorboard import SummaryWriter

            # The run logs steps after start_step: TensorBoard drops what an earlier run in
            # this folder logged there (a resumed run's checkpoint is at start_step), so no
            # step shows twice.
            self.writer = SummaryWriter(str(folder), purge_step=start_step + 1)

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        def write() -> None:
            for name, value in metrics.items():
                if value is not None:
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()  # log steps are few: a killed run keeps what it logged

        self._guarded("log", write)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        def write() -> None:
            # TensorBoard renders markdown: each text as a code block keeps its line breaks
            blocks = [f"**{i}**\n\n```\n{text}\n```" for i, text in enumerate(texts)]
            self.writer.add_text(key, "\n\n".join(blocks), step)
            self.writer.flush()

        self._guarded("text", write)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.writer.close()
