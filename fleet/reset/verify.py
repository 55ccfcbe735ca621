"""verify: the proof. Clean only when the GPUs, the compute apps and the holder scan all say so.

Asks the node, in one command (a batch, `Node.batch`): one GPU query (count, memory, ECC, MIG mode), one
compute-apps query, the health gate's reads and one holder scan (`fleet.reset.holders`; a scan that could not
see every process fails verify, never passes it); holders it finds are then described in one more. Decides
(pure, below): the problems that keep the node from being clean, most telling first: a GPU count that
differs from `gpus`, memory over the GPU's allowance (`fleet.reset.settle.Allowance`: the threshold, the
MIG one on a MIG GPU, plus what processes fleet keeps on purpose hold), a compute app still running that
fleet would kill, an unprotected process still holding a device file, or one kept only because its lineage
could not be read to its end (nobody can say whose it is). Processes fleet keeps as part of the machine
(protected, such as the MPS server) are reported with what they hold, and never make a node unclean by
themselves.
Reports: per GPU its memory (`gpus[]`), and the first problem as the host's error. `fleet check` runs
this step alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.errors import StepFailed
from fleet.inventory.host import Host
from fleet.node.budget import Budget
from fleet.node.node import Answers, Node
from fleet.node.probe import Probe
from fleet.node.probes import health, procs, smi
from fleet.node.probes.parse import ProbeParseError
from fleet.report.models import (
    Finding,
    GpuReport,
    Level,
    Reason,
    StepName,
    StepOutcome,
    StepResult,
    StepStatus,
    Verdict,
    line_of,
)
from fleet.reset.health import HealthPolicy, judge
from fleet.reset.holders import scan_holders
from fleet.reset.protection import Holder
from fleet.reset.settle import Allowance, first_of

# Commands verify may run, at most: its one batch (GPU query, compute apps, the health gate's reads, the holder
# scan), the holders' description, and the scan's own second looks.
VERIFY_COMMANDS = 9


async def verify(node: Node, settle_s: Mapping[int, float] | None = None,
                 xids_before: Collection[health.Xid] | None = None) -> StepOutcome:
    """One GPU query, one compute-apps query, one holder scan and the health gate, all in one command (the
    holders found are then described); clean only if all say so.

    `xids_before`: the Xids the kernel log held when the reset began (None for `check`: no reset ran).
    """
    started, host = time.monotonic(), node.host
    budget = Budget(0.0, slack=VERIFY_COMMANDS * host.command_timeout)
    gpu_probe, apps_probe = smi.gpu_query(host.nvidia_smi, smi.VERIFY_FIELDS), smi.compute_apps(host.nvidia_smi)
    scan_probe, reads = procs.holder_scan(host.devices), HealthReads.of(host)
    answers = await node.batch([gpu_probe, apps_probe, *reads.probes, scan_probe], step=StepName.VERIFY,
                               budget=budget)
    rows, apps = answers.read(gpu_probe), answers.read(apps_probe)
    findings = await reads.findings(node, answers, budget, xids_before)
    judged = await scan_holders(node, StepName.VERIFY, budget, looked=answers.result(scan_probe))
    kept = {h.pid for h in judged if h.part_of_the_machine}
    holders = [h for h in judged if h.protected_by is None]
    unplaced = [h for h in judged if h.lineage_unread]  # kept, but nobody can say whose: never clean
    kept_apps = [a for a in apps if a.pid in kept]
    apps = tuple(a for a in apps if a.pid not in kept)
    gpus = gpu_reports(rows, settle_s or {}, findings)
    verdict = verify_verdict(rows, apps, host.gpus, Allowance.of(host, kept_apps), [*holders, *unplaced],
                             findings)
    reason, error = verdict if verdict else (None, None)
    detail = describe_verify(rows, apps, holders) + describe_kept(kept_apps) + describe_health(rows, findings)
    status = StepStatus.FAILED if error else StepStatus.OK
    return StepOutcome(StepResult.since(StepName.VERIFY, started, detail, status, error, reason), gpus=gpus)


def _app_label(app: smi.ComputeApp) -> str:
    return f"pid {app.pid} {os.path.basename(app.process_name) or app.process_name}"


def verify_problems(
    rows: Sequence[smi.GpuRow],
    apps: Sequence[smi.ComputeApp],
    expected: int | None,
    allowance: Allowance,
    holders: Sequence[Holder] = (),
    findings: Mapping[str, Sequence[Finding]] | None = None,
) -> list[tuple[Reason, str]]:
    """Everything that keeps a node from being clean, most telling first, each with its reason."""
    problems: list[tuple[Reason, str]] = []
    if expected is not None and len(rows) != expected:
        problems.append((Reason.GPU_MISSING, f"expected {expected} GPUs, nvidia-smi lists {len(rows)}"))
    problems += [(Reason.HEALTH, f"{_where(rows, bus_id)}{f.detail}") for bus_id, found in (findings or {}).items()
                 for f in found if f.level is Level.FAIL]
    by_uuid = {r.uuid: r.index for r in rows if r.uuid}
    for row in rows:
        problem = allowance.problem(row)
        if problem:
            on_gpu = [a for a in apps if a.gpu_uuid == row.uuid]
            who = f" ({', '.join(_app_label(a) for a in on_gpu)})" if on_gpu else ""
            problems.append((Reason.MEMORY_HELD, problem + who))
    for app in apps:
        index = by_uuid.get(app.gpu_uuid) if app.gpu_uuid else None
        where = f"gpu {index}" if index is not None else "a GPU"
        problems.append((Reason.HOLDERS_LEFT, f"{_app_label(app)} still runs on {where}"))
    named = {a.pid for a in apps}
    for holder in holders:
        if holder.pid not in named:
            why = f" ({holder.protected_by})" if holder.protected_by else ""
            problems.append((Reason.HOLDERS_LEFT, f"{holder.label()} still holds {', '.join(holder.devices)}{why}"))
    return problems


def verify_verdict(
    rows: Sequence[smi.GpuRow],
    apps: Sequence[smi.ComputeApp],
    expected: int | None,
    allowance: Allowance,
    holders: Sequence[Holder] = (),
    findings: Mapping[str, Sequence[Finding]] | None = None,
) -> Verdict | None:
    """The first problem's reason and line (and how many more), or None when the node is clean. `apps` and
    `holders` are those fleet would kill; what kept processes hold is in the allowance."""
    problems = verify_problems(rows, apps, expected, allowance, holders, findings)
    if not rows and not problems:
        problems.append((Reason.GPU_MISSING, "nvidia-smi listed no GPUs"))
    return (problems[0][0], first_of([text for _, text in problems])) if problems else None


verify_error = line_of(verify_verdict)


def describe_verify(
    rows: Sequence[smi.GpuRow], apps: Sequence[smi.ComputeApp], holders: Sequence[Holder] = ()
) -> str:
    used = [r.memory_used_mib for r in rows if r.memory_used_mib is not None]
    peak = f", max {max(used)} MiB used" if used else ""
    ecc = [r for r in rows if r.ecc_uncorrected]
    ecc_note = f", uncorrected ECC errors on gpu {', '.join(str(r.index) for r in ecc)}" if ecc else ""
    return f"{len(rows)} GPUs{peak}, {len(apps)} compute apps, {len(holders)} unprotected holders{ecc_note}"


def describe_kept(kept_apps: Sequence[smi.ComputeApp]) -> str:
    """`; kept pid 77 nvidia-cuda-mps-server (300 MiB)`: what processes fleet keeps on purpose hold."""
    if not kept_apps:
        return ""
    return "; kept " + ", ".join(f"{_app_label(a)} ({a.used_mib or 0} MiB)" for a in kept_apps)


def gpu_reports(rows: Sequence[smi.GpuRow], settle_s: Mapping[int, float],
                findings: Mapping[str, Sequence[Finding]] | None = None) -> tuple[GpuReport, ...]:
    found = findings or {}
    return tuple(
        GpuReport(
            index=r.index, memory_used_mib=r.memory_used_mib, uuid=r.uuid, name=r.name,
            memory_total_mib=r.memory_total_mib, settle_s=settle_s.get(r.index),
            health=tuple(found.get(r.pci_bus_id or "", ())),
        )
        for r in rows
    )


# --- the health gate ----------------------------------------------------------


@dataclass(frozen=True)
class HealthReads:
    """The health gate's reads: nvidia-smi's health fields and row remapper (`nvidia-smi -q` instead, on a driver
    that does not know a field), and (unless `xid` is ignored) the kernel log's Xids."""

    facts: Probe[tuple[health.GpuHealth, ...] | None]
    remaps: Probe[tuple[health.GpuHealth, ...]]
    xids: Probe[tuple[health.Xid, ...]] | None

    @classmethod
    def of(cls, host: Host) -> HealthReads:
        xids = None if "xid" in host.health_ignore else health.xids()
        return cls(health.facts(host.nvidia_smi), health.remaps(host.nvidia_smi), xids)

    @property
    def probes(self) -> list[Probe[Any]]:
        return [self.facts, self.remaps, *([] if self.xids is None else [self.xids])]

    async def findings(self, node: Node, answers: Answers, budget: Budget,
                       xids_before: Collection[health.Xid] | None) -> dict[str, tuple[Finding, ...]]:
        """What they found, judged by the host's policy; findings by GPU bus id ("" for an Xid on no listed GPU)."""
        policy = HealthPolicy.of(node.host)
        gpus = await self._gpus(node, answers, budget)
        xids = () if self.xids is None or "xid" in policy.ignore else answers.read(self.xids)
        return judge(gpus, xids, policy, before=xids_before)

    async def _gpus(self, node: Node, answers: Answers, budget: Budget) -> tuple[health.GpuHealth, ...]:
        """Each GPU's health facts: the fields and the row remapper joined; the whole `-q` (one more command) on a
        driver whose `--query-gpu` lacks a field or whose `-q -d` refused ROW_REMAPPER. A hang, unreadable
        output or two reads that list other GPUs fail verify; they never fall back to "no facts"."""
        facts = answers.read(self.facts)
        if facts is health.FIELDS_UNKNOWN:
            node.log.info("health_fields_unknown", step=str(StepName.VERIFY), fallback="nvidia-smi -q")
            return await node.ask(health.health(node.host.nvidia_smi), step=StepName.VERIFY, budget=budget)
        try:
            remapper = answers.result(self.remaps)
        except StepFailed as exc:
            if exc.status is StepStatus.TIMEOUT:
                raise
            node.log.info("row_remapper_unread", step=str(StepName.VERIFY), error=str(exc), fallback="nvidia-smi -q")
            return await node.ask(health.health(node.host.nvidia_smi), step=StepName.VERIFY, budget=budget)
        try:
            return health.joined(facts, self.remaps.read(remapper))
        except ProbeParseError as exc:
            raise StepFailed(self.remaps.unreadable(exc)) from exc


def _where(rows: Sequence[smi.GpuRow], bus_id: str) -> str:
    index = next((r.index for r in rows if r.pci_bus_id == bus_id), None)
    return f"gpu {index}: " if index is not None else ("" if not bus_id else f"{bus_id}: ")


def describe_health(rows: Sequence[smi.GpuRow], findings: Mapping[str, Sequence[Finding]]) -> str:
    """`; health: gpu 0 persistence mode off (warn)`: every finding, folded into one line."""
    parts = [f"{_where(rows, bus_id)}{f.detail} ({f.level})" for bus_id, found in findings.items() for f in found]
    return "; health: " + ", ".join(parts) if parts else ""
