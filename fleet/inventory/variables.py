"""Every host variable, read from its one declaration (the annotated fields of `Host`, and of each registered
scheduler's `VARIABLES` record, `fleet.model.plugs.Scheduled.variables`), and docs/operating.md's table.

`python -m fleet.inventory.variables` prints the table; tests/unit/test_variables.py
fails when docs/operating.md's "Host variables" table differs from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from functools import cache
from types import NoneType
from typing import Any, get_args, get_origin, get_type_hints

from fleet.inventory.host import Host, Var
from fleet.model import plugs


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One host variable: its `Host` field's name, type (without the `Var`) and default, and its `Var`."""

    name: str
    type: Any  # `int`, `str | None`, `tuple[str, ...]`, ...
    default: object  # `dataclasses.MISSING` where there is only a fallback
    var: Var

    @property
    def nullable(self) -> bool:
        """Whether the inventory may set it to null (a fallback fills an unset value instead)."""
        return NoneType in get_args(self.type) and self.var.fallback is None

    @property
    def is_list(self) -> bool:
        """A tuple on the `Host`, a list in the inventory."""
        return get_origin(self._value_type) is tuple

    @property
    def kind(self) -> Any:
        """The type of the value, or of each entry of a list: `str`, `int`, `float`, `bool` or an enum."""
        return get_args(self._value_type)[0] if self.is_list else self._value_type

    @property
    def _value_type(self) -> Any:
        if NoneType in get_args(self.type):
            return next(t for t in get_args(self.type) if t is not NoneType)
        return self.type


def declared(record: type) -> tuple[Variable, ...]:
    """The variables a record declares: its fields annotated with a `Var`, in order."""
    hints = get_type_hints(record, include_extras=True)
    found = []
    for field in fields(record):
        hint = hints[field.name]
        var = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Var)), None)
        if var is not None:
            found.append(Variable(name=field.name, type=hint.__origin__, default=field.default, var=var))
    return tuple(found)


HOST_VARIABLES = declared(Host)


@dataclass(frozen=True)
class PlugVariables:
    """A plug's own host variables: the inventory key they are written under (the plug's name), the record they
    come out as, and each variable."""

    plug: str
    record: type
    variables: tuple[Variable, ...]


def plug_variables() -> tuple[PlugVariables, ...]:
    """Each registered scheduler's own variables, in the registry's order (cached by the registry's rows, so a row
    added or taken out counts at once)."""
    return _plugged(tuple(plugs.SCHEDULERS.items()))


@cache
def _plugged(rows: tuple[tuple[str, plugs.Scheduled], ...]) -> tuple[PlugVariables, ...]:
    found = []
    for name, scheduled in rows:
        if scheduled.variables is not None:
            record = plugs.provided(scheduled.variables, "VARIABLES")
            assert isinstance(record, type)
            found.append(PlugVariables(name, record, declared(record)))
    return tuple(found)

# ---------------------------------------------------------------- the table in docs/operating.md

_WORDS = {str: "string", int: "integer", float: "number", bool: "true or false"}


def _bounds(var: Var) -> str:
    parts = [f"{op} {n}" for op, n in ((">=", var.ge), (">", var.gt), ("<=", var.le)) if n is not None]
    return " " + ", ".join(parts) if parts else ""


def _type_text(v: Variable) -> str:
    """`integer >= 0 or null`, `list of unit names`, `` `ssh` or `local` ``: what the inventory may write."""
    kind, check = v.kind, v.var.check
    if v.var.words:
        word = v.var.words
    elif isinstance(kind, type) and issubclass(kind, Enum):
        word = " or ".join(f"`{member.value}`" for member in kind)
    elif v.var.names is not None:
        word = " or ".join(f"`{name}`" for name in v.var.names())
    else:
        word = check.__name__.replace("_", " ") if check else _WORDS[kind]
    if v.var.one_or_more:
        word = f"{word}, or a non-empty list of them"
    elif v.is_list:
        word = f"list of {word}s"
    word += _bounds(v.var)
    return f"{word} or null" if v.nullable else word


def _default_text(v: Variable) -> str:
    value = v.default
    if v.var.shown:
        return v.var.shown
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(f"`{item}`" for item in value)
    return f"`{value}`" if isinstance(value, str) else str(value)


def _row(name: str, v: Variable) -> str:
    meaning = f"{v.var.help}; once written `{v.var.old}`, still read" if v.var.old else v.var.help
    return f"| `{name}` | {_type_text(v)} | {_default_text(v)} | {meaning} |"


def markdown_table() -> str:
    """The table of host variables in docs/operating.md, one row per variable, in declaration order; then each
    plug's, under its name (`slurm.node`)."""
    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [_row(v.name, v) for v in HOST_VARIABLES]
    rows += [_row(f"{plug.plug}.{v.name}", v) for plug in plug_variables() for v in plug.variables]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
