"""gearshift: a PyTorch training template where every speed and memory optimisation is a switch."""

from gearshift.app import preflight, run_task

__all__ = ["preflight", "run_task"]
