"""The run's config: its typed schema (registered with Hydra on import) and its checks."""

from gearshift.config import schema  # noqa: F401  (registers the schema with the ConfigStore)
from gearshift.config.checks import check_config
from gearshift.config.rules import ConfigError

__all__ = ["ConfigError", "check_config"]
