"""The inventory: read once, validated, resolved into frozen `Host` objects.

A YAML (`.yaml`/`.yml`) or TOML (`.toml`) file has three optional top-level
keys: `defaults` (variables for every host), `groups` (each with `hosts`:
names or ClusterShell node sets such as `gpu-b[01-16]`, `children`: other
groups, and `vars`) and `hosts` (per-host variables).

Variables are merged at load time: defaults < group vars < host vars. Group
vars are applied shallow first (a parent before its children); groups at the
same depth are applied by name, as Ansible does. A value replaces what came
before it, lists included. Relative `identity_file`/`known_hosts` paths are
taken relative to the inventory's folder, so a cron job works from any cwd.

After merging, a host whose `services` names the unit of a protected process
(built in, or in its own `protected`) is refused, naming the key that set
`services` for it: the `Inventory` keeps, per host and variable, the key that set
the value (`Inventory.source`), for that and for `fleet.inventory.files`.

Every problem is an `InventoryError` of one line that names the file and the
key, such as `site.yaml: groups.blackwell.vars.gpus: expected a whole number,
got 'eight'`. The file is read by `fleet.inventory.datafile` and node sets
expand with `fleet.inventory.nodesets`; targeting (patterns, groups, `--limit`,
`--exclude`) is `fleet.inventory.targeting.select`.

What a level may write, and the one-line error when it writes something else, is
`fleet.inventory.schema`, made from the declaration of every variable (the fields of
`fleet.inventory.host.Host`, and of each scheduler's own, written under its name and
merged key by key: `slurm: {node: ...}`, `Host.variables_of`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from fleet.inventory import gpu_settings, validate
from fleet.inventory.datafile import read_data
from fleet.inventory.host import BUILTIN_PROTECTED, DEFAULT_LOCK_FILE, Connection, Host
from fleet.inventory.nodesets import node_order, node_set
from fleet.inventory.schema import GroupSpec, HostVars, InventoryFile, file_models, key_path, suggest, validated_file
from fleet.inventory.variables import HOST_VARIABLES, Variable, plug_variables
from fleet.model.errors import InventoryError, UsageError
from fleet.model.gpu_profile import GpuProfile

ALL = "all"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """Every host with its variables resolved, every group's resolved members, and where each value came from."""

    path: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]]
    sources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> variable -> key that set it
    scheduler: str | None = None  # `scheduler: slurm` (`fleet.engine.schedulers`): every reset goes through it
    defaults: Mapping[str, Any] = field(default_factory=dict)  # what `defaults` set: for hosts it does not list
    # The file as messages name it, where that is not its path alone: `site.yaml (from $FLEET_INVENTORY)`.
    label: str | None = None
    notes: tuple[str, ...] = ()  # one line each: what the file writes in an old spelling, still read

    @property
    def named(self) -> str:
        """The file as every message about it names it: its label, else its path."""
        return self.label or str(self.path)

    def source(self, host: str, variable: str) -> str:
        """The key that set the host's variable (`groups.g.vars.services`); `defaults.<variable>` where none did."""
        return self.sources.get(host, {}).get(variable) or key_path("defaults", variable)

    def is_default(self, host: str, variable: str) -> bool:
        """Whether no level set the host's variable: it has its built-in default (or its fallback)."""
        return variable not in self.sources.get(host, {})


# ---------------------------------------------------------------- groups


def _check_children(groups: Mapping[str, GroupSpec], label: str) -> None:
    for name, spec in groups.items():
        for i, child in enumerate(spec.children):
            if child not in groups:
                key = key_path("groups", name, "children", i)
                raise InventoryError(label, key, f"unknown group {child!r}{suggest(child, groups)}")


def _check_cycles(groups: Mapping[str, GroupSpec], label: str) -> None:
    state: dict[str, bool] = {}  # False: on the current path, True: done

    def visit(trail: list[str]) -> None:
        group = trail[-1]
        state[group] = False
        for child in groups[group].children:
            if state.get(child) is False:
                cycle = [*trail[trail.index(child) :], child]
                raise InventoryError(label, key_path("groups", group, "children"), "cycle: " + " -> ".join(cycle))
            if child not in state:
                visit([*trail, child])
        state[group] = True

    for name in groups:
        if name not in state:
            visit([name])


