"""The line for a dict batch whose fields a task's `split` cannot find (`Task.input_fields` /
`target_fields`, or the names `data.fields` gave). Loaded on that error only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gearshift.tasks.metrics import task_name


def unreadable(task: Any, batch: Mapping[str, Any]) -> str:
    return (
        f"task._target_={task_name(task)!r} cannot read the samples: their fields are "
        f"{', '.join(map(str, batch)) or 'none'}; it reads {task.wanted()}; name yours "
        "with data.fields.inputs=NAME data.fields.targets=NAME"
    )
