"""The health gate's checks, one row each: the only place a check is declared.

A `Check` is a check's name (a finding's `check`, and what the host variables `health_warn` and `health_ignore`
name), its default level and why (from NVIDIA's documents, below), how a failing finding of it ranks among a
host's, and, for a fact of one GPU, how that fact reads as a finding. What it reads is the rows of the table of GPU
facts (`fleet.model.gpu_facts`) that name it. From the table come the names the inventory accepts
(`fleet.inventory.host`), the policy (`fleet.reset.health_gate`: defaults, levels, ranking) and the health gate's
table in docs/operating.md (a test compares them row for row).

Adding an nvidia-smi check: its fact's row in `fleet.model.gpu_facts.FIELDS` (the field, -q path, reader, the
healthy simulated value) and its row here (level, why, rank, the finding); docs/architecture.md says the rest.

A leaf of the model: it imports only `fleet.model.outcomes` and `fleet.model.gpu_facts`, so the inventory, the
node and the reset all read it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fleet.model import gpu_facts
from fleet.model.gpu_facts import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    FABRIC_STATE,
    FABRIC_STATUS,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    PERSISTENCE,
    REMAP_FAILED,
    REMAP_PENDING,
    RETIRED_PENDING,
    Field,
    GpuHealth,
)
from fleet.model.outcomes import Level

__all__ = ["TABLE", "Check", "by_name", "checks", "names", "registered", "unread"]


@dataclass(frozen=True, kw_only=True)
class Check:
    """One health check: a row of docs/operating.md's table of the health gate."""

    name: str
    default: Level  # what a finding weighs unless the host's `health_warn` / `health_ignore` says otherwise
    why: str  # the table's "why": what a finding means, and the document it rests on
    rank: int  # how a failing finding ranks among a host's (1: the most telling; `fleet.reset.health_gate.fails`)
    # A GPU fact's detail (None: nothing to report) from the GPU's health facts; None for a check the policy
    # reads elsewhere (`xid`: the kernel log, `fleet.reset.health_gate`).
    finding: Callable[[GpuHealth], str | None] | None = None
    source: str | None = None  # what it reads when that is no GPU fact (`xid`: the kernel log)

    @property
    def reads(self) -> str:
        """The table's "read from": the nvidia-smi fields of the facts that feed it (or its `source`)."""
        if self.source is not None:
            return self.source
        return ", ".join(_read_from(f) for f in gpu_facts.current() if f.check == self.name)


def _read_from(fact: Field[Any]) -> str:
    if fact.display is None:
        return f"`{fact.query}`"
    return f"`-q -d {fact.display}`: `{fact.q[0][-1]}`"


def _ecc_uncorrected(gpu: GpuHealth) -> str | None:
    n = gpu[ECC_UNCORRECTED] or 0
    return f"{n} uncorrectable ECC error{_s(n)} (volatile)" if n > 0 else None


def _ecc_corrected(gpu: GpuHealth) -> str | None:
    n = gpu[ECC_CORRECTED] or 0
    return f"{n} correctable ECC error{_s(n)} (volatile)" if n > 0 else None


def _retired_pending(gpu: GpuHealth) -> str | None:
    return "page retirement pending: reset the GPU to retire the pages" if gpu[RETIRED_PENDING] else None


def _remap_pending(gpu: GpuHealth) -> str | None:
    return "row remapping pending: reset the GPU to apply" if gpu[REMAP_PENDING] else None


def _remap_failed(gpu: GpuHealth) -> str | None:
    return "row remapping failed: no spare row left in the bank (RMA criterion)" if gpu[REMAP_FAILED] else None


def _persistence(gpu: GpuHealth) -> str | None:
    return "persistence mode off" if gpu[PERSISTENCE] is False else None


def _fabric(gpu: GpuHealth) -> str | None:
    """Judged only where the GPU has a fabric (State or Status other than N/A)."""
    state, status = gpu[FABRIC_STATE], gpu[FABRIC_STATUS]
    if (state is None and status is None) or (state == "Completed" and status == "Success"):
        return None
    return f"fabric state {state or 'N/A'}, status {status or 'N/A'}"