def _expand(pattern: str, key: str, label: str) -> list[str]:
    if "@" in pattern:
        raise InventoryError(label, key, f"{pattern!r}: include groups with children:, not '@name'")
    try:
        names = list(node_set(pattern))
    except ValueError as e:
        raise InventoryError(label, key, str(e)) from None
    if not names:
        raise InventoryError(label, key, f"node set {pattern!r} names no host")
    for name in names:
        _check_host_name(name, key, label)
    return names


def _check_host_name(name: str, key: str, label: str) -> None:
    try:
        validate.host_name(name)
    except ValueError as e:
        raise InventoryError(label, key, str(e)) from None
    if name == ALL:
        raise InventoryError(label, key, f"{ALL!r} is reserved: it targets every host")


def _direct_members(groups: Mapping[str, GroupSpec], label: str) -> dict[str, set[str]]:
    members: dict[str, set[str]] = {}
    for name, spec in groups.items():
        members[name] = set()
        for i, pattern in enumerate(spec.hosts):
            members[name].update(_expand(pattern, key_path("groups", name, "hosts", i), label))
    return members


def _depths(groups: Mapping[str, GroupSpec]) -> dict[str, int]:
    """1 for a group no group includes, else one more than its deepest parent."""
    parents: dict[str, list[str]] = {name: [] for name in groups}
    for name, spec in groups.items():
        for child in spec.children:
            parents[child].append(name)
    depth: dict[str, int] = {}

    def of(group: str) -> int:
        if group not in depth:
            depth[group] = 1 + max((of(p) for p in parents[group]), default=0)
        return depth[group]

    return {name: of(name) for name in groups}


def _resolved_members(groups: Mapping[str, GroupSpec], direct: Mapping[str, set[str]]) -> dict[str, set[str]]:
    resolved: dict[str, set[str]] = {}

    def of(group: str) -> set[str]:
        if group not in resolved:
            resolved[group] = set(direct[group]).union(*(of(c) for c in groups[group].children))
        return resolved[group]

    return {name: of(name) for name in groups}


# ---------------------------------------------------------------- hosts


def _build_host(name: str, values: dict[str, Any], groups: tuple[str, ...], base: Path) -> Host:
    """The merged values as a `Host`: fallbacks fill what no level set; local paths follow the inventory; each
    plug's values (`slurm.node`) come out as its record, for each plug some level wrote any for."""
    _resolved(name, values, "", HOST_VARIABLES, base)
    plugged = []
    for plug in plug_variables():
        prefix = f"{plug.plug}."
        _resolved(name, values, prefix, plug.variables, base)
        mine = {v.name: values.pop(prefix + v.name) for v in plug.variables if prefix + v.name in values}
        if mine:
            plugged.append((plug.plug, plug.record(**mine)))
    return Host(name=name, groups=groups, plug_variables=tuple(plugged), **values)


def _resolved(name: str, values: dict[str, Any], prefix: str, variables: Iterable[Variable], base: Path) -> None:
    for v in variables:
        key = prefix + v.name
        if v.var.fallback is not None and key not in values:
            values[key] = v.var.fallback(name)
        if v.var.check is validate.path and values.get(key):
            values[key] = str(base / values[key])


def _check_lock_file(host: Host, sources: Mapping[str, str], label: str) -> None:
    """The lock is in no tree another user may create folders in (a simulated node's lock lies in its own root)."""
    tree = validate.shared_tree(host.lock_file)
    if tree is not None and not host.simulated:
        where = sources.get("lock_file", "lock_file")
        raise InventoryError(label, where, f"{host.lock_file} is under {tree}, where any user may create its folder "
                             "first and block every reset of the node: put it in a folder only root may write to "
                             f"(the default {DEFAULT_LOCK_FILE})")


