"""What an inventory file may say, and the one-line error when it says something else.

The models a file is validated with are made from the declarations (`fleet.inventory.variables`): every `Host`
variable (checked as its `Var` says: a list as a tuple, an enum as its member, `connection` a name
`fleet.model.plugs.TRANSPORTS` knows), each registered scheduler's own under its name (a mapping: `slurm: {node:
...}`), and a scheduler variable's old spelling (`slurm_node`). They are made once for each state of the scheduler
registry (`file_models`). A problem is an `InventoryError` naming the file and the key, as `site.yaml:
groups.blackwell.vars.gpus: expected a whole number, got 'eight'`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING
from enum import Enum
from functools import cache
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import ErrorDetails

from fleet.inventory import gpu_settings, validate
from fleet.inventory.messages import one_line
from fleet.inventory.variables import HOST_VARIABLES, PlugVariables, Variable, plug_variables
from fleet.model import plugs
from fleet.model.errors import InventoryError
from fleet.model.gpu_profile import GpuProfile

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")

HostName = Annotated[str, AfterValidator(validate.host_name)]
GroupName = Annotated[str, AfterValidator(validate.group_name)]
_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=True)


def _value_type(v: Variable) -> Any:
    """What a value, or each entry of a list, is checked against; an enum comes out as its member."""
    kind, var = v.kind, v.var
    if kind is GpuProfile:
        return gpu_settings.WRITTEN
    if isinstance(kind, type) and issubclass(kind, Enum):
        return Annotated[Literal.__getitem__(tuple(m.value for m in kind)), AfterValidator(kind)]
    no_inf_nan = False if kind is float else None
    bounds = Field(ge=var.ge, gt=var.gt, le=var.le, allow_inf_nan=no_inf_nan)
    return Annotated[kind, bounds, AfterValidator(var.check)] if var.check else Annotated[kind, bounds]


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _list_type(item: Any, one_or_more: bool) -> Any:
    """A list of `item`s that comes out as a tuple; `one_or_more`: one string is a list of one, none is refused."""
    if one_or_more:
        return Annotated[list[item], BeforeValidator(_one_or_many), Field(min_length=1), AfterValidator(tuple)]
    return Annotated[list[item], AfterValidator(tuple)]


def _level_type(v: Variable) -> Any:
    """What one level (defaults, a group's vars, a host's vars) may write for the variable."""
    value = _list_type(_value_type(v), v.var.one_or_more) if v.is_list else _value_type(v)
    return value | None if v.nullable else value


def _fields(variables: Iterable[Variable]) -> dict[str, Any]:
    """Each variable's type and default; the default is never merged, only what a level wrote."""
    return {v.name: (_level_type(v), None if v.default is MISSING else v.default) for v in variables}


class HostVars(BaseModel):
    """The variables one level (defaults, a group, a host) sets; unset ones are not merged. Its fields are made
    from the declarations (`host_vars_model`): every `Host` variable, each plug's own under the plug's name (a
    mapping), and a plug variable's old spelling."""

    model_config = _CONFIG


class _PlugSection(BaseModel):
    """A plug's variables as one level writes them, under the plug's name (`slurm: {node: gpu01}`)."""

    model_config = _CONFIG


class GroupSpec(BaseModel):
    model_config = _CONFIG

    hosts: list[str] = []
    children: list[GroupName] = []
    vars: HostVars = HostVars()


def _known_scheduler(name: str) -> str:
    """A `scheduler:` the registry knows (`fleet.model.plugs.SCHEDULERS`: slurm)."""
    return plugs.known(plugs.SCHEDULERS, "scheduler", name)


class InventoryFile(BaseModel):
    model_config = _CONFIG

    scheduler: Annotated[str, AfterValidator(_known_scheduler)] | None = None
    defaults: HostVars | None = None
    groups: dict[GroupName, GroupSpec | None] | None = None
    hosts: dict[HostName, HostVars | None] | None = None


VARIABLES = tuple(v.name for v in HOST_VARIABLES)  # the built-in host variables' names, in declaration order


class _Models(NamedTuple):
    """The file's models for the registry as it stands, and the keys each context knows (for "unknown key")."""

    file: type[InventoryFile]
    host_vars: type[HostVars]
    plugs: Mapping[str, PlugVariables]  # by the key a level writes them under: the plug's name
    old: Mapping[str, tuple[str, str]]  # a plug variable's old spelling -> (plug, variable)
    keys: Mapping[str, tuple[str, ...]]  # context (`top`, `group`, `vars`, a plug's name) -> its keys


