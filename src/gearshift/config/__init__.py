"""The run's config: its typed schema (registered with Hydra on import) and its checks."""

from gearshift.config import schema  # noqa: F401  (registers the schema with the ConfigStore)
from gearshift.config.checks import ConfigError, check_config

__all__ = ["ConfigError", "check_config"]
