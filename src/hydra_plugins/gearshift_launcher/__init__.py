"""gearshift's Hydra launcher plugins (`hydra/launcher=processes`, `slurm`); see launchers.py."""
