"""verify: the proof. Clean only when the GPUs, the compute apps and the holder scan all say so.

Asks the node, in one command (a batch, `Node.batch`): one GPU query (count, memory, ECC, MIG mode), one
compute-apps query, the health gate's reads, one holder scan (`fleet.reset.holders`; a scan that could not
see every process fails verify, never passes it) and, last, the fabric manager's version (reported, never
judged here: `fleet.node.probes.fabricmanager`); holders it finds are then described in one more. Decides
(pure, below): the problems that keep the node from being clean, most telling first: a GPU count that
differs from `gpus`, memory over the GPU's allowance (`fleet.reset.settle.Allowance`: the threshold, the
MIG one on a MIG GPU, plus what processes fleet keeps on purpose hold), a compute app still running that
fleet would kill, an unprotected process still holding a device file, or one kept only because its lineage
could not be read to its end (nobody can say whose it is). Processes fleet keeps as part of the machine
(protected, such as the MPS server) are reported with what they hold, and never make a node unclean by
themselves.
Reports: per GPU its memory and health (`gpus[]`), the health findings on no listed GPU (`health`: an Xid on
another PCI address, a kernel log that could not be read), and the first problem as the host's error. `fleet check`
runs this step alone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    KilledProcess,
    Level,
    Reason,
    StepName,
    StepOutcome,
    StepResult,
    StepStatus,
    Verdict,
    line_of,
)
from fleet.node.bounds import commands_s
from fleet.node.budget import Room, TimeBudget
from fleet.node.node import Answers, Node
from fleet.node.probe import Probe
from fleet.node.probes import fabricmanager, health, kernel_log, procs, smi
from fleet.node.probes.parse import ProbeParseError
from fleet.reset.health_gate import SETTINGS_CHECK, Ended, HealthPolicy, Judgement, KernelReads, judge
from fleet.reset.holders import scan_holders
from fleet.reset.protection import Holder
from fleet.reset.settle import Allowance, first_of

# Commands verify may run, at most: its one batch (GPU query, compute apps, the health gate's reads, the holder
# scan, the fabric manager's version), the holders' description, and the scan's own second looks.
VERIFY_COMMANDS = 10
# Of its batch's sections, the nvidia-smi reads (GPU query, compute apps, health fields, row remapper) and the `-q`
# that replaces the last two on an older driver: each has nvidia-smi's bound on top of the commands' room.
VERIFY_SMI = 5


def room(host: Host) -> Room:
    """Verify's commands, each at its bound (nothing to wait for)."""
    return Room(0.0, commands_s(host, smi=VERIFY_SMI, other=VERIFY_COMMANDS))


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """The node as a reset began (read with drain's first batch): the kernel log read to its end (its Xids, and the
    cursor verify reads on from), or why it could not be; and the compute apps then (which GPU each process held)."""

    log: kernel_log.KernelLog | None = None
    unread: str | None = None
    apps: tuple[smi.ComputeApp, ...] = ()
    jobs: frozenset[int] = frozenset()  # the apps that were a job's processes: never ended by the reset


