"""What Slurm says about nodes and jobs: the text of `scontrol show node` and `squeue`, parsed. Pure.

`scontrol show node` prints one record per node: `Key=Value` pairs separated by
spaces, over several lines; a few values are free text that runs to the end of
their line (`Reason=`, `OS=`, `Comment=`, `Extra=`). The reason ends with who set
it and when: `Reason=bad DIMM [root@2026-12-03T06:59:22]`. A node's state is a
base state and flags joined by `+` (`IDLE+DRAIN`, `MIXED+DRAIN+COMPLETING`,
`DOWN*`: the `*` is "not responding").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

# Values that run to the end of their line in `scontrol show node`.
FREE_TEXT_KEYS = ("Reason", "OS", "Comment", "Extra")
# Base states in which a node may run jobs; a node in one of them without an out-of-service flag is in service.
IN_SERVICE = frozenset({"IDLE", "ALLOCATED", "MIXED"})
# Flags that take a node out of service, each set by someone on purpose (an admin, a maintenance reservation, a
# reboot or power action), whose reason is theirs: DRAIN, FAIL (FAILING while a job still runs), MAINTENANCE, a
# reboot asked or under way, a power state.
OUT_OF_SERVICE = frozenset({"DRAIN", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN",
                            "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP"})
# Base states with a job on the node.
BUSY = frozenset({"ALLOCATED", "MIXED"})
# What squeue is asked for: every job state in which a job holds its nodes.
HOLDING_JOB_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING")
# One gpu entry of Gres=: gpu[:type]:count[(S:sockets)], entries separated by commas outside parentheses.
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
_STAMP = re.compile(r"^(?P<text>.*?)\s*\[(?P<who>[^\]@]*)@(?P<when>[^\]]*)\]$")


class SlurmParseError(ValueError):
    """Slurm printed something this parser does not understand: never read as "nothing there"."""


@dataclass(frozen=True, kw_only=True)
class SlurmNode:
    """One node as `scontrol show node` showed it."""

    name: str
    state: str  # as Slurm prints it: IDLE+DRAIN
    reason: str | None = None  # the text, without "[user@time]"
    reason_by: str | None = None  # who set the reason
    gpus: int = 0  # GPUs Slurm gives out on it (`gres/gpu` in CfgTRES, else the gpu entries of Gres=)

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0].rstrip("*")

    @property
    def flags(self) -> frozenset[str]:
        flags = set(self.state.split("+")[1:])
        if self.state.split("+", 1)[0].endswith("*"):
            flags.add("NOT_RESPONDING")
        return frozenset(flags)

    @property
    def draining_or_drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def in_service(self) -> bool:
        """Slurm may place a job here: a base state that runs jobs, and no flag that takes it out of service."""
        return self.base in IN_SERVICE and not self.flags & OUT_OF_SERVICE

    @property
    def serves_unreserved(self) -> bool:
        """Slurm would place jobs here once no reservation holds it: in service but for the MAINTENANCE flag a
        maintenance reservation sets."""
        return self.base in IN_SERVICE and not self.flags & (OUT_OF_SERVICE - {"MAINTENANCE"})

    @property
    def busy(self) -> bool:
        """A job still runs or completes here (DRAINING, not DRAINED)."""
        return self.base in BUSY or "COMPLETING" in self.flags


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """`scontrol show node [NAMES]` -> node name -> SlurmNode. A record without NodeName or State is an error."""
    nodes: dict[str, SlurmNode] = {}
    for record in _records(text):
        fields = _fields(record)
        name, state = fields.get("NodeName"), fields.get("State")
        if not name or not state:
            raise SlurmParseError(f"scontrol printed a node record without NodeName or State: {record[0][:80]!r}")
        reason, by = split_reason(fields.get("Reason"))
        nodes[name] = SlurmNode(name=name, state=state, reason=reason, reason_by=by,
                                gpus=gpu_count(fields.get("CfgTRES"), fields.get("Gres")))
    return nodes


def _records(text: str) -> list[list[str]]:
    records: list[list[str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("NodeName="):
            records.append([stripped])
        elif stripped and records:
            records[-1].append(stripped)
    return records


def _fields(lines: Sequence[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        key = line.split("=", 1)[0]
        if key in FREE_TEXT_KEYS:
            fields[key] = line.split("=", 1)[1] if "=" in line else ""
            continue
        for token in line.split():
            if "=" in token:
                k, v = token.split("=", 1)
                fields.setdefault(k, v)
    return fields


def gpu_count(tres: str | None, gres: str | None) -> int:
    """The node's GPUs: `gres/gpu=8` in `CfgTRES=cpu=64,mem=1T,gres/gpu=8` (with AccountingStorageTRES), else
    the sum of the gpu entries of `Gres=gpu:8`, `Gres=gpu:h100:4(S:0-1),gpu:a100:4,nic:1`; 0 for `(null)`."""
    for item in (tres or "").split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return sum(int(m.group(1)) for m in _GRES_GPU.finditer(gres or ""))


def split_reason(raw: str | None) -> tuple[str | None, str | None]:
    """`bad DIMM [root@2026-12-03T06:59:22]` -> ("bad DIMM", "root"); no reason (or "none") -> (None, None)."""
    if raw is None or raw.strip() in ("", "none", "(null)"):
        return None, None
    match = _STAMP.match(raw.strip())
    if match is None:
        return raw.strip(), None
    return match["text"], match["who"] or None


def parse_jobs(text: str, nodes: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """`squeue -h -o '%i %N'` lines -> node -> the ids of the jobs on it, for the nodes asked about (each one
    present, maybe with no job). A node list is Slurm's hostlist syntax (`sim[1-3]`)."""
    wanted = list(nodes)
    jobs: dict[str, list[str]] = {name: [] for name in wanted}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SlurmParseError(f"squeue printed {line[:80]!r}, not 'JOBID NODELIST'")
        job, nodelist = parts
        try:
            on = NodeSet(nodelist)
        except NodeSetParseError as exc:
            raise SlurmParseError(f"squeue printed a node list fleet cannot read: {nodelist[:80]!r}") from exc
        for name in on:
            if name in jobs and job not in jobs[name]:
                jobs[name].append(job)
    return {name: tuple(ids) for name, ids in jobs.items()}


def parse_node_list(text: str) -> tuple[str, ...]:
    """`sinfo -h -N -o %N` (one node a line, maybe repeated across partitions) -> the names, in order, once."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        for name in NodeSet(line.strip()) if line.strip() else ():
            seen.setdefault(name, None)
    return tuple(seen)


def missing(nodes: Mapping[str, SlurmNode], wanted: Iterable[str]) -> list[str]:
    return [name for name in wanted if name not in nodes]
