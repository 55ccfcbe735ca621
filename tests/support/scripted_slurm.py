"""A scripted Slurm for rule tests: scontrol and squeue answered from a dict, in the shapes Slurm 22.05 prints
(tests/fixtures/slurm/show_node.txt), with the faults a busy slurmctld shows.

    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.lose_replies = 1        # the next write is applied, and its reply lost (exit 1, socket timeout)
    slurm.refuse = 2              # the next two writes are not applied (exit 1)
    slurm.unreadable = 1          # the next `scontrol show` (node or reservation) fails
    slurm.not_responding_reads = 2   # after a resume, the node reads IDLE* twice before IDLE
    slurm.unreadable_after_update = 1  # once an update is applied, the next read fails
    slurm.hanging = 2             # the next two `scontrol show node` never answer (past the client's timeout)
    lifecycle = SlurmLifecycle(slurm.client(), ...)

A write is `scontrol update`, `scontrol create reservation` or `scontrol delete`. `updates` records every update
that was applied, in order; `reservations` the reservations Slurm has, `created` and `deleted` those created and
removed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ClusterShell.NodeSet import NodeSet

from fleet.slurm.control import Slurm
from fleet.slurm.runner import LocalRunner
from fleet.transport.scripted import Reply, ScriptedTransport

# What scontrol prints when slurmctld took the request but its reply never came back.
LOST_REPLY = "slurm_update error: Socket timed out on send/recv operation"
REFUSED = "slurm_update error: Unable to contact slurm controller (connect failure)"


@dataclass
class _Node:
    state: str
    reason: str | None = None


class ScriptedSlurm:
    """Nodes given as name -> state, or name -> (state, reason)."""

    def __init__(self, nodes: dict[str, str | tuple[str, str]]) -> None:
        self.nodes = {name: _Node(*((v,) if isinstance(v, str) else v)) for name, v in nodes.items()}
        self.jobs: dict[str, list[str]] = {}
        self.named: dict[str, list[str]] = {}  # job name -> the ids of the jobs so named (`squeue --name`)
        self.cancelled: list[str] = []  # job ids scancelled, in order
        self.updates: list[tuple[str, str, str | None]] = []
        self.lose_replies = 0
        self.refuse = 0
        self.unreadable = 0  # the next N `scontrol show` fail
        self.unreadable_after_update = 0  # ... from the next update on
        self.not_responding_reads = 0
        self.hanging = 0  # the next N `scontrol show node` hang
        self._flagged: dict[str, int] = {}
        self.writes: list[str] = []  # every write applied, in order: "update sim1 DRAIN", "delete fleet-..."
        self.reservations: set[str] = set()
        self.created: list[str] = []  # reservations created (`scontrol create reservation ReservationName=...`)
        self.deleted: list[str] = []  # reservations removed (`scontrol delete ReservationName=...`)

    def client(self, timeout: float | None = None) -> Slurm:
        """A Slurm client of this script (`timeout`: its command bound, Slurm's own by default)."""
        transport = ScriptedTransport(script=[
            (("scontrol", "show", "node"), self._show),
            (("scontrol", "show", "reservation"), self._show_reservation),
            (("scontrol", "update"), self._update),
            (("scontrol", "create", "reservation"), self._create),
            (("scontrol", "delete"), self._delete),
            (("squeue",), self._squeue),
            (("scancel",), self._scancel),
        ])
        return Slurm(LocalRunner(transport)) if timeout is None else Slurm(LocalRunner(transport), timeout)

    # --- the commands ------------------------------------------------------------------------------

    def _unreadable(self) -> Reply | None:
        if not self.unreadable:
            return None
        self.unreadable -= 1
        return Reply(stderr="slurm_load_node error: Socket timed out on send/recv operation", exit_status=1)

    def _show(self, argv: Sequence[str]) -> Reply:
        if self.hanging:
            self.hanging -= 1
            return Reply(delay_s=3600)
        fault = self._unreadable()
        if fault is not None:
            return fault
        records, unknown = [], []
        for name in NodeSet(argv[3]):
            node = self.nodes.get(name)
            if node is None:
                unknown.append(f"Node {name} not found")
                continue
            state = node.state
            if self._flagged.get(name):
                self._flagged[name] -= 1
                state = f"{state}*"
            reason = f"   Reason={node.reason} [root@2026-12-03T07:00:00]\n" if node.reason else ""
            records.append(f"NodeName={name} Arch=x86_64 CoresPerSocket=1 \n   Gres=gpu:8\n   State={state}"
                           f" ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n{reason}\n")
        return Reply(stdout="".join(records), stderr="\n".join(unknown), exit_status=1 if unknown else 0)

    def _update(self, argv: Sequence[str]) -> Reply:
        words = dict(a.split("=", 1) for a in argv[2:])

        def update() -> Reply | None:
            for name in NodeSet(words["NodeName"]):
                self._apply(name, words["State"], words.get("Reason"))
            return None

        return self._write(f"update {words['NodeName']} {words['State']}", update)

    def _write(self, what: str, apply: Callable[[], Reply | None]) -> Reply:
        """A write, with the faults asked for: refused (not applied), or applied and its reply lost."""
        if self.refuse:
            self.refuse -= 1
            return Reply(stderr=REFUSED, exit_status=1)
        refused = apply()
        if refused is not None:
            return refused
        self.writes.append(what)
        self.unreadable, self.unreadable_after_update = self.unreadable + self.unreadable_after_update, 0
        if self.lose_replies:
            self.lose_replies -= 1
            return Reply(stderr=LOST_REPLY, exit_status=1)
        return Reply()

    def _apply(self, name: str, state: str, reason: str | None) -> None:
        node = self.nodes[name]
        base = node.state.split("+")[0]
        self.updates.append((name, state, reason))
        if state == "DRAIN":
            node.state, node.reason = f"{base}+DRAIN", reason
        elif state == "RESUME":
            node.state, node.reason = base, None
            self._flagged[name] = self.not_responding_reads

    def _create(self, argv: Sequence[str]) -> Reply:
        name = argv[3].split("=", 1)[1]

        def create() -> Reply | None:
            if name in self.reservations:
                return Reply(stderr="Error creating the reservation: Duplicate reservation name", exit_status=1)
            self.reservations.add(name)
            self.created.append(name)
            return None

        return self._write(f"create {name}", create)

    def _delete(self, argv: Sequence[str]) -> Reply:
        name = argv[2].split("=", 1)[1]

        def delete() -> Reply | None:
            if name not in self.reservations:
                return Reply(stderr=f"delete_reservation ReservationName={name}: Requested reservation is invalid",
                             exit_status=1)
            self.reservations.discard(name)
            self.deleted.append(name)
            return None

        return self._write(f"delete {name}", delete)

    def _show_reservation(self, argv: Sequence[str]) -> Reply:
        fault = self._unreadable()
        if fault is not None:
            return fault
        name = argv[3]
        if name not in self.reservations:
            return Reply(stdout=f"Reservation {name} not found\n", exit_status=1)
        return Reply(stdout=f"ReservationName={name} StartTime=2026-12-03T07:00:00 EndTime=2026-12-03T07:17:00"
                     " Duration=00:17:00\n   Nodes=sim1 NodeCnt=1 Flags=MAINT,IGNORE_JOBS,SPEC_NODES\n")

    def _scancel(self, argv: Sequence[str]) -> Reply:
        for job in argv[1:]:
            self.cancelled.append(job)
            for ids in self.named.values():
                if job in ids:
                    ids.remove(job)
        return Reply()

    def _squeue(self, argv: Sequence[str]) -> Reply:
        if "--name" in argv:  # the step's jobs, by name: `named` (ids), each gone once scancelled
            return Reply(stdout="".join(f"{job}\n" for job in self.named.get(argv[argv.index("--name") + 1], [])))
        wanted = set(NodeSet(argv[argv.index("--nodelist") + 1]))
        lines = [f"{job} {name}" for name in sorted(wanted) for job in self.jobs.get(name, [])]
        return Reply(stdout="".join(f"{line}\n" for line in lines))
