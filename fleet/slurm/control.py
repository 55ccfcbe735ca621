"""The Slurm client commands fleet runs on this machine: scontrol, squeue, sinfo. Bounded, stdout and stderr apart.

Every command is a plain argv (no shell) run through one `Runner` (`fleet.slurm.runner`: on this machine, or a
test's), so it is bounded like any node command (`timeout` around it, a client deadline after) and its streams
are read apart; `--via srun`'s step starts through the same runner (`Slurm.start`). A command that fails or
prints what the parser does not understand raises `SlurmError`: fleet never reads that as "no job" or "no reason".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from ClusterShell.NodeSet import NodeSet

from fleet.inventory.messages import one_line
from fleet.model.errors import CommandTimeout, FleetError
from fleet.slurm.records import (
    HOLDING_JOB_STATES,
    SlurmNode,
    SlurmParseError,
    parse_jobs,
    parse_node_list,
    parse_nodes,
)
from fleet.slurm.runner import LocalRunner, Runner, Stream
from fleet.transport.base import CommandResult

# Seconds one Slurm client command may take (slurmctld answers in milliseconds; a busy one, in seconds).
SLURM_COMMAND_TIMEOUT_S = 30.0
T = TypeVar("T")
_NOT_FOUND = re.compile(r"^Node (\S+) not found$", re.MULTILINE)
# A job id as squeue prints it: 4711, an array task 4711_3, a het job component 4711+1.
_JOB_ID = re.compile(r"\d+(?:[_+]\d+)?")


class SlurmError(FleetError):
    """A Slurm command failed, timed out or printed what fleet cannot read."""


def hostlist(names: Iterable[str]) -> str:
    """Names in Slurm's hostlist syntax, folded: sim[1-4]."""
    return str(NodeSet.fromlist(sorted(set(names))))


class Slurm:
    """Slurm's client commands, as fleet uses them, run through `runner` (this machine's processes unless given)."""

    def __init__(self, runner: Runner | None = None, timeout: float = SLURM_COMMAND_TIMEOUT_S) -> None:
        self.runner: Runner = runner or LocalRunner()
        self.timeout = timeout

    async def run(self, argv: Sequence[str], *, timeout: float | None = None,
                  ok: frozenset[int] = frozenset({0})) -> CommandResult:
        """Run one Slurm command; SlurmError unless its exit status is in `ok`."""
        try:
            result = await self.runner.run(argv, timeout=timeout or self.timeout)
        except CommandTimeout as exc:
            raise SlurmError(f"{argv[0]} did not answer within {exc.deadline_s:g} s") from exc
        if result.exit_status not in ok:
            said = one_line(result.stderr or result.stdout) or f"exit status {result.exit_status}"
            raise SlurmError(f"{' '.join(argv[:2])} failed: {said[:300]}")
        return result

    async def nodes(self, names: Iterable[str]) -> dict[str, SlurmNode]:
        """The named nodes as scontrol shows them; a name Slurm does not know is absent.

        scontrol prints the nodes it knows and `Node X not found` for each other one, and then exits 1:
        exit 1 with no such line is a failure, never "no node"."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        result = await self.run(["scontrol", "show", "node", hostlist(wanted)], ok=frozenset({0, 1}))
        unknown = {m.group(1) for m in _NOT_FOUND.finditer(result.stdout + result.stderr)}
        if result.exit_status != 0 and not unknown:
            said = one_line(result.stderr or result.stdout)[:300] or "exit status 1"
            raise SlurmError(f"scontrol show failed: {said}")
        found = _parsed(lambda: parse_nodes(result.stdout))
        return {name: node for name, node in found.items() if name in set(wanted)}

    async def look(self, names: Iterable[str]) -> tuple[dict[str, SlurmNode], dict[str, tuple[str, ...]]]:
        """The named nodes Slurm knows, and the jobs that hold each of them: one scontrol and one squeue."""
        seen = await self.nodes(names)
        return seen, await self.jobs(seen)

    async def jobs(self, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Node -> ids of the jobs that hold it (running, completing, suspended, ...), for each named node."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        result = await self.run(
            ["squeue", "--noheader", "--states", ",".join(HOLDING_JOB_STATES), "--format", "%i %N",
             "--nodelist", hostlist(wanted)]
        )
        return _parsed(lambda: parse_jobs(result.stdout, wanted))

    async def jobs_named(self, name: str, user: str) -> tuple[str, ...]:
        """The ids of `user`'s jobs called `name` that Slurm still has (pending, running, completing, ...)."""
        result = await self.run(["squeue", "--noheader", "--name", name, "--user", user, "--states",
                                 ",".join(("PENDING", *HOLDING_JOB_STATES)), "--format", "%i"])
        ids = tuple(dict.fromkeys(line.strip() for line in result.stdout.splitlines() if line.strip()))
        if not all(_JOB_ID.fullmatch(job) for job in ids):
            raise SlurmError(f"squeue printed what is no job id: {result.stdout[:80]!r}")
        return ids

    async def cancel(self, job_ids: Sequence[str]) -> None:
        """`scancel` the jobs by their ids (a job that ended meanwhile is no error: the caller reads back)."""
        if job_ids:
            await self.run(["scancel", *job_ids], ok=frozenset({0, 1}))

    async def update(self, names: Iterable[str], state: str, reason: str | None = None) -> None:
        """`scontrol update NodeName=... State=...[ Reason=...]` for every named node at once."""
        argv = ["scontrol", "update", f"NodeName={hostlist(names)}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        await self.run(argv)

    async def reservation(self, name: str) -> bool:
        """Whether Slurm has the reservation. scontrol prints `Reservation NAME not found` and exits 1 for one it
        does not have: exit 1 with no such line is a failure, never "no reservation"."""
        result = await self.run(["scontrol", "show", "reservation", name], ok=frozenset({0, 1}))
        if result.exit_status == 0 and f"ReservationName={name} " in result.stdout:
            return True
        if result.exit_status == 1 and f"Reservation {name} not found" in result.stdout + result.stderr:
            return False
        said = one_line(result.stderr or result.stdout)[:300] or f"exit status {result.exit_status}"
        raise SlurmError(f"scontrol show reservation failed: {said}")

    async def partition(self, name: str) -> tuple[str, ...]:
        """The nodes of a partition; SlurmError when Slurm has no such partition or it has no node."""
        result = await self.run(["sinfo", "--noheader", "--Node", "--partition", name, "--format", "%N"])
        nodes = _parsed(lambda: parse_node_list(result.stdout))
        if not nodes:
            raise SlurmError(f"Slurm has no partition {name!r}, or it has no node")
        return nodes

    async def start(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str]) -> Stream:
        """Start a streamed Slurm command (`srun`), bounded by `timeout` around it, through the same runner."""
        return await self.runner.start(argv, timeout=timeout, env=env)

    async def close(self) -> None:
        await self.runner.close()


def _parsed(parse: Callable[[], T]) -> T:
    try:
        return parse()
    except SlurmParseError as exc:
        raise SlurmError(str(exc)) from exc
