"""Reservations an earlier `--via srun` run left behind: `fleet-<run_id>`, still in place because its fleet was killed
(SIGKILL, a crash, the machine rebooted) before its cleanup removed it. Until its Duration ends, no one else's job
starts on its nodes, and the killed run never drained the nodes its step may have failed.

    find    one `scontrol show reservation` as the run begins: each `fleet-<run_id>` reservation of another run
            that holds a target is said once on stderr and in each such host's log (`slurm_leftover`), with
            whether its run is over (`fleet.runlog.folder.run_liveness`: its running.lock free, or its summary)
    settle  after this run's own cleanup (a reset, not a dry run): a leftover whose run is over is removed when
            none of its nodes would go back into service unchecked: each is a host this run left clean, or
            Slurm shows it out of service (drained, down). Otherwise it is kept, and the line names the nodes
            that keep it and the `scontrol delete` to run once they are checked. A run in flight (its lock held),
            or one this machine cannot see (another --log-dir, another controller), keeps its reservation.

Pure decisions first (`parse_reservations`, `leftovers`, `holding_back`), then the shell (`Leftovers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from fleet.runlog.folder import RunLiveness, run_liveness
from fleet.slurm.control import Slurm, SlurmError, hostlist
from fleet.slurm.records import SlurmNode
from fleet.terminal import say

# The name `--via srun` gives its reservation (`fleet.slurm.srun`): fleet- and a run id, nothing else.
_FLEET_RESERVATION = re.compile(r"^fleet-(?P<run_id>\d{8}T\d{6}Z-[0-9a-f]{6})$")
_FIELD = re.compile(r"(?:^|\s)(ReservationName|Nodes|Flags|State)=(\S*)")


@dataclass(frozen=True, kw_only=True)
class Leftover:
    """A reservation of another fleet run that holds some of this run's targets."""

    name: str
    run_id: str
    nodes: tuple[str, ...]  # every node it holds, targets or not
    over: bool  # its run is known to be over here (killed, or finished without removing it)

    def describe(self) -> str:
        state = "its run is over: its running.lock is free" if self.over else "its run may still be going"
        return f"reservation {self.name} of run {self.run_id} holds {hostlist(self.nodes)} ({state})"


def parse_reservations(text: str) -> dict[str, tuple[str, ...]]:
    """`scontrol show reservation --oneliner`: each reservation's name and its nodes, expanded (none: `No
    reservations in the system`). A line whose node list cannot be read keeps no nodes: never guessed."""
    found: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        if "ReservationName" not in fields:
            continue
        try:
            nodes = tuple(NodeSet(fields.get("Nodes") or "")) if fields.get("Nodes") not in (None, "", "(null)") \
                else ()
        except NodeSetParseError:
            nodes = ()
        found[fields["ReservationName"]] = nodes
    return found


def maintained_by_others(text: str) -> frozenset[str]:
    """`scontrol show reservation --oneliner`: the nodes an active maintenance reservation that is no fleet run's
    holds (an admin's: Slurm shows them MAINTENANCE, and they are the admin's, not fleet's). A line whose node list
    cannot be read holds every node as far as anyone can say: `*`."""
    held: set[str] = set()
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        name = fields.get("ReservationName")
        if name is None or _FLEET_RESERVATION.match(name) or "MAINT" not in fields.get("Flags", "").split(","):
            continue
        if fields.get("State", "ACTIVE") != "ACTIVE":
            continue
        try:
            held.update(NodeSet(fields.get("Nodes") or ""))
        except NodeSetParseError:
            held.add("*")
    return frozenset(held)


def leftovers(reservations: Mapping[str, Sequence[str]], targets: Iterable[str], run_id: str,
              over: Callable[[str], bool]) -> list[Leftover]:
    """The `fleet-<run_id>` reservations of other runs that hold any of `targets`; `over(run_id)`: that run is
    known to be over."""
    wanted = set(targets)
    found = []
    for name, nodes in sorted(reservations.items()):
        match = _FLEET_RESERVATION.match(name)
        if match is None or match["run_id"] == run_id or not wanted & set(nodes):
            continue
        found.append(Leftover(name=name, run_id=match["run_id"], nodes=tuple(nodes), over=over(match["run_id"])))
    return found


