"""The health gate's policy: which facts from `nvidia-smi -q` and the kernel log fail a host, which warn.

Pure: `judge` turns what the probes in `fleet.node.probes.health` and `fleet.node.probes.kernel_log` read into
`Finding`s per GPU and `HostFinding`s for the host (an Xid on a PCI address no listed GPU has; a kernel log that
could not be read), by the table of checks (`fleet.model.health_checks`: each one's default level, from NVIDIA's
documents, how a GPU's fact reads as a finding, how findings rank) and the host's `HealthPolicy` (`health_warn`,
`health_ignore`). A finding at level `fail` keeps the host from being clean; `warn` is only reported.

Xids: one logged before the reset (for `check`: since boot) fails only if NVIDIA answers it with a reset, a reboot
or an RMA (XID_ACTION), unless the same verify's nvidia-smi read shows its condition resolved (XID_RESOLVABLE).
One logged during the reset fails, unless it is an application Xid (XID_APPLICATION) of a process this reset
ended (fleet killed it, or drain stopped it: it held a GPU as the reset began, holds none at verify and is not one
the kill kept: a kept job's process whose step ended on its own was not ended by the reset), by the
pid the line names, or, naming none, on a GPU such a process held: ending a process that holds a GPU makes the
driver log them. A kernel log that could not be read is never "no Xids": it fails (or
warns, with `health_warn: [xid]`) as a host finding.

Xid times are shown as UTC `HH:MM:SS`: journalctl gives seconds since the epoch, and the node's own time
zone is not known here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.model import gpu_profile
from fleet.model.gpu_facts import REMAP_FAILED, REMAP_PENDING, RETIRED_PENDING, GpuHealth, GpuSettings
from fleet.model.gpu_profile import DEFAULT_PROFILE, GpuProfile
from fleet.model.health_checks import by_name, checks, names, unread
from fleet.model.report import Finding, HostFinding, KilledProcess, Level
from fleet.node.probes.kernel_log import Xid, pci_of_bus_id
from fleet.node.probes.parse import LINE_CLIP
from fleet.transport.base import clip

if TYPE_CHECKING:
    from fleet.inventory.host import Host
    from fleet.node.probes.smi import ComputeApp, GpuRow

__all__ = [
    "SETTINGS_CHECK",
    "XID_ACTION",
    "XID_APPLICATION",
    "XID_NAMES",
    "XID_RESOLVABLE",
    "Ended",
    "Finding",
    "HealthPolicy",
    "HostFinding",
    "Judgement",
    "KernelReads",
    "Level",
    "fails",
    "judge",
]

# Short names for well-known Xids, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/).
XID_NAMES: Mapping[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    154: "GPU recovery action changed",
}

# Xids the catalog answers with a GPU reset, a reboot or an RMA (not "restart the application"): these fail
# a host even when they were logged before the reset began.
XID_ACTION = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 154})
# Xids of an application's own doing (the catalog: restart the application), which the driver also logs for a
# process killed while it held a GPU (45: "Preemptive cleanup"; 13, 31, 43 from its channels torn down): logged
# during the reset for a process the reset ended, they only warn.
XID_APPLICATION = frozenset({13, 31, 43, 45})
# Xids in XID_ACTION whose condition nvidia-smi reports as it is now: 63 (a row marked for remapping, or a page
# for retirement: pending until a GPU reset) and 64 (recording it failed). With the row remapper (A100+) read as
# neither pending nor failed, or, without one, no page retirement pending, they only warn, naming both facts. The
# others (uncorrectable ECC, NVLink, the bus, the GSP, recovery actions) leave nothing nvidia-smi shows resolved.
XID_RESOLVABLE = frozenset({63, 64})
SETTINGS_CHECK = "gpu_settings"  # the GPU's settings against the host's profile (`fleet.model.gpu_profile`)
# What a GPU check whose fact nvidia-smi did not give weighs (`health_warn` lowers it, `health_ignore` skips it).
UNREAD = Level.FAIL

@dataclass(frozen=True, kw_only=True)
class HealthPolicy:
    """A host's say over the defaults: checks downgraded to warnings, and checks not judged at all."""

    warn: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    fail: frozenset[str] = frozenset()
    profile: GpuProfile = DEFAULT_PROFILE  # the GPU settings expected (`gpu_settings`)

    def __post_init__(self) -> None:
        known = names()
        unknown = sorted((self.warn | self.ignore | self.fail) - set(known))
        if unknown:
            raise ValueError(f"unknown health check(s) {', '.join(unknown)} (known: {', '.join(known)})")

    @classmethod
    def of(cls, host: Host) -> HealthPolicy:
        """The policy the host variables `health_warn`, `health_fail`, `health_ignore` and `gpu_settings` set."""
        return cls(warn=frozenset(host.health_warn), ignore=frozenset(host.health_ignore),
                   fail=frozenset(host.health_fail), profile=host.gpu_settings)

    def level(self, check: str, default: Level) -> Level | None:
        """What a finding of `check` weighs on this host; None when the check is not judged here. `health_ignore`
        wins over `health_fail`, which wins over `health_warn` (fail closed)."""
        if check in self.ignore:
            return None
        if check in self.fail:
            return Level.FAIL
        return Level.WARN if check in self.warn else default


