"""Models: any importable class through `model._target_`, plus small ones of our own."""

from gearshift.models.gpt import GPT
from gearshift.models.small import MLP, SimpleCNN

__all__ = ["GPT", "MLP", "SimpleCNN"]
