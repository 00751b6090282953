"""gearshift's Hydra launcher plugin (`hydra/launcher=processes`); see processes.py."""
