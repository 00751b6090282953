"""Tasks: what a run learns. The trainer asks its task for the loss and the validation
metrics; the batch-size finder and the FLOP counter ask it for an example batch."""

from gearshift.tasks.base import Batch, Task, build_task
from gearshift.tasks.classification import Classification
from gearshift.tasks.lm import LanguageModel
from gearshift.tasks.regression import Regression

__all__ = ["Batch", "Classification", "LanguageModel", "Regression", "Task", "build_task"]
