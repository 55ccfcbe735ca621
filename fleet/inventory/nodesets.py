"""ClusterShell node sets (`gpu-b[01-16]`), expanded without group lookups and within a size bound.

The inventory expands its `hosts:` entries with `node_set` and orders hosts
with `node_order`; targeting (`fleet.inventory.targeting`) matches host patterns with
`node_set`. A pattern that could name more than `MAX_NODES_PER_PATTERN` hosts
is refused before ClusterShell expands it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from fleet.inventory.messages import one_line

MAX_NODES_PER_PATTERN = 100_000
_BRACKETS = re.compile(r"\[([^\]]*)\]")
_SPAN = re.compile(r"(\d+)-(\d+)")


def _upper_bound(pattern: str) -> int:
    """How many names a pattern can name at most, counted without expanding it."""
    total = 1
    for inside in _BRACKETS.findall(pattern):
        spans = [int(b) - int(a) + 1 for a, b in _SPAN.findall(inside)]
        total *= sum(spans) + inside.count(",") + 1
    return total


def node_set(pattern: str) -> NodeSet:
    """ClusterShell's expansion, without group lookups and without runaway ranges."""
    if _upper_bound(pattern) > MAX_NODES_PER_PATTERN:
        raise ValueError(f"node set {pattern!r} names more than {MAX_NODES_PER_PATTERN} hosts")
    try:
        return NodeSet(pattern, resolver=RESOLVER_NOGROUP)
    except NodeSetException as e:
        raise ValueError(f"bad node set {pattern!r}: {one_line(str(e))}") from None


def node_order(names: Iterable[str]) -> list[str]:
    """The names in node-set order: `n2` before `n10`."""
    return list(NodeSet.fromlist(sorted(names), resolver=RESOLVER_NOGROUP))


def fold(names: Iterable[str]) -> str:
    """The one fold of host names into a node set, for every line that names hosts: gpu-b01 .. gpu-b15 ->
    gpu-b[01-15] (no group lookups). The same names are folded once: the human summary and report.html fold
    each outcome group of a run (ClusterShell parses every name: about 30 us a host at 10,000)."""
    return _folded(tuple(names))


@lru_cache(maxsize=64)
def _folded(names: tuple[str, ...]) -> str:
    return str(NodeSet.fromlist(list(names), resolver=RESOLVER_NOGROUP))
