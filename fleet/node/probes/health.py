"""GPU health facts for verify's health gate: nvidia-smi's health fields and row remapper.

* `facts` + `remaps`: what verify reads on every driver that knows the fields (captures of 535 and 590):
  one `--query-gpu` of the health fields (persistence, volatile ECC totals, pending page retirement, fabric
  state and status, PCIe generation and width: about 100 bytes a GPU) and `nvidia-smi -q -d ROW_REMAPPER`
  (the row remapper's section only: about 400 bytes a GPU), joined by bus id into one `GpuHealth` each.
  About 4 KB for 8 GPUs, where `-q` is 150 KB. `remapped_rows.*` are not asked of `--query-gpu`: 535's
  does not know them, and one unknown field fails the whole query. A driver whose `--query-gpu` does not
  know a health field (`Field "fabric.state" is not a valid field to query.`, exit 2: before ~525) reads
  as `FIELDS_UNKNOWN`, and verify reads the full `-q` instead (below), never nothing.
* `health`: one `nvidia-smi -q` for every GPU, read into a `GpuHealth` per `GPU 00000000:83:00.0`
  section: persistence mode, volatile ECC counts, pending page retirement, row remapping, the fabric
  (NVLink/NVSwitch) registration, and the PCIe link. The text differs by driver and GPU: ECC counts are
  `SRAM/DRAM ...` on Ampere and newer (`SRAM Uncorrectable` before driver ~535 split it into `Parity`
  and `SEC-DED`) and `Single Bit` / `Double Bit` ... `Total` on Volta and older; `Remapped Rows` is one
  `: N/A` line where the GPU has no row remapper, and `Fabric` is missing before driver ~525. A value
  or section that is missing, `N/A` or a note (`[N/A]`, `Unknown Error`, `Not Supported`) reads as None.
The kernel log's Xid events are `fleet.node.probes.kernel_log`'s.

Section names are matched without regard to case (`Ecc Mode` on older drivers, `ECC Mode` on newer).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from fleet.node.probe import Probe
from fleet.node.probes.parse import ProbeParseError, lines, parse_int
from fleet.node.probes.smi import SMI_HANG, classify_smi_failure, field_value
from fleet.transport.base import CommandResult

# Notes nvidia-smi -q prints without brackets where a value is not there; read as None.
NOTES = frozenset({"Unknown Error", "Not Supported", "Not Available", "Insufficient Permissions",
                   "Requested functionality has been deprecated", "GPU is lost"})

# What -q prints, unindented, for a GPU it cannot read (the others' sections may follow).
_UNREADABLE_GPU = ("Unable to determine the device handle", "GPU is lost", "fallen off the bus")

# `-q`'s indentation step.
INDENT = 4

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_KEY_VALUE = re.compile(r"(\S[^:]*?)\s*:(.*)")
_BANNER = re.compile(r"=+NVSMI LOG=+")
_WIDTH = re.compile(r"(\d+)x")

# Where each fact is in a GPU section: paths of lowercased section names and key.
_PERSISTENCE = ("persistence mode",)
_ECC_VOLATILE = ("ecc errors", "volatile")
_CORRECTED = tuple((*_ECC_VOLATILE, *key) for key in (("sram correctable",), ("dram correctable",),
                                                         ("single bit", "total")))
_UNCORRECTED = tuple((*_ECC_VOLATILE, *key) for key in (("sram uncorrectable",), ("sram uncorrectable parity",),
                                                           ("sram uncorrectable sec-ded",), ("dram uncorrectable",),
                                                           ("double bit", "total")))
_RETIRED = ("retired pages",)
_REMAP_PENDING = ("remapped rows", "pending")
_REMAP_FAILED = ("remapped rows", "remapping failure occurred")
_FABRIC_STATE = ("fabric", "state")
_FABRIC_STATUS = ("fabric", "status")
_LINK = ("pci", "gpu link info")
_GEN = (*_LINK, "pcie generation", "current")
_GEN_MAX = (*_LINK, "pcie generation", "max")
_WIDTH_PATH = (*_LINK, "link width", "current")
_WIDTH_MAX = (*_LINK, "link width", "max")

Path = tuple[str, ...]


@dataclass(frozen=True)
class GpuHealth:
    """What one GPU's `nvidia-smi -q` section says about its health; None where the driver did not say."""

    bus_id: str                     # as -q prints it: "00000000:83:00.0"
    persistence: bool | None        # Persistence Mode: Enabled / Disabled
    ecc_corrected: int | None       # volatile correctable: SRAM + DRAM Correctable, or Single Bit Total
    ecc_uncorrected: int | None     # volatile uncorrectable: SRAM (Parity + SEC-DED) + DRAM, or Double Bit Total
    retired_pending: bool | None    # Retired Pages: Pending Page Blacklist (or Retirement): Yes
    remap_pending: bool | None      # Remapped Rows: Pending: Yes
    remap_failed: bool | None       # Remapped Rows: Remapping Failure Occurred: Yes
    fabric_state: str | None        # Fabric: State ("Completed", "In Progress", "Not Started", ...)
    fabric_status: str | None       # Fabric: Status ("Success", or the error)
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None          # Link Width Current ("16x" -> 16)
    pcie_width_max: int | None