def _check_services(host: Host, sources: Mapping[str, str], label: str) -> None:
    """No unit in `services` runs a protected process: drain would stop (and SIGKILL) what kill always keeps."""
    for i, unit in enumerate(host.services):
        stem = validate.unit_stem(unit)
        if stem in BUILTIN_PROTECTED:
            whose = "a built-in protected process"
        elif stem in host.protected:
            whose = f"which {host.name} protects ({sources['protected']})"
        else:
            continue
        message = f"{unit} is the unit of {stem}, {whose}: fleet never kills it, so drain must not stop it"
        raise InventoryError(label, f"{sources['services']}[{i}]", message)


@dataclass(frozen=True)
class _Level:
    """What one level (defaults, a group's vars, a host's vars) wrote, and the key of each variable it wrote; a
    plug's under `<plug>.<variable>` (`slurm.node`), whether written under the plug's name or in its old
    spelling (`slurm_node`, whose keys `old` keeps)."""

    values: dict[str, Any]
    keys: dict[str, str]
    old: dict[str, str] = field(default_factory=dict)  # old spelling -> the key it was written at

    @classmethod
    def of(cls, hv: HostVars | None, where: tuple[str, ...], label: str) -> _Level:
        level, models = cls({}, {}), file_models()
        written = sorted(hv.model_fields_set) if hv is not None else []
        for name in (n for n in written if n not in models.old):
            value = getattr(hv, name)
            if name in models.plugs:
                for variable in sorted(value.model_fields_set):
                    level.put(f"{name}.{variable}", getattr(value, variable), key_path(*where, name, variable))
            else:
                level.put(name, value, key_path(*where, name))
        for spelling in (n for n in written if n in models.old):
            plug, variable = models.old[spelling]
            dotted, key = f"{plug}.{variable}", key_path(*where, spelling)
            if dotted in level.values:
                raise InventoryError(label, key, f"also written as {level.keys[dotted]}: keep that one")
            level.put(dotted, getattr(hv, spelling), key)
            level.old[spelling] = key
        return level

    def put(self, name: str, value: Any, key: str) -> None:
        self.values[name], self.keys[name] = value, key


def _merge(levels: Iterable[_Level]) -> tuple[dict[str, Any], dict[str, str]]:
    """The merged values, later levels winning, and the key each value came from."""
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for level in levels:
        values.update(level.values)
        keys.update(level.keys)
    return values, keys


def _resolve(spec: InventoryFile, path: Path, label: str) -> Inventory:
    groups = {name: group or GroupSpec() for name, group in (spec.groups or {}).items()}
    if ALL in groups:
        raise InventoryError(label, key_path("groups", ALL), f"{ALL!r} is reserved for every host; use defaults")
    _check_children(groups, label)
    _check_cycles(groups, label)
    per_host = {name: _Level.of(hv, ("hosts", name), label) for name, hv in (spec.hosts or {}).items()}
    for name in per_host:
        _check_host_name(name, key_path("hosts", name), label)
    members = _resolved_members(groups, _direct_members(groups, label))
    order = node_order(set(per_host).union(*members.values()))
    depth = _depths(groups)
    defaults = _Level.of(spec.defaults, ("defaults",), label)
    group_vars = {name: _Level.of(group.vars, ("groups", name, "vars"), label) for name, group in groups.items()}
    hosts: dict[str, Host] = {}
    sources: dict[str, dict[str, str]] = {}
    for name in order:
        mine = sorted((g for g in groups if name in members[g]), key=lambda g: (depth[g], g))
        own = [per_host[name]] if name in per_host else []
        values, sources[name] = _merge([defaults, *(group_vars[g] for g in mine), *own])
        hosts[name] = _build_host(name, values, tuple(sorted(mine)), path.parent)
        _check_services(hosts[name], sources[name], label)
        _check_lock_file(hosts[name], sources[name], label)
    resolved = {g: tuple(n for n in order if n in members[g]) for g in sorted(groups)}
    notes = _old_spellings([defaults, *group_vars.values(), *per_host.values()], label)
    return Inventory(path=path, hosts=hosts, groups=resolved, sources=sources, scheduler=spec.scheduler,
                     defaults=defaults.values, label=label if label != str(path) else None, notes=notes)


