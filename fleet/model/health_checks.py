"""The health gate's checks, one row each: the only place a check is declared.

A `Check` is a check's name (a finding's `check`, and what the host variables `health_warn` and `health_ignore`
name), its default level and why (from NVIDIA's documents, below), what it reads, how a failing finding of it
ranks among a host's, and, for a fact of one GPU, how that fact reads as a finding. From the table come the
names the inventory accepts (`fleet.inventory.host`), the policy (`fleet.reset.health_gate`: defaults, levels,
ranking) and the health gate's table in docs/operating.md (a test compares them row for row).

Adding a check: a row here (with, for a GPU fact, the function that reads it into a finding's detail); the
parser that reads the fact into `GpuHealth` (`fleet.node.probes.health`, from `--query-gpu` and `-q` both); and
the fact on the simulated GPU (`fleet.sim.nvidia_smi.Gpu`, printed by both, and set by `fleet.sim.node.NodeSpec`).

A leaf of the model: it imports only `fleet.model.outcomes`, and reads a GPU's facts through `GpuFacts` (what
`fleet.node.probes.health.GpuHealth` is), so the inventory, the node and the reset all read it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleet.model.outcomes import Level

__all__ = ["BY_NAME", "NAMES", "TABLE", "Check", "GpuFacts", "UnreadFact", "unread"]


class UnreadFact(Protocol):
    """A fact nvidia-smi printed an error note for instead of a value (`fleet.node.probes.health.Unread`)."""

    @property
    def check(self) -> str: ...
    @property
    def field(self) -> str: ...
    @property
    def note(self) -> str: ...


class GpuFacts(Protocol):
    """The facts of one GPU the checks read (`fleet.node.probes.health.GpuHealth` has them); None: not said."""

    @property
    def persistence(self) -> bool | None: ...
    @property
    def ecc_corrected(self) -> int | None: ...
    @property
    def ecc_uncorrected(self) -> int | None: ...
    @property
    def retired_pending(self) -> bool | None: ...
    @property
    def remap_pending(self) -> bool | None: ...
    @property
    def remap_failed(self) -> bool | None: ...
    @property
    def fabric_state(self) -> str | None: ...
    @property
    def fabric_status(self) -> str | None: ...
    @property
    def pcie_width(self) -> int | None: ...
    @property
    def pcie_width_max(self) -> int | None: ...
    @property
    def unread(self) -> Sequence[UnreadFact]: ...


@dataclass(frozen=True)
class Check:
    """One health check: a row of docs/operating.md's table of the health gate."""

    name: str
    default: Level  # what a finding weighs unless the host's `health_warn` / `health_ignore` says otherwise
    why: str  # the table's "why": what a finding means, and the document it rests on
    reads: str  # the table's "read from": the nvidia-smi fields (or the log) the fact comes from
    rank: int  # how a failing finding ranks among a host's (1: the most telling; `fleet.reset.health_gate.fails`)
    # A GPU fact's detail (None: nothing to report) from the GPU's health facts; None for a check the policy
    # reads elsewhere (`xid`: the kernel log, `fleet.reset.health_gate`).
    finding: Callable[[GpuFacts], str | None] | None = None


def _ecc_uncorrected(gpu: GpuFacts) -> str | None:
    n = gpu.ecc_uncorrected or 0
    return f"{n} uncorrectable ECC error{_s(n)} (volatile)" if n > 0 else None


def _ecc_corrected(gpu: GpuFacts) -> str | None:
    n = gpu.ecc_corrected or 0
    return f"{n} correctable ECC error{_s(n)} (volatile)" if n > 0 else None


def _retired_pending(gpu: GpuFacts) -> str | None:
    return "page retirement pending: reset the GPU to retire the pages" if gpu.retired_pending else None


def _remap_pending(gpu: GpuFacts) -> str | None:
    return "row remapping pending: reset the GPU to apply" if gpu.remap_pending else None


def _remap_failed(gpu: GpuFacts) -> str | None:
    return "row remapping failed: no spare row left in the bank (RMA criterion)" if gpu.remap_failed else None


def _persistence(gpu: GpuFacts) -> str | None:
    return "persistence mode off" if gpu.persistence is False else None