def holding_back(leftover: Leftover, clean: Iterable[str], now: Mapping[str, SlurmNode]) -> list[str]:
    """The nodes that removing `leftover` would put back into service unchecked: neither left clean by this run
    nor out of service in Slurm (a node Slurm no longer shows counts: it is not known to be safe)."""
    done = set(clean)
    return [n for n in leftover.nodes if n not in done and (n not in now or now[n].serves_unreserved)]


def _stderr(line: str) -> None:
    say(line)  # what Slurm said of a reservation: through the one terminal writer (`fleet.terminal`)


class Leftovers:
    """The leftover reservations of one run: found as it begins, settled after its cleanup."""

    def __init__(self, slurm: Slurm, run_id: str, log_dir: Path, logs: Mapping[str, Any], *, reset: bool,
                 say: Callable[[str], None] = _stderr) -> None:
        """`logs`: each target's Slurm node name -> its host's logger; `reset`: this run may remove them."""
        self.slurm, self.run_id, self.log_dir, self.logs = slurm, run_id, log_dir, logs
        self.reset, self.say = reset, say
        self.found: list[Leftover] = []
        self.others: frozenset[str] | None = None  # nodes someone else's maintenance holds; None: unread

    def _over(self, run_id: str) -> bool:
        return run_liveness(self.log_dir, run_id) is RunLiveness.OVER

    async def find(self, targets: Sequence[str]) -> list[Leftover]:
        """The leftovers that hold a target, each said once; none when Slurm cannot say (nothing is removed then)."""
        try:
            result = await self.slurm.run(["scontrol", "show", "reservation", "--oneliner"])
        except SlurmError as exc:
            self.say(f"fleet: warning: cannot read Slurm's reservations ({exc}): a reservation an earlier run left"
                     " is neither seen nor removed")
            return []
        self.found = leftovers(parse_reservations(result.stdout), targets, self.run_id, self._over)
        self.others = maintained_by_others(result.stdout)
        for leftover in self.found:
            self.say(f"fleet: {leftover.describe()}: no other job starts there until it ends")
            self._log(leftover, "seen")
        return self.found

    def in_fleets_maintenance(self, node: SlurmNode) -> bool:
        """The node is out of service only through the MAINTENANCE flag of a leftover fleet reservation: no one
        else's maintenance holds it (as read when the run began; unread: never said)."""
        if self.others is None or node.name in self.others or "*" in self.others:
            return False
        return node.serves_unreserved and any(node.name in leftover.nodes for leftover in self.found)

    async def settle(self, clean: Iterable[str]) -> None:
        """Remove each leftover of a run that is over whose nodes are all checked (see the module docstring)."""
        if not self.reset:
            return
        done = set(clean)
        for leftover in self.found:
            if not leftover.over:
                self.say(f"fleet: kept {leftover.describe()}")
                self._log(leftover, "kept")
                continue
            await self._remove(leftover, done)

    async def _remove(self, leftover: Leftover, clean: set[str]) -> None:
        try:
            held = holding_back(leftover, clean, await self.slurm.nodes(leftover.nodes))
            if not held:
                await self.slurm.run(["scontrol", "delete", f"ReservationName={leftover.name}"])
                self.say(f"fleet: removed {leftover.describe()}: every node of it is clean or drained")
                self._log(leftover, "removed")
                return
            why = f"{hostlist(held)} not reset clean by this run nor drained"
        except SlurmError as exc:
            why = str(exc)
        self.say(f"fleet: kept {leftover.describe()}: {why}; once checked: scontrol delete"
                 f" ReservationName={leftover.name}")
        self._log(leftover, "kept", why)

    def _log(self, leftover: Leftover, action: str, why: str | None = None) -> None:
        for node in leftover.nodes:
            if node in self.logs:
                self.logs[node].warning("slurm_leftover", node=node, reservation=leftover.name,
                                        earlier_run=leftover.run_id, over=leftover.over, action=action,
                                        **({"why": why} if why else {}))
