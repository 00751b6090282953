"""true/false given to a config group (`amp=true`, `-m compile=true,false`): Hydra reads
them as booleans, which no group option can be, and ends in a ValueError traceback. A
group with `on` and `off` options (a switch) takes them as on and off; any other group
refuses them in one line that names its options."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import HydraException

from gearshift.config.rules import ConfigError

WORDS = {"true": "on", "false": "off"}
# Hydra's boolean spellings, in any case (True, FALSE): a whole word, not part of a name
_BOOLEAN = re.compile(r"\b(true|false)\b", re.IGNORECASE)


def switches_in_words(
    overrides: Sequence[str], group_options: Callable[[str], list[str]]
) -> list[str]:
    """`overrides` with true/false given to a switch group as on/off (`amp=true` ->
    `amp=on`, `amp=true,false` -> `amp=on,off`), the others as they are; ConfigError for
    true/false given to a group without on and off. `group_options(group)`: its options,
    none for a key that is not a group."""
    parser, worded = OverridesParser.create(), []
    for line in overrides:
        try:
            [override] = parser.parse_overrides([line])
        except HydraException:  # bad syntax: the command line's own check names it
            override = None
        if override is None or override.is_delete() or not _holds_a_boolean(override):
            worded.append(line)
            continue
        group = override.key_or_group
        options = group_options(group)
        key, value = line.split("=", 1)
        if not options or group.startswith("hydra"):  # a key, not a group: its check decides
            worded.append(line)
        elif {"on", "off"} <= set(options):
            worded.append(f"{key}={_BOOLEAN.sub(lambda word: WORDS[word[1].lower()], value)}")
        else:
            given = _BOOLEAN.search(value)
            shown = given[1] if given else value
            raise ConfigError(
                f"{group}={shown} is not allowed; choose one of: {', '.join(options)}"
            )
    return worded


def _holds_a_boolean(override: Override) -> bool:
    value = override.value()
    values = value.list if isinstance(value, ChoiceSweep) else value
    return any(isinstance(v, bool) for v in (values if isinstance(values, list) else [values]))