class _Value(NamedTuple):
    """One value as printed, with its line for an error message. A tuple, and read (`text`) only when asked
    for: a GPU's section prints about a dozen, and a few are asked."""

    lineno: int
    line: str
    raw: str

    @property
    def text(self) -> str | None:
        """The value; None for N/A or a note."""
        return _present(self.raw)


# --- nvidia-smi -q ------------------------------------------------------------


def health_argv(nvidia_smi: str) -> list[str]:
    """One `nvidia-smi -q` answers for every GPU."""
    return [nvidia_smi, "-q"]


def parse_health(text: str) -> tuple[GpuHealth, ...]:
    """One `GpuHealth` per `GPU <bus id>` section of `nvidia-smi -q`, in order."""
    return tuple(_gpu_health(bus_id, values) for bus_id, values in _sections(text))


def parse_all_health(text: str) -> tuple[GpuHealth, ...]:
    """`parse_health`, and the banner's `Attached GPUs : N` must match the sections that follow: output cut
    short (a transport's bound, a tool that died mid-way) is never read as fewer GPUs to judge."""
    found = parse_health(text)
    attached = next(((n, line) for n, line in lines(text) if line.startswith("Attached GPUs")), None)
    if attached is not None:
        said = attached[1].partition(":")[2].strip()
        if said.isdigit() and int(said) != len(found):
            raise ProbeParseError(*attached, f"{said} GPUs attached, {len(found)} GPU sections follow (output cut?)")
    return found


def _sections(text: str) -> Iterator[tuple[str, dict[Path, _Value]]]:
    bus_id: str | None = None
    values: dict[Path, _Value] = {}
    stack: list[str] = []
    seen: set[str] = set()
    for lineno, line in lines(text):
        if not line[0].isspace():
            if bus_id is not None:
                yield bus_id, values
            bus_id, values, stack = _top_level(lineno, line, bus_id, seen), {}, []
        elif bus_id is None:
            raise ProbeParseError(lineno, line, "indented line before the first GPU section")
        else:
            _section_line(lineno, line, stack, values)
    if bus_id is not None:
        yield bus_id, values


def _top_level(lineno: int, line: str, bus_id: str | None, seen: set[str]) -> str | None:
    """An unindented line: a GPU section's header, or (before the first one) the banner and `Key : value`."""
    header = _GPU_HEADER.fullmatch(line.rstrip())
    if header is not None:
        if header.group(1) in seen:
            raise ProbeParseError(lineno, line, "GPU listed twice")
        seen.add(header.group(1))
        return header.group(1)
    if line.startswith("GPU "):
        raise ProbeParseError(lineno, line, "GPU section header without a PCI bus id")
    if any(needle in line for needle in _UNREADABLE_GPU):
        raise ProbeParseError(lineno, line, "nvidia-smi names a GPU it cannot read")
    if bus_id is None and (_BANNER.fullmatch(line.strip()) or _KEY_VALUE.fullmatch(line)):
        return None
    raise ProbeParseError(lineno, line, "expected a 'GPU <bus id>' section header")


