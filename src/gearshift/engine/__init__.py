"""The step's machinery: device and backend switches, mixed precision, optimizer and schedule."""
