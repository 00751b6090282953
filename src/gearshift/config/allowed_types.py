"""What a config field's type allows, in words: the end of the line rules.py `check_fields`
gives a value of the wrong type. Loaded only then.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

# A field type's name, one and many (a list's items); a bool's values are named instead.
_NOUNS = {int: ("an integer", "integers"), float: ("a number", "numbers"),
          str: ("a string", "strings"), bool: ("true or false", "booleans")}  # fmt: skip


def allowed(options: tuple[Any, ...]) -> str:
    """What a field whose type joins `options` (rules.py `_options`) allows: "choose true or
    false", "choose one of: a, b", "expected an integer or null", "expected a list of
    numbers or null"."""
    values, nouns, chosen = [], [], False
    for option in options:
        origin, args = typing.get_origin(option), typing.get_args(option)
        if option is bool:
            values += ["true", "false"]
        elif option is type(None):
            values.append("null")
        elif origin is Literal:
            values, chosen = values + [str(a) for a in args], True
        elif origin is list:
            nouns.append("a list of " + _NOUNS[args[0]][1])
        elif origin is dict:
            nouns.append("a mapping")
        else:
            nouns.append(_NOUNS[option][0])
    if nouns:
        return "expected " + _or([*nouns, *values])
    return "choose one of: " + ", ".join(values) if chosen else "choose " + _or(values)


def _or(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]
