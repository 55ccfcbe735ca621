"""A host's report as its JSON document and back, typed both ways: the one place the document's shape is written.

`host_to_document` gives the `hosts.NAME` object of the JSON report (`fleet.report.render.to_document`, --json,
summary.json) and of the `--via srun` relay (a node that reset itself hands its report to the controller);
`host_from_document` reads one back and `run_from_document` a whole report (`fleet show`, report.html of a run on
disk). The history's columns (`fleet.history.rows`) are written and read back with the parts here.

Reading is strict, as the relay reads bytes from a node: a key that is missing or of another type, an unknown
status or reason code, raises `DocumentError`, one line naming the key (`gpus[2].memory_used_mib: expected an
integer or null, got "x"`). Keys a newer fleet adds are ignored. Keys an older fleet did not write may be absent,
each named in its reader: `start_s`, `health` and `kept` (0.1.0 wrote none), a finding's `pci`; the only-when-set
blocks `memory_before_mib`, `fabric_manager` (verify's read of it), `stopped`, `restored`, `plan` (its `with_units`)
and the scheduler's record (under its scheduler's name: `slurm`), and in the record every key but `node`.

What the document does not keep: a step's `error` and `reason` (the host's say it), `would_stop` (read from the plan's
`units`), and a scheduler's optional values (`plan`, `error`, `abandoned`, `waited_s`, `taken_over`) when empty.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import StrEnum
from typing import Any, TypeVar

from fleet.model import plugs
from fleet.model.errors import DocumentError
from fleet.model.fabric import FabricManager, FmState
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    HostPlan,
    HostReport,
    HostStatus,
    KeptProcess,
    KilledProcess,
    Level,
    PlannedProcess,
    Reason,
    RunReport,
    SchedulerRecord,
    StepName,
    StepResult,
    StepStatus,
    flat,
)

E = TypeVar("E", bound=StrEnum)
T = TypeVar("T")
ABSENT: Any = object()  # a reader's default: the key must be there
# The scheduler block's keys written only when set (a dry run's plan, an error, an abandoned release, a wait...).
SCHEDULER_WHEN_SET = ("plan", "error", "abandoned", "waited_s", "taken_over")
# The scheduler a record names when it names none: before 0.3 a record had no `by`, Slurm being the only one.
ONLY_SCHEDULER_BEFORE = "slurm"


# --- writing ------------------------------------------------------------------------------------------------------


def json_writer(item_separator: str = ", ", key_separator: str = ": ") -> Callable[[object], str]:
    """`json.dumps(value, separators=(item_separator, key_separator))`, its encoder made once: the same text, by
    json's C encoder. Without json's check for a value that holds itself: these are trees of plain values, made
    from frozen records."""
    return json.JSONEncoder(separators=(item_separator, key_separator), check_circular=False).encode



def host_to_document(host: HostReport) -> dict[str, Any]:
    """The host's object in the JSON report (docs/contract.md): keys in the order the report has always had them."""
    document: dict[str, Any] = {
        "status": host.status.value,
        "reason": host.reason.value if host.reason else None,
        "duration_s": host.duration_s,
        "start_s": host.start_s,
        "error": host.error,
        "steps": [step_document(s) for s in host.steps],
        "killed": [flat(k) for k in host.killed],
        "kept": [flat(k) for k in host.kept],
        "gpus": [gpu_document(g) for g in host.gpus],
        "health": [flat(f) for f in host.health],
    }
    if host.memory_before_mib is not None:
        document["memory_before_mib"] = list(host.memory_before_mib)
    if host.fabric_manager is not None:
        document["fabric_manager"] = flat(host.fabric_manager)
    if host.stopped:
        document["stopped"] = list(host.stopped)
    if host.restored:
        document["restored"] = list(host.restored)
    if host.plan is not None:
        document["plan"] = plan_document(host.plan)
    if host.scheduler is not None:  # under its scheduler's name: `slurm`, as 0.1 wrote it
        record = scheduler_fields(host.scheduler)
        document[host.scheduler.by] = {k: v for k, v in record.items()
                                       if k != "by" and (k not in SCHEDULER_WHEN_SET or v)}
    return document


def step_document(step: StepResult) -> dict[str, Any]:
    return {"name": step.name.value, "status": step.status.value, "duration_s": step.duration_s, "detail": step.detail}


