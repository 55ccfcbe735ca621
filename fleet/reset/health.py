"""The health gate's policy: which facts from `nvidia-smi -q` and the kernel log fail a host, which warn.

Pure: `judge` turns what the probes in `fleet.node.probes.health` read into `Finding`s per GPU, by the
defaults below (from NVIDIA's documentation) and the host's `HealthPolicy` (`health_warn`,
`health_ignore`). A finding at level `fail` keeps the host from being clean; `warn` is only reported.

Xid times are shown as UTC `HH:MM:SS`: journalctl gives seconds since the epoch, and the node's own time
zone is not known here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.node.probes.health import GpuHealth, Xid, pci_of_bus_id
from fleet.node.probes.parse import LINE_CLIP
from fleet.report.models import Finding, Level
from fleet.transport.base import clip

if TYPE_CHECKING:
    from fleet.inventory.host import Host

__all__ = ["CHECKS", "DEFAULT_LEVEL", "WHY", "XID_ACTION", "XID_NAMES", "Finding", "HealthPolicy", "Level",
           "fails", "judge"]

NODE = ""  # the key of findings on no listed GPU (an Xid whose PCI address matches none)

# Each check, its default level and why (NVIDIA's documents):
# ECC/pages: https://docs.nvidia.com/deploy/dynamic-page-retirement/ ; rows: https://docs.nvidia.com/deploy/
# a100-gpu-mem-error-mgmt/ ; fabric: https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/ ;
# persistence: https://docs.nvidia.com/deploy/driver-persistence/ ; Xids: https://docs.nvidia.com/deploy/
# xid-errors/ (the catalog for Ampere and newer: analyzing-xid-catalog.html).
RULES: tuple[tuple[str, Level, str], ...] = (
    ("ecc_uncorrected", Level.FAIL, "an uncorrectable ECC error since the driver loaded: the GPU's memory "
     "gave wrong data; NVIDIA's page retirement / row remapping needs a reset to take the bad memory out"),
    ("ecc_corrected", Level.WARN, "correctable (single-bit) ECC errors were fixed in flight; worth watching, "
     "no effect on results"),
    ("retired_pending", Level.FAIL, "pages are waiting to be retired (Pending Page Blacklist): they stay in "
     "use until the GPU is reset (dynamic page retirement)"),
    ("remap_pending", Level.FAIL, "a row remapping is pending: the bad row stays in use until the GPU is "
     "reset (A100+ memory error management)"),
    ("remap_failed", Level.FAIL, "a row remapping failed: the bank is out of spare rows, an RMA criterion "
     "(A100+ memory error management)"),
    ("persistence", Level.WARN, "persistence mode off: the driver tears down and re-initialises the GPU "
     "between clients (slower starts, state lost); NVIDIA recommends the persistence daemon"),
    ("fabric", Level.FAIL, "the GPU's NVLink fabric registration is not Completed/Success: CUDA "
     "initialisation fails or runs without NVLink (Fabric Manager user guide)"),
    ("pcie_width", Level.FAIL, "the PCIe link trained narrower than the GPU can do: host transfers run at a "
     "fraction of their speed (a seating, riser or slot fault)"),
    ("xid", Level.FAIL, "an Xid NVIDIA lists as needing a reset, reboot or RMA, or any Xid logged during the "
     "reset; other Xids since boot only warn (Xid errors)"),
)
CHECKS: tuple[str, ...] = tuple(check for check, _, _ in RULES)
DEFAULT_LEVEL: Mapping[str, Level] = {check: level for check, level, _ in RULES}
WHY: Mapping[str, str] = {check: why for check, _, why in RULES}

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

# Fail-level checks, most telling first (`fails`).
_TELLING = ("xid", "remap_failed", "ecc_uncorrected", "remap_pending", "retired_pending", "fabric", "pcie_width",
            "ecc_corrected", "persistence")


@dataclass(frozen=True)
class HealthPolicy:
    """A host's say over the defaults: checks downgraded to warnings, and checks not judged at all."""

    warn: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted((self.warn | self.ignore) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown health check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})")

    @classmethod
    def of(cls, host: Host) -> HealthPolicy:
        """The policy the host variables `health_warn` and `health_ignore` set."""
        return cls(warn=frozenset(host.health_warn), ignore=frozenset(host.health_ignore))

    def level(self, check: str, default: Level) -> Level | None:
        """What a finding of `check` weighs on this host; None when the check is not judged here."""
        if check in self.ignore:
            return None
        return Level.WARN if check in self.warn else default


# --- judging ------------------------------------------------------------------