def _old_spellings(levels: Iterable[_Level], label: str) -> tuple[str, ...]:
    """One line for each old spelling the file uses, naming where (the first key and how many more)."""
    where: dict[str, list[str]] = {}
    for level in levels:
        for spelling, key in level.old.items():
            where.setdefault(spelling, []).append(key)
    models, notes = file_models(), []
    for spelling, keys in where.items():
        plug, variable = models.old[spelling]
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        notes.append(f"{label}: {keys[0]}{more}: `{spelling}` is now written `{plug}: {{{variable}: ...}}`"
                     f" (`{plug}.{variable}`); the old spelling is still read")
    return tuple(notes)


def unlisted_host(name: str, inventory: Inventory | None) -> Host:
    """A host no inventory lists (`-w`, `--partition`): what the inventory's `defaults` set, else the built-in
    defaults; the variables that fall back to the host's name (address; a scheduler's node name) are its own."""
    if inventory is None:
        return _build_host(name, {}, (), Path.cwd())
    return _build_host(name, dict(inventory.defaults), (), inventory.path.parent)


def load_inventory(path: str | Path, label: str | None = None) -> Inventory:
    """Read, validate and resolve an inventory file; raise `InventoryError` on any problem.

    `label`: the file as every message about it names it (`inventory_source`); its path when None.
    """
    label = label or str(path)
    file = Path(path)
    return _resolve(validated_file(read_data(file, label), label), file, label)


def inventory_path(cli_value: str | None) -> Path:
    """The inventory named by `-i/--inventory`, else by `$FLEET_INVENTORY`."""
    return inventory_source(cli_value)[0]


def inventory_source(cli_value: str | None) -> tuple[Path, str]:
    """The inventory named by `-i/--inventory`, else by `$FLEET_INVENTORY`, and the file as messages name it: its
    path, followed by `(from $FLEET_INVENTORY)` when the variable named it (run from another folder, a relative
    path there is no file of the command line's)."""
    if cli_value is not None and not cli_value.strip():
        raise UsageError("-i/--inventory: empty path")
    if cli_value:
        path = Path(cli_value).expanduser()
        return path, str(path)
    value = os.environ.get("FLEET_INVENTORY", "").strip()
    if not value:
        raise UsageError("no inventory: use -i/--inventory PATH or set $FLEET_INVENTORY")
    path = Path(value).expanduser()
    return path, f"{path} (from $FLEET_INVENTORY)"


def host_vars(host: Host) -> dict[str, Any]:
    """The resolved variables of one host, as JSON-able values (its name is the caller's key); a plug's under its
    name (`"slurm": {"node": "gpu01"}`)."""
    out = {var.name: _as_json(getattr(host, var.name)) for var in fields(host)
           if var.name not in ("name", "plug_variables")}
    for plug, record in host.plug_variables:
        assert is_dataclass(record) and not isinstance(record, type)
        out[plug] = {var.name: _as_json(getattr(record, var.name)) for var in fields(record)}
    return out


def host_from_vars(name: str, variables: Mapping[str, Any]) -> Host:
    """The host `host_vars` wrote (`fleet inventory --json`; `--via srun`'s hosts, sent to their nodes)."""
    values = _as_tuples(variables)
    if "gpu_settings" in values:
        values["gpu_settings"] = gpu_settings.from_written(values["gpu_settings"])
    plugged = tuple((plug.plug, plug.record(**_as_tuples(values.pop(plug.plug))))
                    for plug in plug_variables() if plug.plug in values)
    return Host(name=name, plug_variables=plugged, **values)


def _as_json(value: object) -> object:
    """A variable's value as JSON holds it: a list for a tuple, the written mapping for a GPU profile."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, GpuProfile):
        return gpu_settings.as_written(value)
    return str(value) if isinstance(value, Connection) else value


def _as_tuples(written: Mapping[str, Any]) -> dict[str, Any]:
    """What `host_vars` wrote, each list a tuple again."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in written.items()}
