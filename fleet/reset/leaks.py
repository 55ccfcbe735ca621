"""Whose is the GPU memory that did not come back: a leaked context, a scheduler's job's processes, or a process.

Asks the node, in one command (`Node.batch`): the GPU query (index, uuid, PCI bus id, memory.used, MIG mode:
verify's fields), the compute apps, `nvidia-smi -q` (each GPU's device minor number, and whether the GPUs share
an NVSwitch fabric) and the holder scan; the holders found are then described (`fleet.reset.holders`), and the
job daemon above a job's process whose cgroup does not name its job is read with ps (its title may: Slurm's
`slurmstepd: [4711.0]`, read by its scheduler's node side, `fleet.node.jobs`). A scan that could not see every
process fails the step (`blind_scan`) as everywhere: "no process holds it" is only ever said of a complete scan.

Decides (pure, below): which GPUs each holder holds. `/dev/nvidiaN`'s N is the GPU's device minor number, which
`-q` gives per PCI bus id, and the GPU query gives each bus id's nvidia-smi index: on real nodes the minor number
and the index differ, so a device file is never read as an index. A GPU device file whose GPU cannot be told
(`-q` unread, a minor number it does not list) counts as holding every GPU. Then, for each GPU over what it may
hold: processes fleet keeps as part of the machine do not count (what they use is in the allowance); what is
left is a job's processes only (the job holds it), or some other process (it holds it), or nothing (a
leaked context).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.gpu_facts import FABRIC_STATE
from fleet.model.report import StepName, StepStatus
from fleet.node.bounds import commands_s
from fleet.node.budget import Room, TimeBudget
from fleet.node.node import Node
from fleet.node.probe import Probe
from fleet.node.probes import health, procs, smi
from fleet.reset.holders import scan
from fleet.reset.protection import Holder, job_of
from fleet.transport.base import CommandResult

# Commands a look may run: its batch, the holders' description, the scan's second look, the job daemons' titles.
LOOK_COMMANDS = 5
# Its batch's nvidia-smi reads (the GPU query, the compute apps, `-q`): each has nvidia-smi's bound on top of that.
LOOK_SMI = 3


def look_room(host: Host) -> Room:
    """A look's commands, each at its bound (nothing to wait for)."""
    return Room(0.0, commands_s(host, smi=LOOK_SMI, other=LOOK_COMMANDS))


@dataclass(frozen=True)
class Board:
    """What `nvidia-smi -q` tells: each device minor number's GPU (PCI bus id), and whether the GPUs share an
    NVSwitch fabric (HGX/DGX: they are reset together)."""

    minors: Mapping[int, str]
    nvswitch: bool


def parse_board(text: str) -> Board:
    gpus = health.parse_all_health(text)
    return Board(smi.parse_minor_numbers(text), any(g[FABRIC_STATE] is not None for g in gpus))


def _explain(result: CommandResult) -> str:
    return smi.classify_smi_failure(result.exit_status, result.stdout, result.stderr)


def board(nvidia_smi: str) -> Probe[Board]:
    return Probe(argv=tuple(health.health_argv(nvidia_smi)), what="nvidia-smi -q", parse=parse_board,
                 reads="nvidia-smi -q output",
                 hang=smi.SMI_HANG, explain=_explain, driver=True)


@dataclass(frozen=True, kw_only=True)
class Look:
    """One complete look at who holds the GPUs: the GPUs, the compute apps, the holders (judged), what `-q` said
    (None: it could not be read) and the job daemons' titles read (pid -> command line)."""

    rows: tuple[smi.GpuRow, ...]
    apps: tuple[smi.ComputeApp, ...] = ()
    holders: tuple[Holder, ...] = ()
    board: Board | None = None
    titles: Mapping[int, str] = field(default_factory=dict)

    def gpus_of(self, holder: Holder) -> frozenset[int]:
        """The GPU indexes whose device file the holder has open: minor number -> PCI bus id -> index. A GPU
        device file whose GPU cannot be told holds every GPU, as far as anyone can say."""
        minors = self.board.minors if self.board is not None else {}
        by_bus = {r.pci_bus_id.upper(): r.index for r in self.rows if r.pci_bus_id}
        found = set()
        for device in holder.devices:
            minor = smi.device_minor(device)
            if minor is None:
                continue
            index = by_bus.get(minors.get(minor, ""))
            if index is None:
                return frozenset(r.index for r in self.rows)
            found.add(index)
        return frozenset(found)

    def holders_by_gpu(self) -> dict[int, tuple[Holder, ...]]:
        """GPU index -> every holder with its device file open (kept ones too)."""
        return {r.index: tuple(h for h in self.holders if r.index in self.gpus_of(h)) for r in self.rows}

    @property
    def machine(self) -> frozenset[int]:
        """Pids of the holders kept as part of the machine (what they use is in the allowance)."""
        return frozenset(h.pid for h in self.holders if h.part_of_the_machine)