async def verify(node: Node, settle_s: Mapping[int, float] | None = None, baseline: Baseline | None = None,
                 killed: Sequence[KilledProcess] = (), spared: frozenset[int] = frozenset(),
                 refused: Mapping[int, Sequence[str]] | None = None) -> StepOutcome:
    """One GPU query, one compute-apps query, one holder scan and the health gate, all in one command (the
    holders found are then described); clean only if all say so.

    `baseline`: the node as the reset began (None for `check`: no reset ran, the kernel log is read since boot);
    `killed`: the processes the reset killed (their application Xids during the reset only warn, as those of the
    processes that held a GPU as it began and hold none now, but the kill's `spared`: those it kept on purpose);
    `refused`: `--restore-settings`' changes the driver refused, by GPU index (each a `gpu_settings` finding).
    """
    started, host = time.monotonic(), node.host
    budget = room(host).start()
    gpu_probe, apps_probe = smi.gpu_query(host.nvidia_smi, smi.VERIFY_FIELDS), smi.compute_apps(host.nvidia_smi)
    scan_probe, reads, fm_probe = procs.holder_scan(host.devices), HealthReads.of(host, baseline), fabricmanager.probe()
    # The fabric manager's version last: a hang of it ends only itself (it is then not observed, never a failure).
    answers = await node.batch([gpu_probe, apps_probe, *reads.probes, scan_probe, *reads.last, fm_probe],
                               step=StepName.VERIFY, budget=budget)
    rows, apps = answers.read(gpu_probe), answers.read(apps_probe)
    by_index = {r.index: r.pci_bus_id or "" for r in rows}
    findings = await reads.findings(node, answers, budget, baseline,
                                    Ended.of(killed, baseline.apps if baseline else (), rows, apps,
                                             spared | (baseline.jobs if baseline else frozenset())),
                                    {by_index.get(i, ""): tuple(lines) for i, lines in (refused or {}).items()})
    judged = await scan_holders(node, StepName.VERIFY, budget, looked=answers.result(scan_probe))
    kept = {h.pid for h in judged if h.part_of_the_machine}
    holders = [h for h in judged if h.protected_by is None]
    unplaced = [h for h in judged if h.lineage_unread]  # kept, but nobody can say whose: never clean
    kept_apps = [a for a in apps if a.pid in kept]
    apps = tuple(a for a in apps if a.pid not in kept)
    gpus = gpu_reports(rows, settle_s or {}, findings.gpus, findings.settings)
    verdict = verify_verdict(rows, apps, host.gpus, Allowance.of(host, kept_apps), [*holders, *unplaced],
                             findings, host=host.name)
    reason, error = verdict if verdict else (None, None)
    detail = describe_verify(rows, apps, holders) + describe_kept(kept_apps) + describe_health(rows, findings)
    status = StepStatus.FAILED if error else StepStatus.OK
    return StepOutcome(result=StepResult.since(StepName.VERIFY, started, detail, status, error, reason), gpus=gpus,
                       health=findings.host_findings, fabric_manager=fabricmanager.observed(answers, fm_probe))


def _app_label(app: smi.ComputeApp) -> str:
    return f"pid {app.pid} {os.path.basename(app.process_name) or app.process_name}"


Findings = Judgement | Mapping[str, Sequence[Finding]]  # a judgement, or GPU findings alone by bus id


def verify_problems(
    rows: Sequence[smi.GpuRow],
    apps: Sequence[smi.ComputeApp],
    expected: int | None,
    allowance: Allowance,
    holders: Sequence[Holder] = (),
    findings: Findings | None = None,
    *,
    host: str = "the node",
) -> list[tuple[Reason, str]]:
    """Everything that keeps a node from being clean, most telling first, each with its reason."""
    problems: list[tuple[Reason, str]] = []
    if expected is not None and len(rows) != expected:
        problems.append((Reason.GPU_MISSING, f"expected {expected} GPUs, nvidia-smi lists {len(rows)}"))
    judged = findings if isinstance(findings, Judgement) else Judgement(gpus=findings or {})
    problems += [(_reason(f), f"{_where(rows, bus_id)}{f.detail}") for bus_id, found in judged.gpus.items()
                 for f in found if f.level is Level.FAIL]
    problems += [(Reason.HEALTH, f"{_on_pci(f)}{f.detail}") for f in judged.host if f.level is Level.FAIL]
    if judged.unread is not None and judged.unread.level is Level.FAIL:
        problems.append((Reason.KERNEL_LOG, f"cannot read the kernel log on {host} ({judged.unread_why}): "
                                            "set health_ignore: [xid] to skip the Xid check"))
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
    findings: Findings | None = None,
    *,
    host: str = "the node",
) -> Verdict | None:
    """The first problem's reason and line (and how many more), or None when the node is clean. `apps` and
    `holders` are those fleet would kill; what kept processes hold is in the allowance."""
    problems = verify_problems(rows, apps, expected, allowance, holders, findings, host=host)
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
                findings: Mapping[str, Sequence[Finding]] | None = None,
                settings: Mapping[str, GpuSettings] | None = None) -> tuple[GpuReport, ...]:
    found, said = findings or {}, settings or {}
    return tuple(
        GpuReport(index=r.index, memory_used_mib=r.memory_used_mib, uuid=r.uuid, name=r.name,
                  memory_total_mib=r.memory_total_mib, settle_s=settle_s.get(r.index),
                  health=tuple(found.get(r.pci_bus_id or "", ())), settings=said.get(r.pci_bus_id or ""))
        for r in rows
    )


# --- the health gate ----------------------------------------------------------