def _pcie_width(gpu: GpuHealth) -> str | None:
    """Width only: an idle GPU lowers its PCIe generation on purpose, never its width."""
    width, widest = gpu[PCIE_WIDTH], gpu[PCIE_WIDTH_MAX]
    if width is None or widest is None or width >= widest:
        return None
    return f"PCIe link x{width}, capable of x{widest}"


def unread(check: Check, gpu: GpuHealth) -> str | None:
    """The finding of a check whose fact nvidia-smi did not give (`GpuHealth.unread`): the field and what was
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
    Check(name="ecc_uncorrected", default=Level.FAIL, rank=3, finding=_ecc_uncorrected,
          why="an uncorrectable ECC error since the driver loaded: the GPU's memory gave wrong data; NVIDIA's page "
              "retirement / row remapping needs a reset to take the bad memory out"),
    Check(name="ecc_corrected", default=Level.WARN, rank=8, finding=_ecc_corrected,
          why="correctable (single-bit) ECC errors were fixed in flight; worth watching, no effect on results"),
    Check(name="retired_pending", default=Level.FAIL, rank=5, finding=_retired_pending,
          why="pages are waiting to be retired (Pending Page Blacklist): they stay in use until the GPU is reset "
              "(dynamic page retirement)"),
    Check(name="remap_pending", default=Level.FAIL, rank=4, finding=_remap_pending,
          why="a row remapping is pending: the bad row stays in use until the GPU is reset (A100+ memory error "
              "management)"),
    Check(name="remap_failed", default=Level.FAIL, rank=2, finding=_remap_failed,
          why="a row remapping failed: the bank is out of spare rows, an RMA criterion (A100+ memory error "
              "management)"),
    Check(name="persistence", default=Level.WARN, rank=9, finding=_persistence,
          why="persistence mode off: the driver tears down and re-initialises the GPU between clients (slower "
              "starts, state lost); NVIDIA recommends the persistence daemon"),
    Check(name="fabric", default=Level.FAIL, rank=6, finding=_fabric,
          why="the GPU's NVLink fabric registration is not Completed/Success: CUDA initialisation fails or runs "
              "without NVLink (Fabric Manager user guide)"),
    Check(name="pcie_width", default=Level.FAIL, rank=7, finding=_pcie_width,
          why="the PCIe link trained narrower than the GPU can do: host transfers run at a fraction of their speed "
              "(a seating, riser or slot fault)"),
    Check(name="gpu_settings", default=Level.WARN, rank=10,
          source="verify's nvidia-smi reads, against `gpu_settings` (below)",
          why="a GPU setting a last user may leave behind is not the host's `gpu_settings` profile (locked or "
              "application clocks, a lowered power limit, compute mode, MIG, ECC mode): the next benchmark runs "
              "differently on that GPU; `--restore-settings` restores it"),
    Check(name="xid", default=Level.FAIL, rank=1, source="the kernel log (`journalctl -k -b`, below)",
          why="an Xid NVIDIA lists as needing a reset, reboot or RMA, or any Xid logged during the reset but an "
              "application's of a process the reset ended; other Xids since boot only warn (Xid errors); a kernel "
              "log fleet could not read fails too"),
)
_current: list[tuple[Check, ...]] = [TABLE]


def checks() -> tuple[Check, ...]:
    """The checks as they are now: `TABLE` and any `registered` (a test's, a plug's), in the table's order."""
    return _current[0]


def names() -> tuple[str, ...]:
    return tuple(check.name for check in checks())


def by_name(name: str) -> Check:
    """The check of that name; KeyError when there is none."""
    found = next((check for check in checks() if check.name == name), None)
    if found is None:
        raise KeyError(name)
    return found


@contextmanager
def registered(check: Check, *facts: Field[Any]) -> Iterator[None]:
    """The health gate with `check` added (after the others), and the GPU facts it reads, while the block runs."""
    if check.name in names():
        raise ValueError(f"already a health check: {check.name}")
    before = _current[0]
    with gpu_facts.registered(*facts):
        _current[0] = (*before, check)
        try:
            yield
        finally:
            _current[0] = before