def file_models() -> _Models:
    """The models for the registry as it stands (made once for each state of it)."""
    return _models_for(plug_variables())


@cache
def _models_for(plugged: tuple[PlugVariables, ...]) -> _Models:
    by_plug = {plug.plug: plug for plug in plugged}
    sections = {name: (create_model(f"_{name}", __base__=_PlugSection, **_fields(plug.variables)), None)
                for name, plug in by_plug.items()}
    old = {v.var.old: (plug.plug, v.name) for plug in plugged for v in plug.variables if v.var.old}
    olds = {v.var.old: (_level_type(v), None) for plug in plugged for v in plug.variables if v.var.old}
    written: dict[str, Any] = {**_fields(HOST_VARIABLES), **sections, **olds}
    host_vars = create_model("_Variables", __base__=HostVars, **written)
    group = create_model("_Group", __base__=GroupSpec, vars=(host_vars, host_vars()))
    # Types made at run time: mypy reads the static bases (InventoryFile, GroupSpec, HostVars) for them.
    parts: dict[str, Any] = {"defaults": (host_vars | None, None),
                             "groups": (dict[GroupName, group | None] | None, None),  # type: ignore[valid-type]
                             "hosts": (dict[HostName, host_vars | None] | None, None)}  # type: ignore[valid-type]
    file = create_model("_File", __base__=InventoryFile, **parts)
    keys = {"top": tuple(InventoryFile.model_fields), "group": tuple(GroupSpec.model_fields),
            "vars": (*VARIABLES, *by_plug),
            **{name: tuple(v.name for v in plug.variables) for name, plug in by_plug.items()}}
    return _Models(file, host_vars, by_plug, old, keys)


def host_vars_model() -> type[HostVars]:
    """The model of what one level may write, for the registry as it stands."""
    return file_models().host_vars


# ---------------------------------------------------------------- messages


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_path(*parts: object) -> str:
    """Render a key path: `groups.rack-a.children[1]`, `hosts."gpu.example.com".port`."""
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
            continue
        text = str(part)
        text = text if _PLAIN_KEY.fullmatch(text) else json.dumps(text)
        out += f".{text}" if out else text
    return out


def suggest(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest of `choices`, else nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_TYPE_MESSAGES = {
    "int_type": "expected a whole number",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "finite_number": "expected a finite number",
    "too_short": "expected at least one entry",
}


def _context(loc: tuple[Any, ...], keys: Mapping[str, tuple[str, ...]]) -> str:
    if len(loc) > 2 and (loc[-2] in gpu_settings.KEYS_OF or loc[-2] in keys):
        return str(loc[-2])
    if len(loc) == 1:
        return "top"
    return "group" if loc[0] == "groups" and len(loc) == 3 else "vars"


def _message(error: ErrorDetails, keys: Mapping[str, tuple[str, ...]]) -> str:
    kind, loc, ctx = error["type"], error["loc"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        context = _context(loc, keys)
        what = "key" if context in ("top", "group") or context in gpu_settings.KEYS_OF else "variable"
        known = keys.get(context) or gpu_settings.KEYS_OF[context]
        return f"unknown {what}{suggest(str(loc[-1]), known)} (known: {', '.join(known)})"
    if kind == "value_error":
        return one_line(str(ctx.get("error", error["msg"])))
    if kind in _TYPE_MESSAGES:
        return f"{_TYPE_MESSAGES[kind]}, got {_short(error['input'])}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_short(error['input'])}"
    text = one_line(error["msg"]).replace("Input should be ", "must be ")
    return f"{text}, got {_short(error['input'])}"


def _errorkey_path(loc: tuple[Any, ...]) -> str:
    """Pydantic's `loc` as a key path; a bad mapping key (`..., 1, '[key]'`) stays a key."""
    parts: list[object] = []
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        is_key = i + 1 < len(loc) and loc[i + 1] == "[key]"
        parts.append(str(part) if is_key else part)
    return key_path(*parts)


def validated_file(data: object, label: str) -> InventoryFile:
    if data is None:
        raise InventoryError(label, "", "the inventory is empty")
    if not isinstance(data, dict):
        expected = "expected a mapping of defaults, groups and hosts"
        raise InventoryError(label, "", f"{expected}, got {_short(data)}")
    models = file_models()
    try:
        return models.file.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise InventoryError(label, _errorkey_path(first["loc"]), _message(first, models.keys)) from None