def _section_line(lineno: int, line: str, stack: list[str], values: dict[Path, _Value]) -> None:
    """A line inside a GPU section: a `Key : value`, or the header of a nested section."""
    indent = len(line) - len(line.lstrip(" "))
    depth, rest = divmod(indent, INDENT)
    if rest or depth == 0 or depth > len(stack) + 1:
        raise ProbeParseError(lineno, line, f"unexpected indentation ({indent} spaces)")
    del stack[depth - 1:]
    text = line.strip()
    colon = text.find(":", 1)  # `_KEY_VALUE`: the key is what precedes the first colon after the first character
    if colon < 0:
        stack.append(text.lower())
        return
    name = text[:colon].rstrip().lower()
    values[(*stack, name)] = _Value(lineno, line, text[colon + 1:])
    stack.append(name)  # a key may have lines under it too (`Process ID : 25384` > `Type : C`)


def _present(raw: str) -> str | None:
    value = field_value(raw)
    return None if value is None or value in NOTES else value


def _gpu_health(bus_id: str, values: Mapping[Path, _Value]) -> GpuHealth:
    return GpuHealth(
        bus_id=bus_id,
        persistence=_switch(values.get(_PERSISTENCE), on="Enabled", off="Disabled"),
        ecc_corrected=_total(values, _CORRECTED),
        ecc_uncorrected=_total(values, _UNCORRECTED),
        retired_pending=_switch(_retired_pending(values), on="Yes", off="No"),
        remap_pending=_switch(values.get(_REMAP_PENDING), on="Yes", off="No"),
        remap_failed=_switch(values.get(_REMAP_FAILED), on="Yes", off="No"),
        fabric_state=_text(values.get(_FABRIC_STATE)),
        fabric_status=_text(values.get(_FABRIC_STATUS)),
        pcie_gen=_number(values.get(_GEN), "PCIe generation"),
        pcie_gen_max=_number(values.get(_GEN_MAX), "PCIe generation"),
        pcie_width=_width(values.get(_WIDTH_PATH)),
        pcie_width_max=_width(values.get(_WIDTH_MAX)),
    )


def _text(value: _Value | None) -> str | None:
    return None if value is None else value.text


def _switch(value: _Value | None, *, on: str, off: str) -> bool | None:
    text = None if value is None else value.text
    if value is None or text is None:
        return None
    if text not in (on, off):
        raise ProbeParseError(value.lineno, value.line, f"expected {on!r} or {off!r}")
    return text == on


def _number(value: _Value | None, what: str) -> int | None:
    text = None if value is None else value.text
    if value is None or text is None:
        return None
    return parse_int(text, value.lineno, value.line, what)


def _width(value: _Value | None) -> int | None:
    text = None if value is None else value.text
    if value is None or text is None:
        return None
    match = _WIDTH.fullmatch(text)
    if match is None:
        raise ProbeParseError(value.lineno, value.line, "PCIe link width is not like '16x'")
    return int(match.group(1))


def _total(values: Mapping[Path, _Value], keys: tuple[Path, ...]) -> int | None:
    """The sum of the volatile ECC counters `keys` this driver prints; None when it prints none."""
    counts = [_number(values.get(key), "ECC error count") for key in keys]
    present = [n for n in counts if n is not None]
    return sum(present) if present else None


def _retired_pending(values: Mapping[Path, _Value]) -> _Value | None:
    """`Pending Page Blacklist` (most drivers) or `Pending Page Retirement` (newer ones) under Retired Pages."""
    return next((v for path, v in values.items()
                 if len(path) == 2 and path[0] == _RETIRED[0] and path[1].startswith("pending")), None)


# --- --query-gpu's health fields and -q -d ROW_REMAPPER ------------------------------------------------------

# The fields, in the order `_fact_row` reads them.
HEALTH_FIELDS = (
    "pci.bus_id", "persistence_mode", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "fabric.state", "fabric.status", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.width.current", "pcie.link.width.max",
)
# What `facts` reads when the driver does not know one of the fields: read `-q` instead.
FIELDS_UNKNOWN = None
_UNKNOWN_FIELD = re.compile(r'Field "[^"]+" is not a valid field to query\.')