async def look(node: Node, step: StepName = StepName.SETTLE) -> Look:
    """The GPUs, the compute apps, `-q` and the holder scan in one command; the holders described; the
    job daemons' titles of job processes whose cgroup does not name their job. A `-q` that does not answer
    readably is no board (the GPUs' device files then cannot be told apart); one that hangs fails the step."""
    host = node.host
    budget = look_room(host).start()
    gpu_probe, apps_probe = smi.gpu_query(host.nvidia_smi, smi.VERIFY_FIELDS), smi.compute_apps(host.nvidia_smi)
    board_probe, scan_probe = board(host.nvidia_smi), procs.holder_scan(host.devices)
    answers = await node.batch([gpu_probe, apps_probe, board_probe, scan_probe], step=step, budget=budget)
    rows, apps = answers.read(gpu_probe), answers.read(apps_probe)
    try:
        read: Board | None = answers.read(board_probe)
    except StepFailed as exc:
        if exc.status is StepStatus.TIMEOUT:
            raise
        node.log.warning("board_unread", step=str(step), error=str(exc))
        read = None
    holders = (await scan(node, step, budget, looked=answers.result(scan_probe))).holders
    return Look(rows=rows, apps=apps, holders=holders, board=read, titles=await _titles(node, holders, step, budget))


async def _titles(node: Node, holders: Iterable[Holder], step: StepName, budget: TimeBudget) -> dict[int, str]:
    """The command lines of the job daemons named by job processes whose job is not known yet."""
    wanted = sorted({ref.daemon_pid for ref in (job_of(h) for h in holders)
                     if ref is not None and ref.job is None and ref.daemon_pid is not None})
    if not wanted:
        return {}
    rows = await node.ask(procs.ps(wanted), step=step, budget=budget)
    return {pid: rows[pid].args for pid in wanted if pid in rows}


# --- whose is the memory (pure) -----------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Unsettled:
    """One GPU whose memory did not come back (`problem`: `gpu 3 holds 4096 MiB`), and who holds it: the
    processes that are no part of the machine (`holders`; `strays`: compute apps on it that hold no device file
    the scan matched), and the machine's own processes with its device file open (`machine`)."""

    index: int
    problem: str
    known: bool = True  # memory.used was a number (not `[N/A]`)
    holders: tuple[Holder, ...] = ()
    strays: tuple[smi.ComputeApp, ...] = ()
    machine: tuple[Holder, ...] = ()

    @property
    def leaked(self) -> bool:
        """No process but the machine's holds it: a context with no process (a leak)."""
        return self.known and not self.holders and not self.strays

    @property
    def by_jobs(self) -> bool:
        """Only a job's processes (and the machine's own) hold it."""
        return self.known and bool(self.holders) and not self.strays and \
            all(job_of(h) is not None for h in self.holders)


def explain(found: Look, problems: Mapping[int, str], kept: Collection[int] = ()) -> tuple[Unsettled, ...]:
    """Each GPU with a problem (index -> `gpu 3 holds 4096 MiB`), with who holds it. `kept`: pids fleet kept as
    part of the machine besides those the look judged so."""
    machine = found.machine | frozenset(kept)
    known = {h.pid: h for h in found.holders}
    out = []
    for row in found.rows:
        problem = problems.get(row.index)
        if problem is None:
            continue
        on = [h for h in found.holders if row.index in found.gpus_of(h)]
        apps = [a for a in found.apps if a.gpu_uuid is not None and a.gpu_uuid == row.uuid and a.pid not in machine]
        pids = {h.pid for h in on} | {a.pid for a in apps}
        holders = tuple(known[p] for p in sorted(pids) if p in known and p not in machine)
        strays = tuple(a for a in apps if a.pid not in known)
        out.append(Unsettled(index=row.index, problem=problem, known=row.memory_used_mib is not None, holders=holders,
                             strays=strays, machine=tuple(h for h in on if h.pid in machine)))
    return tuple(out)


def job_label(holder: Holder, titles: Mapping[int, str]) -> str:
    """`Slurm job 4711 (slurmstepd pid 20)`; `a Slurm job (slurmstepd pid 20)` when no title names it;
    `Slurm job 4711 (pid 33 python3)` when its cgroup does and no job daemon is known."""
    ref = job_of(holder)
    if ref is None:
        return holder.label()
    job = ref.job
    if job is None and ref.daemon_pid is not None:
        job = ref.side.job_of_title(titles.get(ref.daemon_pid, ""))
    who = f"{ref.daemon} pid {ref.daemon_pid}" if ref.daemon_pid is not None else holder.label()
    return f"{ref.side.title} job {job} ({who})" if job is not None else f"a {ref.side.title} job ({who})"


def jobs_holding(unsettled: Sequence[Unsettled], titles: Mapping[int, str], limit: int = 2) -> str:
    """The jobs holding these GPUs, each named once: `Slurm job 4711 (slurmstepd pid 20) and 1 more`."""
    names = list(dict.fromkeys(job_label(h, titles) for u in unsettled for h in u.holders))
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def job_hints(unsettled: Sequence[Unsettled]) -> str:
    """What to do about the jobs holding these GPUs, each scheduler's hint once: `drain the node in Slurm first
    (--slurm waits for its jobs)`."""
    refs = (job_of(h) for u in unsettled for h in u.holders)
    return "; ".join(dict.fromkeys(ref.side.hint for ref in refs if ref is not None))


def who(holders: Sequence[Holder], strays: Sequence[smi.ComputeApp] = (), limit: int = 3) -> str:
    """`pid 5 python3 (user bob not in kill_users), pid 9 python3`: the processes holding a GPU, with why they
    were kept, when they were."""
    names = [f"{h.label()} ({h.protected_by})" if h.protected_by else h.label() for h in holders]
    names += [f"pid {a.pid} {a.process_name.rsplit('/', 1)[-1] or a.process_name}" for a in strays]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