def _fabric(gpu: GpuFacts) -> str | None:
    """Judged only where the GPU has a fabric (State or Status other than N/A)."""
    state, status = gpu.fabric_state, gpu.fabric_status
    if (state is None and status is None) or (state == "Completed" and status == "Success"):
        return None
    return f"fabric state {state or 'N/A'}, status {status or 'N/A'}"


def _pcie_width(gpu: GpuFacts) -> str | None:
    """Width only: an idle GPU lowers its PCIe generation on purpose, never its width."""
    width, widest = gpu.pcie_width, gpu.pcie_width_max
    if width is None or widest is None or width >= widest:
        return None
    return f"PCIe link x{width}, capable of x{widest}"


def unread(check: Check, gpu: GpuFacts) -> str | None:
    """The finding of a check whose fact nvidia-smi did not give (`GpuFacts.unread`): the field and what was
    printed instead, and how to skip the check; None when every field it reads was read."""
    notes = [f"{u.field} not observed (nvidia-smi printed {u.note})" for u in gpu.unread if u.check == check.name]
    if not notes:
        return None
    return f"{'; '.join(notes)}: set health_ignore: [{check.name}] to skip the check"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# The checks in the table's order (docs/operating.md), each with its default level and why (NVIDIA's documents):
# ECC/pages: https://docs.nvidia.com/deploy/dynamic-page-retirement/ ; rows: https://docs.nvidia.com/deploy/
# a100-gpu-mem-error-mgmt/ ; fabric: https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/ ;
# persistence: https://docs.nvidia.com/deploy/driver-persistence/ ; Xids: https://docs.nvidia.com/deploy/
# xid-errors/ (the catalog for Ampere and newer: analyzing-xid-catalog.html).
TABLE: tuple[Check, ...] = (
    Check("ecc_uncorrected", Level.FAIL, "an uncorrectable ECC error since the driver loaded: the GPU's memory "
          "gave wrong data; NVIDIA's page retirement / row remapping needs a reset to take the bad memory out",
          "`ecc.errors.uncorrected.volatile.total`", 3, _ecc_uncorrected),
    Check("ecc_corrected", Level.WARN, "correctable (single-bit) ECC errors were fixed in flight; worth watching, "
          "no effect on results", "`ecc.errors.corrected.volatile.total`", 8, _ecc_corrected),
    Check("retired_pending", Level.FAIL, "pages are waiting to be retired (Pending Page Blacklist): they stay in "
          "use until the GPU is reset (dynamic page retirement)", "`retired_pages.pending`", 5, _retired_pending),
    Check("remap_pending", Level.FAIL, "a row remapping is pending: the bad row stays in use until the GPU is "
          "reset (A100+ memory error management)", "`-q -d ROW_REMAPPER`: `Pending`", 4, _remap_pending),
    Check("remap_failed", Level.FAIL, "a row remapping failed: the bank is out of spare rows, an RMA criterion "
          "(A100+ memory error management)", "`-q -d ROW_REMAPPER`: `Remapping Failure Occurred`", 2,
          _remap_failed),
    Check("persistence", Level.WARN, "persistence mode off: the driver tears down and re-initialises the GPU "
          "between clients (slower starts, state lost); NVIDIA recommends the persistence daemon",
          "`persistence_mode`", 9, _persistence),
    Check("fabric", Level.FAIL, "the GPU's NVLink fabric registration is not Completed/Success: CUDA "
          "initialisation fails or runs without NVLink (Fabric Manager user guide)",
          "`fabric.state`, `fabric.status`", 6, _fabric),
    Check("pcie_width", Level.FAIL, "the PCIe link trained narrower than the GPU can do: host transfers run at a "
          "fraction of their speed (a seating, riser or slot fault)",
          "`pcie.link.width.current`, `pcie.link.width.max`", 7, _pcie_width),
    Check("xid", Level.FAIL, "an Xid NVIDIA lists as needing a reset, reboot or RMA, or any Xid logged during the "
          "reset but an application's of a process the reset ended; other Xids since boot only warn (Xid errors); a "
          "kernel log fleet could not read fails too", "the kernel log (`journalctl -k -b`, below)", 1),
)
NAMES: tuple[str, ...] = tuple(check.name for check in TABLE)
BY_NAME: Mapping[str, Check] = {check.name: check for check in TABLE}
