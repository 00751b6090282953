"""gearshift's Hydra sweeper plugin (`hydra/sweeper=gearshift_optuna`); see sweeper.py."""