def gpu_document(gpu: GpuReport) -> dict[str, Any]:
    """A GPU as `asdict` writes it (`settings` null where verify did not read them)."""
    document = flat(gpu)  # health and settings replaced where they stand
    document["health"] = tuple([flat(f) for f in gpu.health])
    document["settings"] = settings_document(gpu)
    return document


def settings_document(gpu: GpuReport) -> dict[str, Any] | None:
    """The GPU's `settings` as its document has them (null where verify did not read them)."""
    return None if gpu.settings is None else flat(gpu.settings)


def plan_document(plan: HostPlan) -> dict[str, Any]:
    return {"would_stop": list(plan.would_stop), "units": dict(plan.units),
            "would_kill": [flat(p) for p in plan.would_kill], "kept": [flat(p) for p in plan.kept],
            "gpu_memory_mib": list(plan.gpu_memory_mib),
            **({"would_restore": list(plan.would_restore)} if plan.would_restore else {}),
            **({"with_units": [flat(p) for p in plan.with_units]} if plan.with_units else {})}


def scheduler_fields(record: SchedulerRecord) -> dict[str, Any]:
    """Every field of the scheduler record, its scheduler's name (`by`) only when it is not Slurm's: the
    history's `slurm` column as it has held it since 0.1 (the document leaves the empty optional ones out, and
    keys the record by `by`)."""
    fields = {**asdict(record), "jobs": list(record.jobs)}
    if record.by == ONLY_SCHEDULER_BEFORE:
        del fields["by"]
    return fields


# --- reading ------------------------------------------------------------------------------------------------------


class Fields:
    """One object of a document, read key by key: each reader checks the value's type and names the key's path
    (`gpus[2].health[0].level`) in the one-line `DocumentError` when it is missing or of another type. The path is
    only put together for an error: reading stays cheap (a summary.json of 10,000 hosts, a relay's every node)."""

    def __init__(self, value: object, where: str = "", parent: Fields | None = None, index: int | None = None) -> None:
        self._key, self._parent, self._index = where, parent, index
        if not isinstance(value, dict):
            raise DocumentError(f"{self.where or 'the document'}: expected an object, got {short_repr(value)}")
        self.document: dict[str, object] = value

    @property
    def where(self) -> str:
        """This object's path in the document: its key under its parent's (and its place in the list there)."""
        base = self._parent.path(self._key) if self._parent is not None else self._key
        return base if self._index is None else f"{base}[{self._index}]"

    def path(self, key: str) -> str:
        where = self.where
        return f"{where}.{key}" if where else key

    def _get(self, key: str, default: object, kinds: tuple[type, ...], expected: str) -> Any:
        value = self.document.get(key, ABSENT)
        if type(value) in kinds:  # the common case, JSON's own types: bool is never taken for an int
            return value
        if value is ABSENT:
            if default is ABSENT:
                raise DocumentError(f"{self.path(key)}: missing")
            return default
        if isinstance(value, kinds) and not isinstance(value, bool):  # a subclass (a StrEnum for a string)
            return value
        raise DocumentError(f"{self.path(key)}: expected {expected}, got {short_repr(value)}")

    def text(self, key: str, default: str = ABSENT) -> str:
        return str(self._get(key, default, (str,), "a string"))

    def maybe_text(self, key: str, default: str | None = ABSENT) -> str | None:
        value: str | None = self._get(key, default, (str, type(None)), "a string or null")
        return value

    def integer(self, key: str) -> int:
        value: int = self._get(key, ABSENT, (int,), "an integer")
        return value

    def maybe_integer(self, key: str) -> int | None:
        value: int | None = self._get(key, ABSENT, (int, type(None)), "an integer or null")
        return value

    def number(self, key: str) -> float:
        return self._finite(key, float(self._get(key, ABSENT, (int, float), "a number")), "a number")

    def maybe_number(self, key: str, default: float | None = ABSENT) -> float | None:
        value = self._get(key, default, (int, float, type(None)), "a number or null")
        return None if value is None else self._finite(key, float(value), "a number or null")

    def _finite(self, key: str, value: float, expected: str) -> float:
        """JSON as Python reads it takes NaN and Infinity: no duration or time fleet reports is either."""
        if not math.isfinite(value):
            raise DocumentError(f"{self.path(key)}: expected {expected}, got {short_repr(value)}")
        return value

    def boolean(self, key: str, default: bool = ABSENT) -> bool:
        return bool(self._get(key, default, (bool,), "true or false"))

    def maybe_boolean(self, key: str) -> bool | None:
        value: bool | None = self._get(key, ABSENT, (bool, type(None)), "true, false or null")
        return value

    def code(self, key: str, kind: type[E]) -> E:
        return self._code(key, self.text(key), kind)

    def maybe_code(self, key: str, kind: type[E]) -> E | None:
        value = self.maybe_text(key)
        return None if value is None else self._code(key, value, kind)

    def _code(self, key: str, value: str, kind: type[E]) -> E:
        try:
            return kind(value)
        except ValueError:
            raise DocumentError(f"{self.path(key)}: {short_repr(value)} is no {kind.__name__} fleet knows") from None

    def items(self, key: str, read: Callable[[Fields], T], default: Sequence[object] = ABSENT) -> tuple[T, ...]:
        """A list of objects, each read by `read`."""
        values: list[object] = self._get(key, default, (list, tuple), "a list")
        return tuple(read(Fields(v, key, self, i)) for i, v in enumerate(values))

    def values(self, key: str, kinds: tuple[type, ...], expected: str,
               default: Sequence[object] | None = ABSENT) -> tuple[Any, ...] | None:
        """A list of plain values (`memory_before_mib`: integers or null), or None when absent and allowed."""
        found: Sequence[object] | None = self._get(key, default, (list, tuple, type(None)), "a list")
        if found is None:
            return None
        for i, value in enumerate(found):
            if type(value) not in kinds and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise DocumentError(f"{self.path(key)}[{i}]: expected {expected}, got {short_repr(value)}")
        return tuple(found)

    def inner(self, key: str) -> Fields | None:
        """An object-valued key that may be absent (or null)."""
        value = self.document.get(key)
        return None if value is None else Fields(value, key, self)