# --- judging ------------------------------------------------------------------


@dataclass(frozen=True)
class KernelReads:
    """The kernel log as verify has it: the Xids logged before the reset began (`check`: since boot) and those
    logged during it (after the cursor of the read as it began), each an Xid group of `fleet.node.probes.kernel_log`;
    `unread`: why the log, or a part of it, could not be read (never taken for "no Xids")."""

    before: tuple[Xid, ...] = ()
    during: tuple[Xid, ...] = ()
    unread: str | None = None


@dataclass(frozen=True)
class Ended:
    """The processes this reset ended, as a finding names them (`pid 4242 python3, which fleet killed`): those the
    kill step signalled, and those that held a GPU as the reset began (its compute apps then) and hold none at
    verify (drain stopped their unit); and which of them held each GPU (by the PCI address an Xid line names)."""

    names: Mapping[int, str] = field(default_factory=dict)
    on_gpu: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, killed: Sequence[KilledProcess], before: Sequence[ComputeApp] = (), rows: Sequence[GpuRow] = (),
           after: Sequence[ComputeApp] = (), spared: frozenset[int] = frozenset()) -> Ended:
        """`killed` (the kill step's), and `before`'s apps gone from `after` (verify's) but those the kill left alive
        on purpose (`spared`: a kept job's process whose step then ended on its own was not ended by this
        reset), placed on GPUs by `before` (pid -> GPU uuid) and `rows` (uuid -> bus id)."""
        still = {a.pid for a in after} | spared
        names = {a.pid: f"pid {a.pid} {_base(a.process_name)}, which the reset stopped" for a in before
                 if a.pid not in still}
        names |= {k.pid: f"pid {k.pid} {k.name}, which fleet killed" for k in killed}
        pci_of_uuid = {r.uuid: _pci_or_none(r.pci_bus_id) for r in rows if r.uuid}
        on_gpu: dict[str, set[int]] = {}
        for app in before:
            pci = pci_of_uuid.get(app.gpu_uuid or "")
            if app.pid in names and pci is not None:
                on_gpu.setdefault(pci, set()).add(app.pid)
        return cls(names, {pci: tuple(sorted(pids)) for pci, pids in on_gpu.items()})


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """What the health gate found: by GPU bus id (every GPU listed, clean ones with none), on PCI addresses no
    listed GPU has (`host`), and whether the kernel log could not be read (`unread`, a host finding too)."""

    gpus: Mapping[str, Sequence[Finding]]
    host: tuple[HostFinding, ...] = ()
    unread: HostFinding | None = None
    unread_why: str | None = None  # why the kernel log could not be read (`unread`'s detail says it too)
    settings: Mapping[str, GpuSettings] = field(default_factory=dict)  # by bus id: what the same reads said

    @property
    def host_findings(self) -> tuple[HostFinding, ...]:
        """Every finding on the host rather than a GPU: the report's host `health`."""
        return (*self.host, *([] if self.unread is None else [self.unread]))


