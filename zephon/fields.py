"""One checker for every table of settings: pipeline options, io options, recipe sections and
TorchTitan job config sections.

A table is checked against a dataclass: a key it does not know is an error that lists the keys
it does; a value must have its field's type, read from the annotation (``int``, ``float``,
``str``, ``bool``, ``dict``, ``list``, ``tuple``, ``X | None``, ``Literal[...]``), or, where the
annotation says nothing usable, the type of the field's current value. ``bool`` is never taken
for a number, and a number is never taken for a ``bool``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

_NUMBER = (int, float)


def check_table(table: dict[str, Any], schema: Any, where: str) -> None:
    """Raise ValueError, saying ``where``, unless every key of ``table`` is a field of ``schema``
    (a dataclass or an instance of one) and every value has the field's type."""
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table of settings, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(schema) if not f.name.startswith("_")}
    for key, value in table.items():
        if key not in fields:
            raise ValueError(f"{where}: unknown key {key!r}; valid keys: {sorted(fields)}")
        current = getattr(schema, key, None) if not isinstance(schema, type) else None
        expected = _kinds(fields[key].type, current)
        if expected and not any(_is(value, kind) for kind in expected):
            kinds = " or ".join(_name(k) for k in expected)
            raise ValueError(f"{where}: {key} = {value!r} should be {kinds}")


def _kinds(annotation: Any, current: Any) -> list[Any]:
    """What a value may be: type names (or literal values), [] for anything."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", text.strip())
    if literal:
        return [("literal", v.strip().strip("'\"")) for v in literal.group(1).split(",")]
    kinds = []
    for part in text.split("|"):
        base = part.strip().split("[", 1)[0].removeprefix("typing.").lower()
        if base in ("int", "float", "str", "bool", "dict", "list", "tuple", "none"):
            kinds.append(base)
        else:
            return [type(current).__name__] if current is not None else []
    return kinds


def _is(value: Any, kind: Any) -> bool:
    if isinstance(kind, tuple):
        return str(value) == kind[1]
    if kind == "none":
        return value is None
    if isinstance(value, bool) or kind == "bool":
        return isinstance(value, bool) and kind == "bool"
    if kind == "float":
        return isinstance(value, _NUMBER)
    if kind == "tuple":
        return isinstance(value, list | tuple)
    types = {"int": int, "str": str, "dict": dict, "list": list}
    return isinstance(value, types[kind]) if kind in types else type(value).__name__ == kind


def _name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return repr(kind[1])
    return {"none": "None", "int": "an int", "float": "a number", "str": "a string", "bool": "true or false",
            "dict": "a table", "list": "a list", "tuple": "a list"}.get(kind, f"a {kind}")  # fmt: skip