def facts_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, f"--query-gpu={','.join(HEALTH_FIELDS)}", "--format=csv,noheader,nounits"]


def parse_facts(text: str) -> tuple[GpuHealth, ...] | None:
    """One `GpuHealth` a CSV row (its row remapper unknown: `remaps` says it); FIELDS_UNKNOWN when nvidia-smi
    says it does not know a field. A row with too few or too many values is unreadable, never a GPU less."""
    if _UNKNOWN_FIELD.search(text):
        return FIELDS_UNKNOWN
    rows = [_fact_row(lineno, line) for lineno, line in lines(text)]
    if not rows:
        raise ProbeParseError(1, text[:80], "no GPU listed")
    return tuple(rows)


def _fact_row(lineno: int, line: str) -> GpuHealth:
    cells = [part.strip() for part in line.split(",")]
    if len(cells) != len(HEALTH_FIELDS):
        raise ProbeParseError(lineno, line, f"{len(cells)} values, {len(HEALTH_FIELDS)} fields asked (output cut?)")
    values = [_Value(lineno, line, cell) for cell in cells]
    bus, persistence, corrected, uncorrected, retired, state, status, gen, gen_max, width, width_max = values
    if bus.text is None or not _BUS_ID.fullmatch(bus.text):
        raise ProbeParseError(lineno, line, "no PCI bus id")
    return GpuHealth(
        bus_id=bus.text, persistence=_switch(persistence, on="Enabled", off="Disabled"),
        ecc_corrected=_number(corrected, "ECC error count"), ecc_uncorrected=_number(uncorrected, "ECC error count"),
        retired_pending=_switch(retired, on="Yes", off="No"), remap_pending=None, remap_failed=None,
        fabric_state=state.text, fabric_status=status.text,
        pcie_gen=_number(gen, "PCIe generation"), pcie_gen_max=_number(gen_max, "PCIe generation"),
        pcie_width=_number(width, "PCIe link width"), pcie_width_max=_number(width_max, "PCIe link width"),
    )


def remaps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "-q", "-d", "ROW_REMAPPER"]


def joined(facts: tuple[GpuHealth, ...], remaps: tuple[GpuHealth, ...]) -> tuple[GpuHealth, ...]:
    """Each GPU's facts with its row remapper's state; the two reads must list the same GPUs (by bus id)."""
    by_bus = {r.bus_id.upper(): r for r in remaps}
    if set(by_bus) != {f.bus_id.upper() for f in facts}:
        raise ProbeParseError(1, "", f"--query-gpu and -q -d ROW_REMAPPER list other GPUs ({len(facts)} and "
                                     f"{len(remaps)}; output cut?)")
    return tuple(replace(f, remap_pending=by_bus[f.bus_id.upper()].remap_pending,
                         remap_failed=by_bus[f.bus_id.upper()].remap_failed) for f in facts)


# --- the probes -------------------------------------------------------------


def _explain(result: CommandResult) -> str:
    return classify_smi_failure(result.exit_status, result.stdout, result.stderr)


def facts(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...] | None]:
    """Exit 2 is an answer only with nvidia-smi's "not a valid field" line (FIELDS_UNKNOWN); any other exit
    2 is unreadable output, not a missing field."""
    return Probe(tuple(facts_argv(nvidia_smi)), "nvidia-smi --query-gpu", parse_facts,
                 ok_exits=frozenset({0, 2}), reads="nvidia-smi health fields", hang=SMI_HANG, explain=_explain,
                 driver=True)


def remaps(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(tuple(remaps_argv(nvidia_smi)), "nvidia-smi -q -d ROW_REMAPPER", parse_all_health,
                 reads="nvidia-smi -q -d ROW_REMAPPER output", hang=SMI_HANG, explain=_explain,
                 driver=True)


def health(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(tuple(health_argv(nvidia_smi)), "nvidia-smi -q", parse_all_health, reads="nvidia-smi -q output",
                 hang=SMI_HANG, explain=_explain, driver=True)
