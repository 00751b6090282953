"""`hydra.sweeper.params` (Hydra's override grammar) as Optuna distributions.

    choice(32, 64, 128)           -> CategoricalDistribution
    range(1, 9, 2)                -> IntDistribution(1, 7, step=2): Hydra's range, stop excluded
    interval(0.001, 0.5)          -> FloatDistribution(0.001, 0.5)
    tag(log, interval(1e-4, 1))   -> FloatDistribution(1e-4, 1, log=True)
    interval(1, 8)                -> IntDistribution(1, 8) (both ends integers)
    a plain value (amp=off)       -> fixed: every trial gets it

Optuna's distributions are imported where one is built, not with the module.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
)


class SearchSpaceError(ValueError):
    """A params entry that is no distribution: the message names the key and the value."""


@dataclass
class SearchSpace:
    distributions: dict[str, Any]  # name -> optuna.distributions.BaseDistribution
    fixed: list[str]  # overrides every trial gets as they are
    grid: dict[str, list[Any]]  # name -> every value (what the grid sampler walks)
    not_gridded: list[str]  # the names that have no finite list of values (intervals)


def parse_search_space(params: Mapping[str, str] | None, arguments: list[str]) -> SearchSpace:
    """The sweep's distributions from `params` and the command line's `arguments` (a sweep on
    the command line searches that key too; a plain override is fixed for every trial)."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()]
    parser = OverridesParser.create()
    space = SearchSpace({}, [], {}, [])
    for line in [*lines, *arguments]:
        try:
            [override] = parser.parse_overrides([line])
        except Exception as error:
            raise SearchSpaceError(f"{line!r} is not allowed; {_first_line(error)}") from None
        if not override.is_sweep_override():
            space.fixed.append(override.input_line)
            continue
        key = override.get_key_element()  # the command line's wins over the preset's
        space.distributions[key], values = distribution(override)
        space.grid.pop(key, None)
        if key in space.not_gridded:
            space.not_gridded.remove(key)
        if values is None:
            space.not_gridded.append(key)
        else:
            space.grid[key] = values
    return space


def distribution(override: Override) -> tuple[Any, list[Any] | None]:
    """The Optuna distribution of one sweep override, and its values when they are finite."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    key, value = override.get_key_element(), override.value()
    allowed = (
        "choice(...), range(start, stop[, step]), interval(low, high), tag(log, interval(...))"
    )
    if isinstance(value, ChoiceSweep):
        choices = [v for v in override.sweep_iterator(transformer=lambda v: v)]
        if any(isinstance(c, (list, dict)) for c in choices):
            raise SearchSpaceError(f"{key}: choices must be numbers, strings, booleans or null")
        return CategoricalDistribution(choices), choices
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator(transformer=lambda v: v))
        if not values:
            raise SearchSpaceError(f"{key}={_text(override)} is not allowed; the range is empty")
        if all(isinstance(v, int) for v in values):
            return IntDistribution(values[0], values[-1], step=int(value.step)), values
        return CategoricalDistribution(values), values
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        low, high = value.start, value.end
        if not low < high:
            raise SearchSpaceError(
                f"{key}={_text(override)} is not allowed; an interval needs low < high"
            )
        if log and low <= 0:
            raise SearchSpaceError(
                f"{key}={_text(override)} is not allowed; a log interval needs low > 0"
            )
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log), None
        return FloatDistribution(float(low), float(high), log=log), None
    raise SearchSpaceError(f"{key}={_text(override)} is not allowed; use one of: {allowed}")


def _text(override: Override) -> str:
    return override.input_line.split("=", 1)[1] if override.input_line else str(override.value())


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
