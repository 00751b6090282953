"""The exception that ends a run which cannot go on (a non-finite loss, an out-of-memory
error): app.py turns it into one `error: ...` line and exit code 1 (bad input is exit code 2).
"""

from __future__ import annotations


class TrainingFailed(RuntimeError):
    """Training cannot go on; the message is one line for the user, saying why and what next."""