def judge(gpus: Sequence[GpuHealth], kernel: KernelReads, policy: HealthPolicy, *,
          ended: Ended | None = None, refused: Mapping[str, Sequence[str]] | None = None,
          said: Sequence[GpuSettings] | None = None) -> Judgement:
    """Every GPU's facts and every Xid weighed (see the module); an Xid on no listed GPU is the host's, its PCI
    address named. `refused`: the `--restore-settings` changes the driver refused, by bus id: each a `gpu_settings`
    failure whatever the host's `health_warn`, `health_ignore` or `health_fail` say (the operator asked for them).
    `said`: each GPU's settings, in `gpus`' order, where the caller has them already (else read from `gpus`)."""
    by_pci = {pci_of_bus_id(g.bus_id): g for g in gpus}
    said = GpuSettings.of_each(gpus) if said is None else said
    profiled = _profiled(policy.profile, said)
    found = {g.bus_id: _weigh(_gpu_facts(g, lines), policy) for g, lines in zip(gpus, profiled, strict=True)}
    for bus_id, lines in (refused or {}).items():  # asked for and not taken: a failure whatever the host's policy
        found.setdefault(bus_id, []).extend(Finding(SETTINGS_CHECK, Level.FAIL, line) for line in lines)
    host: list[HostFinding] = []
    for pci, fact in _xid_facts(kernel, by_pci, ended or Ended()):
        owner = by_pci.get(pci)
        for finding in _weigh([fact], policy):
            if owner is not None:
                found[owner.bus_id].append(finding)
            else:
                host.append(HostFinding(check=finding.check, level=finding.level, detail=finding.detail, pci=pci))
    level = policy.level("xid", by_name("xid").default) if kernel.unread is not None else None
    unread = None if level is None else HostFinding(check="xid", level=level,
                                                    detail=f"cannot read the kernel log ({kernel.unread})")
    return Judgement(gpus={bus: tuple(f) for bus, f in found.items()}, host=tuple(host), unread=unread,
                     unread_why=kernel.unread)


def fails(findings: Judgement | Mapping[str, Sequence[Finding]]) -> list[Finding | HostFinding]:
    """The fail-level findings, GPUs' and the host's Xids (not the unread log), most telling first (an Xid such as
    79 before a PCIe width, say)."""
    gpus = findings.gpus if isinstance(findings, Judgement) else findings
    host: Sequence[Finding | HostFinding] = findings.host if isinstance(findings, Judgement) else ()
    failing = [f for found in [*gpus.values(), host] for f in found if f.level is Level.FAIL]
    return sorted(failing, key=lambda f: by_name(f.check).rank)


Fact = tuple[str, Level, str]  # (check, default level, detail)


def _weigh(facts: Iterable[Fact], policy: HealthPolicy) -> list[Finding]:
    weighed = []
    for check, default, detail in facts:
        level = policy.level(check, default)
        if level is not None:
            weighed.append(Finding(check, level, detail))
    return weighed


def _profiled(profile: GpuProfile, said: Sequence[GpuSettings]) -> list[tuple[str, ...]]:
    """Each GPU's settings against the profile (`gpu_profile.findings`); a GPU whose settings are those of the GPU
    before it (nearly every GPU of a node: one model, driver and set of settings) has that GPU's lines, not worked
    out again (the two compared as their attributes' dicts, in C: the fields a dataclass compares)."""
    lines: list[tuple[str, ...]] = []
    for before, settings in zip([None, *said], said, strict=False):  # each with the one before it (None: the first)
        same = before is not None and vars(before) == vars(settings)
        lines.append(lines[-1] if same else gpu_profile.findings(profile, settings))
    return lines


def _gpu_facts(gpu: GpuHealth, profiled: tuple[str, ...]) -> list[Fact]:
    """Each GPU check's finding on these facts, in the table's order; a check whose fact was not observed (an
    NVML error note in its field) fails, whatever its default: unread is never "fine". The GPU's settings against
    the profile (`gpu_settings`, their lines `profiled`): one finding per difference, a setting not said is "not
    observed" at the check's level."""
    facts: list[Fact] = []
    for check in checks():
        missing = unread(check, gpu) if gpu.unread else None
        if missing is not None:
            facts.append((check.name, UNREAD, missing))
        elif check.finding is not None:
            detail = check.finding(gpu)
            if detail is not None:
                facts.append((check.name, check.default, detail))
        if check.name == SETTINGS_CHECK:
            facts += [(check.name, check.default, line) for line in profiled]
    return facts


