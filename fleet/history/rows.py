"""What the history holds, as Python: a run (`RunRow`), a host's outcome in a run (`HostRow`), a run with its
hosts (`RunRecord`), what kind of run it was (`RunKind`), and a host's report as the `hosts` table's columns
(`host_values`) and back (`host_from_row`). Pure: no database here (`fleet.history.store` reads and writes them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from fleet.history.schema import json_text, parse_stamp
from fleet.model import codec
from fleet.model.codec import scheduler_fields, step_document
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import Finding, GpuReport, HostFinding, HostReport, HostStatus, Reason, flat
from fleet.runlog.folder import RunLiveness


@dataclass(frozen=True, kw_only=True)
class RunRow:
    """One run as the history has it; `counts` are its hosts on record by status."""

    run_id: str
    command: str
    targets: tuple[str, ...]
    options: dict[str, Any]
    started_at: str
    ended_at: str | None
    exit_code: int | None
    fleet_version: str
    log_dir: str
    counts: dict[str, int] = field(default_factory=dict)
    liveness: str | None = None  # a `Liveness`, where the reader looked at the run's folder (`fleet runs`)

    @property
    def finished(self) -> bool:
        return self.ended_at is not None

    @property
    def duration_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return round((parse_stamp(self.ended_at) - parse_stamp(self.started_at)).total_seconds(), 3)

    @property
    def recorded(self) -> int:
        return sum(self.counts.values())

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets), "duration_s": self.duration_s}


@dataclass(frozen=True, kw_only=True)
class HostRow:
    """One host's outcome in one run; `started_at` and `command` are its run's."""

    run_id: str
    host: str
    status: str
    reason: str | None
    error: str | None
    duration_s: float
    steps: list[dict[str, Any]]
    killed_count: int
    killed: list[dict[str, Any]]
    memory_before_mib: list[int | None] | None
    memory_after_mib: list[int | None] | None
    settle_s: list[float | None] | None
    health: list[dict[str, Any]]
    slurm: dict[str, Any] | None
    ended_at: str | None
    started_at: str = ""
    command: str = ""
    settings: list[dict[str, Any] | None] | None = None  # each GPU's settings (migration 2; null before it)
    fabric_manager: dict[str, Any] | None = None  # the node's fabric manager (migration 3; null: not read)

    def document(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunRecord:
    """A run and its hosts on record (a killed run: those that finished before it died)."""

    run: RunRow
    hosts: list[HostRow]


class Liveness(StrEnum):
    """Whether a run's fleet process is still going, as its log folder says (its `running.lock`, its summary)."""

    OVER = "over"  # its end is on record, or its summary.json is written
    RUNNING = "running"  # no end on record and its process still holds running.lock
    KILLED = "killed"  # no end on record, no summary, the lock free: its process died (SIGKILL, a crash, a reboot)
    UNKNOWN = "unknown"  # no end on record and no folder or lock file to tell (another controller, fleet 0.1)


def liveness(lock: RunLiveness, summary: bool) -> Liveness:
    """The `Liveness` of a run with no end on record, from what its lock says (`run_liveness`) and whether its
    summary.json is written (then it ended, and only its end is missing from the history)."""
    if summary:
        return Liveness.OVER
    return {RunLiveness.RUNNING: Liveness.RUNNING, RunLiveness.OVER: Liveness.KILLED}.get(lock, Liveness.UNKNOWN)


class RunKind(StrEnum):
    """What a run on record was: only a reset changed anything on its hosts (`--rerun-failed` takes no other)."""

    RESET = "reset"
    DRY_RUN = "dry run"  # `fleet reset --dry-run`: command reset, mode plan
    CHECK = "check"  # `fleet check`
    DEMO = "demo"  # `fleet demo`: a simulated fleet, recorded as such (no real host was touched)


DEMO = RunKind.DEMO.value  # the command the demo's runs are recorded under


# How the runs table tells them apart; `run_kind` and `History.last_reset_id` read the same two columns.
DRY_RUN_MODE = "plan"


def run_kind(run: RunRow) -> RunKind:
    """A reset, a dry run, a check or the demo, from the run's command and its options' mode."""
    if run.command == DEMO:
        return RunKind.DEMO
    if run.command != RunKind.RESET.value:
        return RunKind.CHECK
    return RunKind.DRY_RUN if run.options.get("mode") == DRY_RUN_MODE else RunKind.RESET


def not_clean(record: RunRecord) -> list[str]:
    """The run's targets that did not end clean: failed, unreachable or skipped on record, and those a killed
    run never recorded (`--rerun-failed`, which refuses dry runs and checks before it asks)."""
    ended = {h.host: h.status for h in record.hosts}
    return [name for name in record.run.targets if ended.get(name) != HostStatus.CLEAN.value]