def short_repr(value: object) -> str:
    """A value in an error: short, on one line."""
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def host_from_document(name: str, document: object, where: str = "") -> HostReport:
    """The inverse of `host_to_document` (the host's name is the key it stands under); `where` prefixes the key
    paths of an error (`hosts.gpu-b01`)."""
    fields = Fields(document, where)
    plan = fields.inner("plan")
    by = next((name for name in plugs.SCHEDULERS if name in fields.document), None)  # the record's key: its scheduler
    record = fields.inner(by) if by is not None else None
    return HostReport(
        name=name, status=fields.code("status", HostStatus), duration_s=fields.number("duration_s"),
        error=fields.maybe_text("error"), steps=fields.items("steps", step_from),
        killed=fields.items("killed", killed_from), gpus=fields.items("gpus", gpu_from),
        plan=plan_from(plan) if plan is not None else None,
        scheduler=scheduler_from(record, by) if record is not None else None,
        reason=fields.maybe_code("reason", Reason),
        memory_before_mib=fields.values("memory_before_mib", (int, type(None)), "an integer or null", None),
        health=fields.items("health", host_finding_from, ()), start_s=fields.maybe_number("start_s", None),
        kept=fields.items("kept", kept_from, ()), fabric_manager=fabric_manager_from(fields.inner("fabric_manager")),
        stopped=fields.values("stopped", (str,), "a string", ()) or (),
        restored=fields.values("restored", (str,), "a string", ()) or ())


def run_from_document(document: object) -> RunReport:
    """The whole JSON report (summary.json) back into a run's report."""
    fields = Fields(document)
    hosts = fields.inner("hosts")
    if hosts is None:
        raise DocumentError("hosts: missing")
    found = {name: host_from_document(name, value, hosts.path(name)) for name, value in hosts.document.items()}
    return RunReport(run_id=fields.text("run_id"), command=fields.text("command"), started_at=fields.text("started_at"),
                     duration_s=fields.number("duration_s"), hosts=found,
                     interrupted_by=fields.maybe_text("interrupted_by", None))


def step_from(fields: Fields) -> StepResult:
    return StepResult(name=fields.code("name", StepName), status=fields.code("status", StepStatus),
                      duration_s=fields.number("duration_s"), detail=fields.text("detail"))


def killed_from(fields: Fields) -> KilledProcess:
    return KilledProcess(pid=fields.integer("pid"), name=fields.text("name"), user=fields.text("user"),
                         signal=fields.text("signal"))


def kept_from(fields: Fields) -> KeptProcess:
    return KeptProcess(pid=fields.integer("pid"), name=fields.text("name"), user=fields.text("user"),
                       why=fields.text("why"))


