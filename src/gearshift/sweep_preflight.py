"""preflight's part for a command line that sweeps or searches (app.py): one override list
to check per swept value, and the search-space keys (`hydra.sweeper.params.<key>`) that
Hydra refuses. Loaded when the command line sweeps a value or sets a key of the sweeper's."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

SEARCHED = "hydra.sweeper.params."  # the search space's keys, given on the command line


def swept_variants(parsed: list[Override], fixed: list[str]) -> list[tuple[list[str], str]]:
    """The override lists to compose beside the `fixed` ones: one per swept value, each with
    the override line it checks."""
    variants: list[tuple[list[str], str]] = []
    for o in parsed:
        if _hydra_refuses(o):  # its key's value checked here; the line refused after
            from gearshift.run_endings import a_value

            variants.append(([*fixed, f"{_searched(o)}={a_value(o)}"], o.input_line))
            continue
        if o.is_sweep_override() and not o.key_or_group.startswith("hydra"):
            try:
                values = list(o.sweep_string_iterator())
            except Exception:  # ranges and intervals are for a sweeper to sample
                continue
            for value in values:
                line = f"{o.get_key_element()}={value}"
                variants.append(([*fixed, line], line))
    return variants


def naming_the_swept(swept: str, line: str) -> str:
    """The line a swept value's config fails with; for a search-space key, named first."""
    searched = swept.lstrip("+~").startswith(SEARCHED)
    return f"{swept}: {line}" if searched and not line.startswith(swept) else line


def searched_on_hydra_key(overrides: list[str]) -> str | None:
    """Hydra refuses a sweep of its own config, and `hydra.sweeper.params` holds flat
    keys only: `hydra.sweeper.params.optimizer.lr=choice(...)` cannot be given as such."""
    for o in OverridesParser.create().parse_overrides(overrides):
        if _hydra_refuses(o):
            text = o.input_line.split("=", 1)[1]
            return (
                f"{o.input_line} is not allowed; search a key on the command line as "
                f"{_searched(o)}={text} (or in an hparams_search preset's hydra.sweeper.params)"
            )
    return None


def _hydra_refuses(override: Override) -> bool:
    """A search-space key given as `hydra.sweeper.params.<key>` that Hydra cannot take: a
    sweep of its own config, or a dotted key where the params hold flat ones."""
    searched = override.key_or_group.startswith(SEARCHED)
    return searched and (override.is_sweep_override() or "." in _searched(override))


def _searched(override: Override) -> str:
    """The config key a `hydra.sweeper.params.<key>` override searches."""
    return override.key_or_group.removeprefix(SEARCHED)