def judge(gpus: Sequence[GpuHealth], xids: Sequence[Xid], policy: HealthPolicy, *,
          before: Collection[Xid] | None = None) -> dict[str, tuple[Finding, ...]]:
    """Findings by GPU bus id (every GPU listed, clean ones with none), and under "" the Xids on no listed GPU.

    `before`: the Xids the kernel log already held when the reset began; any other is one logged during
    the reset. None (a check, no reset): no Xid counts as logged during a reset.
    """
    by_pci = {pci_of_bus_id(g.bus_id): g.bus_id for g in gpus}
    xids_of: dict[str, list[Xid]] = {}
    for xid in xids:
        xids_of.setdefault(by_pci.get(xid.pci, NODE), []).append(xid)
    earlier = frozenset(before) if before is not None else None
    found = {g.bus_id: _weigh(_gpu_facts(g), policy) + _weigh(_xid_facts(xids_of.get(g.bus_id, []), earlier), policy)
             for g in gpus}
    if xids_of.get(NODE):
        found[NODE] = _weigh(_xid_facts(xids_of[NODE], earlier), policy)
    return found


def fails(findings: Mapping[str, Sequence[Finding]]) -> list[Finding]:
    """The fail-level findings, most telling first (an Xid such as 79 before a PCIe width, say)."""
    failing = [f for found in findings.values() for f in found if f.level is Level.FAIL]
    return sorted(failing, key=lambda f: _TELLING.index(f.check) if f.check in _TELLING else len(_TELLING))


Fact = tuple[str, Level, str]  # (check, default level, detail)


def _weigh(facts: Iterator[Fact], policy: HealthPolicy) -> tuple[Finding, ...]:
    weighed = ((check, policy.level(check, default), detail) for check, default, detail in facts)
    return tuple(Finding(check, level, detail) for check, level, detail in weighed if level is not None)


def _gpu_facts(gpu: GpuHealth) -> Iterator[Fact]:
    for check, read in _GPU_CHECKS:
        detail = read(gpu)
        if detail is not None:
            yield check, DEFAULT_LEVEL[check], detail


def _ecc_uncorrected(gpu: GpuHealth) -> str | None:
    n = gpu.ecc_uncorrected or 0
    return f"{n} uncorrectable ECC error{_s(n)} (volatile)" if n > 0 else None


def _ecc_corrected(gpu: GpuHealth) -> str | None:
    n = gpu.ecc_corrected or 0
    return f"{n} correctable ECC error{_s(n)} (volatile)" if n > 0 else None


def _retired_pending(gpu: GpuHealth) -> str | None:
    return "page retirement pending: reset the GPU to retire the pages" if gpu.retired_pending else None


def _remap_pending(gpu: GpuHealth) -> str | None:
    return "row remapping pending: reset the GPU to apply" if gpu.remap_pending else None


def _remap_failed(gpu: GpuHealth) -> str | None:
    return "row remapping failed: no spare row left in the bank (RMA criterion)" if gpu.remap_failed else None


def _persistence(gpu: GpuHealth) -> str | None:
    return "persistence mode off" if gpu.persistence is False else None


def _fabric(gpu: GpuHealth) -> str | None:
    """Judged only where the GPU has a fabric (State or Status other than N/A)."""
    state, status = gpu.fabric_state, gpu.fabric_status
    if (state is None and status is None) or (state == "Completed" and status == "Success"):
        return None
    return f"fabric state {state or 'N/A'}, status {status or 'N/A'}"


def _pcie_width(gpu: GpuHealth) -> str | None:
    """Width only: an idle GPU lowers its PCIe generation on purpose, never its width."""
    width, widest = gpu.pcie_width, gpu.pcie_width_max
    if width is None or widest is None or width >= widest:
        return None
    return f"PCIe link x{width}, capable of x{widest}"


_GPU_CHECKS: tuple[tuple[str, Callable[[GpuHealth], str | None]], ...] = (
    ("ecc_uncorrected", _ecc_uncorrected),
    ("ecc_corrected", _ecc_corrected),
    ("retired_pending", _retired_pending),
    ("remap_pending", _remap_pending),
    ("remap_failed", _remap_failed),
    ("persistence", _persistence),
    ("fabric", _fabric),
    ("pcie_width", _pcie_width),
)


def _xid_facts(xids: Sequence[Xid], before: frozenset[Xid] | None) -> Iterator[Fact]:
    """One fact per Xid code (and per before/during the reset), in the order first logged."""
    groups: dict[tuple[int, bool], list[Xid]] = {}
    for xid in sorted(xids, key=lambda x: x.at):
        during = before is not None and xid not in before
        groups.setdefault((xid.code, during), []).append(xid)
    for (code, during), same in groups.items():
        level = Level.FAIL if during or code in XID_ACTION else Level.WARN
        yield "xid", level, _xid_detail(same, during)


def _xid_detail(same: Sequence[Xid], during: bool) -> str:
    """`Xid 79 at 11:02:13: GPU has fallen off the bus`, with how often and whether during the reset."""
    first = same[0]
    text = XID_NAMES.get(first.code) or clip(first.detail, LINE_CLIP) or "no description"
    detail = f"Xid {first.code} at {_utc(first.at)}: {text}"
    if len(same) > 1:
        detail += f" ({len(same)} times, last at {_utc(same[-1].at)})"
    return detail + (" during the reset" if during else "")


def _utc(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at))


def _s(n: int) -> str:
    return "" if n == 1 else "s"
