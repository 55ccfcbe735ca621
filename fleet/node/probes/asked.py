"""What the table of GPU facts (`fleet.model.gpu_facts`) asks of nvidia-smi's output, built once per table
(`lookup`): the `--query-gpu` fields and how each cell reads, the `-q -d` sections, and the tree of `-q` key paths
(`Key`) the -q reader (`fleet.node.probes.q_sections`) walks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from fleet.model import gpu_facts
from fleet.model.gpu_facts import Field, Path

__all__ = ["Column", "Key", "Lookup", "lookup"]


@dataclass(frozen=True, kw_only=True)
class Column:
    """How one --query-gpu cell after the bus id reads: the fact's name and reader; the check a note in it leaves
    unread (a strict fact's) and the field that check names."""

    name: str
    parse: Callable[[str], Any]
    strict_check: str | None
    query: str


class Key(NamedTuple):
    """A -q key path the table asks about (every path a fact is read at, and the sections above them), as a tree:
    the keys under it by name in lower case (none: nothing under it is read)."""

    path: Path  # in lower case
    read: bool  # a fact is read here, or a note here leaves one unread (a strict fact's path or a section above it)
    under: dict[str, Key]


@dataclass(frozen=True, eq=False, kw_only=True)
class Lookup:
    """What the table asks of nvidia-smi's output, built once per table (compared, and hashed, by identity: the
    probes made for it are kept by it, `fleet.node.probes.health`)."""

    asked: tuple[Field[Any], ...]  # the --query-gpu fields after pci.bus_id, in order
    query: str  # the --query-gpu field list: the bus id, then theirs
    columns: tuple[Column, ...]  # how each of their cells reads
    names: tuple[str, ...]  # the columns' names, and their readers, apart: a row's values read in one comprehension
    readers: tuple[Callable[[str], Any], ...]  # each `Reader.fast`: a builtin where there is one
    displays: tuple[str, ...]  # the `-q -d` sections the other facts are read from
    displayed: tuple[Field[Any], ...]  # the facts read from those sections
    facts: dict[str, Field[Any]]  # by name
    paths: dict[str, tuple[Path, ...]]  # each fact's -q key paths, lower case, by its name
    at: dict[Path, str]  # every one of them: the name of the fact read there
    noted: dict[Path, tuple[str, ...]]  # a strict fact's path, or a section's above it: the checks a note there
    # leaves unread
    top: Key  # the tree of the paths, from the top of a GPU's section


def _lookup(table: tuple[Field[Any], ...]) -> Lookup:
    paths = {fact.name: tuple(tuple(part.lower() for part in printed) for printed in fact.q) for fact in table}
    facts = {fact.name: fact for fact in table}
    noted: dict[Path, set[str]] = {}
    for name, lowered in paths.items():
        for path in lowered if facts[name].strict else ():
            for end in range(1, len(path) + 1):
                noted.setdefault(path[:end], set()).add(facts[name].check or "")
    displays = tuple(dict.fromkeys(f.display for f in table if f.display is not None))
    asked = tuple(f for f in table if f.display is None)
    columns = tuple(Column(name=f.name, parse=f.read.parse, strict_check=f.check if f.strict else None, query=f.query)
                    for f in asked)
    at = {path: name for name, lowered in paths.items() for path in lowered}
    query = ",".join(("pci.bus_id", *(f.query for f in asked)))
    return Lookup(asked=asked, query=query, columns=columns, names=tuple(c.name for c in columns),
                  readers=tuple(f.read.fast for f in asked), displays=displays,
                  displayed=tuple(f for f in table if f.display is not None), facts=facts, paths=paths, at=at,
                  noted={path: tuple(sorted(checks)) for path, checks in noted.items()},
                  top=_tree((), at.keys() | noted.keys()))


def _tree(path: Path, read: set[Path]) -> Key:
    """The key at `path` and those under it, of `read` (every path read, and every section above one)."""
    below = {p[len(path)] for p in read if len(p) > len(path) and p[:len(path)] == path}
    return Key(path, path in read, {name: _tree((*path, name), read) for name in sorted(below)})


lookup = gpu_facts.derived(_lookup)