def finding_from(fields: Fields) -> Finding:
    return Finding(fields.text("check"), fields.code("level", Level), fields.text("detail"))


def host_finding_from(fields: Fields) -> HostFinding:
    return HostFinding(check=fields.text("check"), level=fields.code("level", Level), detail=fields.text("detail"),
                       pci=fields.maybe_text("pci", None))


def gpu_from(fields: Fields) -> GpuReport:
    return GpuReport(index=fields.integer("index"), memory_used_mib=fields.maybe_integer("memory_used_mib"),
                     uuid=fields.maybe_text("uuid"),
                     name=fields.maybe_text("name"), memory_total_mib=fields.maybe_integer("memory_total_mib"),
                     settle_s=fields.maybe_number("settle_s"), health=fields.items("health", finding_from),
                     settings=gpu_settings_from(fields.inner("settings")))


def fabric_manager_from(fields: Fields | None) -> FabricManager | None:
    """The node's fabric manager as verify read it (`{"state", "version", "why"}`: a version only when present, a why
    only when not observed); absent or null where it was not read."""
    if fields is None:
        return None
    state, version, why = fields.code("state", FmState), fields.maybe_text("version"), fields.maybe_text("why")
    try:
        return FabricManager(state, version, why)
    except ValueError as exc:
        raise DocumentError(f"{fields.where}: {exc}") from None


def gpu_settings_from(fields: Fields | None) -> GpuSettings | None:
    """A GPU's settings as verify read them (`fleet.model.gpu_facts.GpuSettings`): each key of its type or null;
    absent or null from a fleet that did not read them."""
    if fields is None:
        return None
    read: dict[str, Any] = {f.name: _SETTING_READERS[str(f.type)](fields, f.name)
                            for f in dataclasses.fields(GpuSettings)}
    return GpuSettings(**read)


_SETTING_READERS: dict[str, Callable[[Fields, str], object]] = {
    "str | None": lambda fields, key: fields.maybe_text(key),
    "bool | None": lambda fields, key: fields.maybe_boolean(key),
    "int | None": lambda fields, key: fields.maybe_integer(key),
    "float | None": lambda fields, key: fields.maybe_number(key),
}


def planned_from(fields: Fields) -> PlannedProcess:
    return PlannedProcess(pid=fields.integer("pid"), user=fields.text("user"), name=fields.text("name"),
                          mib=fields.maybe_integer("mib"), kept_because=fields.maybe_text("kept_because"))


def plan_from(fields: Fields) -> HostPlan:
    units = fields.inner("units")
    if units is None:
        raise DocumentError(f"{fields.path('units')}: missing")
    return HostPlan(units=tuple((unit, units.text(unit)) for unit in units.document),
                    would_kill=fields.items("would_kill", planned_from), kept=fields.items("kept", planned_from),
                    gpu_memory_mib=fields.values("gpu_memory_mib", (int, type(None)), "an integer or null") or (),
                    would_restore=fields.values("would_restore", (str,), "a string", ()) or (),
                    with_units=fields.items("with_units", planned_from, ()))


def scheduler_from(fields: Fields, by: str | None = None) -> SchedulerRecord:
    """The scheduler's record: in a document under its scheduler's name (`by`), in the history's column with its
    name as `by` (absent: Slurm's, `ONLY_SCHEDULER_BEFORE`). Every key but `node` may be absent (the empty optional
    ones are not written)."""
    jobs = fields.values("jobs", (str,), "a string", ()) or ()
    return SchedulerRecord(
        node=fields.text("node"), state_before=fields.maybe_text("state_before", None),
                           reason_before=fields.maybe_text("reason_before", None),
        state_after=fields.maybe_text("state_after", None), reason_after=fields.maybe_text("reason_after", None),
                           jobs=jobs,
        plan=fields.maybe_text("plan", None), error=fields.maybe_text("error", None),
                           abandoned=fields.boolean("abandoned", False),
        waited_s=fields.maybe_number("waited_s", None), taken_over=fields.maybe_text("taken_over", None),
        by=by if by is not None else fields.text("by", ONLY_SCHEDULER_BEFORE))


def records_from(values: object, read: Callable[[Fields], T], where: str) -> tuple[T, ...]:
    """A list of objects outside a document (a history column), each read by `read`; `where` names it in an error."""
    return Fields({where: values}).items(where, read)
