"""Training state that outlives a process: checkpoints, resume, stop signals."""