def host_values(report: HostReport) -> dict[str, Any]:
    """A host's report as the `hosts` table's columns (but run_id and ended_at), each part as the JSON document
    writes it (`fleet.model.codec`; a step without its detail, a finding with its GPU's index, every scheduler
    field): pure."""
    gpus = report.gpus
    return {
        "host": report.name,
        "status": report.status.value,
        "reason": report.reason.value if report.reason is not None else None,
        "error": report.error,
        "duration_s": report.duration_s,
        "steps": json_text([{k: v for k, v in step_document(s).items() if k != "detail"} for s in report.steps]),
        "killed_count": len(report.killed),
        "killed": json_text([flat(k) for k in report.killed]),
        "memory_before_mib": _memory_before(report),
        "memory_after_mib": json_text([g.memory_used_mib for g in gpus]) if gpus else None,
        "settle_s": json_text([g.settle_s for g in gpus]) if gpus else None,
        "health": json_text([{"gpu": g.index, **flat(f)} for g in gpus for f in g.health]
                            + [{"gpu": None, **flat(f)} for f in report.health]),
        "slurm": json_text(scheduler_fields(report.scheduler)) if report.scheduler is not None else None,
        "settings": _settings_column(gpus) if gpus else None,
        "fabric_manager": json_text(flat(report.fabric_manager)) if report.fabric_manager is not None else None,
    }


def _settings_column(gpus: Sequence[GpuReport]) -> str:
    """`json_text([codec.settings_document(g) for g in gpus])`, the text of each GPU's settings made once a
    value: the alike GPUs of a node share one (`GpuSettings.of_each`), so a node of 8 writes one, not 8 (3.4 KB
    of its row's 4.5)."""
    texts: dict[int, str] = {}  # id of a settings value (alive in `gpus`) -> its text
    parts = []
    for gpu in gpus:
        settings = gpu.settings
        text = texts.get(id(settings))
        if text is None:
            text = texts[id(settings)] = json_text(codec.settings_document(gpu))
        parts.append(text)
    return f"[{','.join(parts)}]"


def _memory_before(report: HostReport) -> str | None:
    """Each GPU's memory.used as the reset began (a dry run: as its survey read it); None when not read."""
    if report.memory_before_mib is not None:
        return json_text(list(report.memory_before_mib))
    return json_text(list(report.plan.gpu_memory_mib)) if report.plan is not None else None


def host_from_row(row: HostRow) -> HostReport:
    """`host_values`' inverse, as far as the row keeps the report: no step's detail, no GPU's name, no host's start
    in the run, no kept process. A reason code of another fleet version reads as none; a column of another shape
    raises `DocumentError` naming it."""
    after, settle = row.memory_after_mib or [], row.settle_s or []
    found = codec.records_from(row.health, _finding_on, "health")
    said = _settings(row.settings)
    gpus = tuple(GpuReport(index=i, memory_used_mib=m, settle_s=settle[i] if i < len(settle) else None,
                           health=tuple(f for gpu, f in found if gpu == i and isinstance(f, Finding)),
                           settings=said[i] if i < len(said) else None)
                 for i, m in enumerate(after))
    health = tuple(f for gpu, f in found if gpu is None and isinstance(f, HostFinding))
    before = row.memory_before_mib
    return HostReport(
        name=row.host, status=HostStatus(row.status), duration_s=row.duration_s, error=row.error,
        steps=codec.records_from([{**s, "detail": ""} for s in row.steps], codec.step_from, "steps"),
        killed=codec.records_from(row.killed, codec.killed_from, "killed"), gpus=gpus,
        scheduler=codec.scheduler_from(codec.Fields(row.slurm, "slurm")) if row.slurm is not None else None,
        reason=_reason(row.reason), memory_before_mib=tuple(before) if before is not None else None, health=health,
        fabric_manager=codec.fabric_manager_from(codec.Fields(row.fabric_manager, "fabric_manager")
                                                 if row.fabric_manager is not None else None))


def _settings(column: list[dict[str, Any] | None] | None) -> list[GpuSettings | None]:
    """Each GPU's settings from the `settings` column (absent before migration 2)."""
    return [codec.gpu_settings_from(codec.Fields(s, f"settings[{i}]") if s is not None else None)
            for i, s in enumerate(column or [])]


def _finding_on(fields: codec.Fields) -> tuple[int | None, Finding | HostFinding]:
    """A finding of the health column: on a GPU (its index) or on none (the host's, with its PCI address)."""
    gpu = fields.maybe_integer("gpu")
    return gpu, codec.finding_from(fields) if gpu is not None else codec.host_finding_from(fields)


def _reason(value: str | None) -> Reason | None:
    try:
        return Reason(value) if value else None
    except ValueError:  # a code from another fleet version
        return None