@dataclass(frozen=True)
class HealthReads:
    """The health gate's reads: nvidia-smi's health fields and row remapper (`nvidia-smi -q` instead, on a driver
    that does not know a field), and (unless `xid` is ignored) the kernel log: since boot for a check (or when the
    read as the reset began failed), else what was logged after that read's cursor (during the reset)."""

    facts: Probe[tuple[health.GpuHealth, ...] | None]
    remaps: Probe[tuple[health.GpuHealth, ...]]
    kernel: Probe[str] | None

    @classmethod
    def of(cls, host: Host, baseline: Baseline | None = None) -> HealthReads:
        cursor = baseline.log.cursor if baseline is not None and baseline.log is not None else None
        kernel = None if "xid" in host.health_ignore else kernel_log.read(cursor)
        return cls(health.facts(host.nvidia_smi), health.remaps(host.nvidia_smi), kernel)

    @property
    def probes(self) -> list[Probe[Any]]:
        return [self.facts, self.remaps]

    @property
    def last(self) -> list[Probe[Any]]:
        """The kernel-log read, last in its batch: a journalctl that hangs (and so ends the batch) spoils no other
        read."""
        return [] if self.kernel is None else [self.kernel]

    async def findings(self, node: Node, answers: Answers, budget: TimeBudget, baseline: Baseline | None,
                       ended: Ended, refused: Mapping[str, Sequence[str]] | None = None) -> Judgement:
        """What they found, judged by the host's policy (with the restores the driver refused, by bus id)."""
        policy = HealthPolicy.of(node.host)
        gpus = await self._gpus(node, answers, budget)
        kernel = KernelReads() if self.kernel is None else self._kernel(answers, self.kernel, baseline)
        said = GpuSettings.of_each(gpus)
        judged = judge(gpus, kernel, policy, ended=ended, refused=refused, said=said)
        return dataclasses.replace(judged, settings={g.bus_id: s for g, s in zip(gpus, said, strict=True)})

    @staticmethod
    def _kernel(answers: Answers, probe: Probe[str], baseline: Baseline | None) -> KernelReads:
        """The Xids before and during the reset, and why the log (or a part of it) was not read, if it was not."""
        got = read_kernel_log(answers, probe)
        log, why = (got, None) if isinstance(got, kernel_log.KernelLog) else (None, got)
        if baseline is None:  # a check: the read is since boot
            return KernelReads(before=log.xids if log else (), unread=why)
        if baseline.log is None:  # the read as the reset began failed: verify's was since boot
            told = why if why == baseline.unread else \
                f"as the reset began: {baseline.unread}" + (f"; at verify: {why}" if why else "")
            return KernelReads(before=log.xids if log else (), unread=told)
        return KernelReads(before=baseline.log.xids, during=log.xids if log else (),
                           unread=None if why is None else f"at verify: {why}")

    async def _gpus(self, node: Node, answers: Answers, budget: TimeBudget) -> tuple[health.GpuHealth, ...]:
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
            return health.merge_remaps(facts, self.remaps.read(remapper))
        except ProbeParseError as exc:
            raise StepFailed(self.remaps.unreadable(exc)) from exc


def read_kernel_log(answers: Answers, probe: Probe[str]) -> kernel_log.KernelLog | str:
    """The kernel-log read of a batch, or why it was not read to its end (a hang, a failed journalctl, output cut)."""
    try:
        return kernel_log.reading(answers.result(probe))
    except StepFailed as exc:
        return str(exc)
    except kernel_log.KernelLogUnread as exc:
        return exc.why


def _where(rows: Sequence[smi.GpuRow], bus_id: str) -> str:
    index = next((r.index for r in rows if r.pci_bus_id == bus_id), None)
    return f"gpu {index}: " if index is not None else ("" if not bus_id else f"{bus_id}: ")


def _reason(finding: Finding) -> Reason:
    return Reason.GPU_SETTINGS if finding.check == SETTINGS_CHECK else Reason.HEALTH


def _on_pci(finding: HostFinding) -> str:
    return f"PCI {finding.pci} (no listed GPU): " if finding.pci else ""


def describe_health(rows: Sequence[smi.GpuRow], findings: Findings) -> str:
    """`; health: gpu 0 persistence mode off (warn)`: every finding, folded into one line."""
    judged = findings if isinstance(findings, Judgement) else Judgement(gpus=findings)
    parts = [f"{_where(rows, bus_id)}{f.detail} ({f.level})" for bus_id, found in judged.gpus.items() for f in found]
    parts += [f"{_on_pci(f)}{f.detail} ({f.level})" for f in judged.host_findings]
    return "; health: " + ", ".join(parts) if parts else ""
