"""gearshift's Hydra launcher plugins: `hydra/launcher=processes` (processes.py) and
`hydra/launcher=slurm` (slurm.py). Hydra's plugin scan imports every plugin module in every
run, so each holds only its plugin and config node; the machinery is in a module named
`_*.py`, which the scan skips, imported when a sweep sets the plugin up (`LazyPlugin`).
(No `from __future__ import annotations` in these modules: Hydra loads them outside
sys.modules, where dataclasses cannot resolve them.)
"""

from typing import Any

from hydra.utils import get_class


class LazyPlugin:
    """A plugin whose work its `implementation` does, imported and built with the plugin's
    params when Hydra sets the plugin up. The Optuna sweeper's plugin is one too; its sweep
    calls what a launcher's implementation adds (use_slots, submit, rejoin) on `impl`."""

    implementation: str  # module.Class

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.impl: Any = None  # an `implementation`, once set up

    def setup(self, **context: Any) -> None:  # Hydra's hydra_context, task_function, config
        self.impl = get_class(self.implementation)(**self.params)
        self.impl.setup(**context)
