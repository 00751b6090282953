"""gearshift's Hydra sweeper plugin (`hydra/sweeper=gearshift_optuna`): an Optuna study
asked and told one trial at a time, trials in flight side by side, pruning, and a study
kept in a journal file in the sweep folder (see sweeper.py)."""
