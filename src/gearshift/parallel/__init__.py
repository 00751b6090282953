"""Ranks, the process group, and the DDP / DataParallel / FSDP wrappers."""