@dataclass(frozen=True)
class _XidFact:
    """How one Xid group weighs: its level, and what the detail adds (whose process, what resolved it)."""

    level: Level
    note: str = ""


def _xid_facts(kernel: KernelReads, by_pci: Mapping[str, GpuHealth], ended: Ended) -> Iterator[tuple[str, Fact]]:
    """One fact per PCI address, Xid code, before/during the reset and weight, in the order first logged."""
    groups: dict[tuple[str, int, bool, _XidFact], list[Xid]] = {}
    timed = [(x, False) for x in kernel.before] + [(x, True) for x in kernel.during]
    for xid, during in sorted(timed, key=lambda pair: (pair[0].at, pair[1])):
        weight = _xid_weight(xid, during, by_pci.get(xid.pci), ended)
        groups.setdefault((xid.pci, xid.code, during, weight), []).append(xid)
    for (pci, _, during, weight), same in groups.items():
        yield pci, ("xid", weight.level, _xid_detail(same, during) + weight.note)


def _xid_weight(xid: Xid, during: bool, gpu: GpuHealth | None, ended: Ended) -> _XidFact:
    """Before the reset: fail when NVIDIA answers it with a reset, reboot or RMA. During it: fail, but an
    application Xid of a process the reset ended. Either way, a resolvable one nvidia-smi shows resolved warns."""
    resolved = _resolved(xid.code, gpu)
    if resolved is not None:
        return _XidFact(Level.WARN, f"; resolved: {resolved}")
    if not during:
        return _XidFact(Level.FAIL if xid.code in XID_ACTION else Level.WARN)
    if xid.code in XID_APPLICATION and xid.pid is not None and xid.pid in ended.names:
        return _XidFact(Level.WARN, f": {ended.names[xid.pid]}")
    # naming no process: on a GPU only processes the reset ended held, it warns; a folded group (more pids than the
    # read keeps apart) names none either, but its pids are unknown, a kept job's among them maybe: it fails
    holders = ended.on_gpu.get(xid.pci, ()) if xid.code in XID_APPLICATION and xid.pid is None \
        and not xid.folded else ()
    if holders:
        return _XidFact(Level.WARN, f", naming no process, on the GPU of {'; '.join(ended.names[p] for p in holders)}")
    return _XidFact(Level.FAIL)


def _resolved(code: int, gpu: GpuHealth | None) -> str | None:
    """What nvidia-smi says now that shows a resolvable Xid's condition over; None when it does not (or cannot)."""
    if code not in XID_RESOLVABLE or gpu is None:
        return None
    if gpu[REMAP_PENDING] is False and gpu[REMAP_FAILED] is False:
        return "no row remapping pending or failed now (nvidia-smi -q)"
    if gpu[REMAP_PENDING] is None and gpu[REMAP_FAILED] is None and gpu[RETIRED_PENDING] is False:
        return "no page retirement pending now (nvidia-smi -q)"
    return None


def _xid_detail(same: Sequence[Xid], during: bool) -> str:
    """`Xid 79 at 11:02:13: GPU has fallen off the bus`, with how often and whether during the reset."""
    first, count = same[0], sum(x.count for x in same)
    text = XID_NAMES.get(first.code) or clip(first.detail, LINE_CLIP) or "no description"
    detail = f"Xid {first.code} at {_utc(first.at)}: {text}"
    if count > 1:
        detail += f" ({count} times, last at {_utc(max(x.last for x in same))})"
    return detail + (" during the reset" if during else "")


def _base(path: str) -> str:
    """A compute app's process name as the report names a process: `/usr/bin/python3` -> `python3`."""
    return path.rsplit("/", 1)[-1] or path


def _pci_or_none(bus_id: str | None) -> str | None:
    try:
        return pci_of_bus_id(bus_id) if bus_id else None
    except ValueError:
        return None


def _utc(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at))
