"""Targeting: turn host patterns, groups, `--limit` and `--exclude` into the hosts to work on.

A pattern is a comma-separated list (commas inside brackets do not split) of
ClusterShell node sets (`gpu-b[01-04],gpu-h01`, operators such as `!` included),
`@group`, `all`, or shell globs (`gpu-b*`). Node sets expand without group
lookups and within the inventory's size bound. A target's node set that names
hosts the inventory lacks is a `UsageError` naming them (`gpu-b[04-09]`), unless
`missing_ok` (`--missing-ok`: only the names it holds are kept); a `--limit` or
`--exclude` may name more than the inventory holds. Anything that matches no host
is a one-line `UsageError`, never a silent no-op.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from fleet.inventory import validate
from fleet.inventory.host import Host
from fleet.inventory.load import ALL, Inventory, unlisted_host
from fleet.inventory.nodesets import fold, node_order, node_set
from fleet.inventory.schema import suggest
from fleet.model.errors import UsageError


def _split(text: str) -> list[str]:
    """Split at commas outside brackets: `a[1,2],b` -> `a[1,2]`, `b`."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _group(inv: Inventory, name: str) -> set[str]:
    if name == ALL:
        found = set(inv.hosts)
    elif name not in inv.groups:
        raise UsageError(f"no group {name!r} in {inv.named}{suggest(name, inv.groups)}")
    else:
        found = set(inv.groups[name])
    if not found:
        raise UsageError(f"group {name!r} in {inv.named} has no hosts")
    return found


def _element(inv: Inventory, element: str) -> set[str]:
    if element.startswith("@"):
        return _group(inv, element[1:])
    if element == ALL:
        return set(inv.hosts)
    if _is_glob(element):
        return set(fnmatch.filter(inv.hosts, element))
    return {name for name in _nodes(element) if name in inv.hosts}


def _is_glob(element: str) -> bool:
    return any(c in element for c in "*?") and "[" not in element


def _nodes(element: str) -> list[str]:
    try:
        return list(node_set(element))
    except ValueError as e:
        raise UsageError(f"host pattern: {e}") from None


def unlisted(inv: Inventory, patterns: Sequence[str]) -> list[str]:
    """The names the patterns' node sets give that the inventory does not list, in node-set order (a group, `all`
    and a glob name only what it lists)."""
    missing = {name for pattern in patterns for element in _split(pattern)
               if not element.startswith("@") and element != ALL and not _is_glob(element)
               for name in _nodes(element) if name not in inv.hosts}
    return node_order(missing)


def _matching(inv: Inventory, text: str, flag: str) -> set[str]:
    elements = _split(text)
    if not elements:
        raise UsageError(f"empty {flag.strip() or 'host pattern'}: name hosts or node sets")
    found: set[str] = set()
    for element in elements:
        names = _element(inv, element)
        if not names:
            hint = f"; for the group, write '@{element}'" if element in inv.groups else ""
            raise UsageError(f"no host in {inv.named} matches {flag}{element!r}{hint}")
        found |= names
    return found


def select(
    inv: Inventory,
    *,
    patterns: Sequence[str] = (),
    groups: Sequence[str] = (),
    limit: str | None = None,
    exclude: str | None = None,
    missing_ok: bool = False,
) -> list[Host]:
    """The targeted hosts in node-set order: (patterns | groups) & limit - exclude.

    Patterns are node sets (`gpu-b[01-04],gpu-h01`), `@group`, `all`, or shell
    globs (`gpu-b*`). Anything that matches no host is a `UsageError`; so is a
    node set naming hosts the inventory lacks, unless `missing_ok`.
    """
    if not patterns and not groups:
        raise UsageError("no target: name hosts or use -g/--group")
    missing = [] if missing_ok else unlisted(inv, patterns)
    if missing:
        listed = len(set().union(*(_matching(inv, p, "") for p in patterns)))
        raise UsageError(f"{fold(missing)} not in {inv.named}: list {'it' if len(missing) == 1 else 'them'} there,"
                         f" name {'it' if len(missing) == 1 else 'them'} with -w, or pass --missing-ok to target"
                         f" only the {listed} it has")
    chosen: set[str] = set()
    for name in groups:
        chosen |= _group(inv, name)
    for pattern in patterns:
        chosen |= _matching(inv, pattern, "")
    if limit is not None:
        chosen &= _matching(inv, limit, "--limit ")
    if exclude is not None:
        chosen -= _matching(inv, exclude, "--exclude ")
    hosts = [host for name, host in inv.hosts.items() if name in chosen]
    if not hosts:
        raise UsageError(f"no host of {inv.named} left to target after --limit/--exclude")
    return hosts


def named(text: str, flag: str = "-w") -> list[str]:
    """The names a `-w` node set names, each a valid host name: `gpu-c[01-04],gpu-d01`."""
    names: list[str] = []
    for element in _split(text):
        try:
            names.extend(node_set(element))
        except ValueError as e:
            raise UsageError(f"{flag}: {e}") from None
    for name in names:
        try:
            validate.host_name(name)
        except ValueError as e:
            raise UsageError(f"{flag}: {e}") from None
    if not names:
        raise UsageError(f"empty {flag}: name hosts or node sets")
    return names


def select_with(
    inv: Inventory | None,
    extra: Sequence[str],
    *,
    patterns: Sequence[str] = (),
    groups: Sequence[str] = (),
    limit: str | None = None,
    exclude: str | None = None,
    origin: str = "-w",
    missing_ok: bool = False,
) -> list[Host]:
    """`select`, with hosts named outright (`-w`, a Slurm partition) added to the targets: the inventory's entry
    for a name it lists, else a host with the inventory's `defaults` (`unlisted_host`)."""
    base = inv or Inventory(path=Path(origin), hosts={}, groups={})
    unlisted = {name: unlisted_host(name, inv) for name in extra if name not in base.hosts}
    hosts = {**base.hosts, **unlisted}
    universe = replace(base, hosts={name: hosts[name] for name in node_order(hosts)})
    chosen = [*patterns, *([fold(list(extra))] if extra else [])]
    return select(universe, patterns=chosen, groups=groups, limit=limit, exclude=exclude, missing_ok=missing_ok)
