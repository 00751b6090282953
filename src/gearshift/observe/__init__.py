"""What a run reports: throughput and memory, MFU, the gear advisor, W&B and the console."""
