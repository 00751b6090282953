"""gearshift: a PyTorch training template where every speed and memory optimisation is a switch."""

from gearshift.app import preflight, train

__all__ = ["preflight", "train"]
