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
  or section that is missing, `N/A` or `Not Supported` (bracketed or not) reads as None: not applicable.
* Unread is not absent: where nvidia-smi prints one of NVML's error strings instead of a value (`[Unknown
  Error]`, `[GPU is lost]`, `Insufficient Permissions`, ...: `NVML_ERRORS`, or any other bracketed note) in an
  ECC, retired-pages, row-remapper or fabric field, the fact was not observed: it reads as None and the GPU's
  `unread` names the check, the field and the note (the health gate fails that check).
The kernel log's Xid events are `fleet.node.probes.kernel_log`'s.

Section names are matched without regard to case (`Ecc Mode` on older drivers, `ECC Mode` on newer).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from fleet.node.probe import Probe
from fleet.node.probes.parse import ProbeParseError, lines, parse_int
from fleet.node.probes.smi import SMI_HANG, classify_smi_failure
from fleet.transport.base import CommandResult

# What nvidia-smi prints for a value that does not apply to this GPU (bare in -q, `[N/A]` / `[Not Supported]` in
# --query-gpu; the captures in tests/fixtures/nvidia-smi): no page retirement on a GPU with a row remapper, no
# fabric without NVSwitch. The fact is absent: nothing to judge.
NOT_APPLICABLE = frozenset({"", "N/A", "Not Supported"})
# NVML's error strings (nvmlErrorString, as the NVML headers and bindings spell them), which nvidia-smi prints in
# place of a value it asked for and did not get: bare in -q, bracketed in --query-gpu (any bracketed note counts
# too), and `Not Available`, which older -q output prints. The fact was not observed: never read as "fine".
NVML_ERRORS = frozenset({
    "Unknown Error", "GPU is lost", "Insufficient Permissions", "Not Available", "Timeout", "GPU requires reset",
    "GPU requires restart", "Corrupted infoROM", "Corrupted InfoROM", "Driver Not Loaded", "Uninitialized",
    "Invalid Argument", "Not Found", "Function Not Found", "Insufficient Memory", "No data", "In use by another client",
    "Interrupt Request Issue", "IRQ Issue", "Requested functionality has been deprecated", "Deprecated", "Not Ready",
    "GPU not found", "Invalid state", "The operating system has blocked the request",
})

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
_CORRECTED = (("sram correctable",), ("dram correctable",), ("single bit", "total"))
_UNCORRECTED = (("sram uncorrectable",), ("sram uncorrectable parity",), ("sram uncorrectable sec-ded",),
                ("dram uncorrectable",), ("double bit", "total"))
_RETIRED = ("retired pages",)
_REMAP_PENDING = ("remapped rows", "pending")
_REMAP_FAILED = ("remapped rows", "remapping failure occurred")
_FABRIC_STATE = ("fabric", "state")
_FABRIC_STATUS = ("fabric", "status")
_LINK = ("pci", "gpu link info")
_GEN = (*_LINK, "pcie generation")
_WIDTH_PATH = (*_LINK, "link width")

Path = tuple[str, ...]

# The checks (`fleet.model.health_checks`) each --query-gpu health field, and each -q fact's path, is read for: a
# note in one of them (`NVML_ERRORS`) leaves that check's fact unread.
_REMAP_CHECKS = ("remap_pending", "remap_failed")
_FIELD_CHECKS = {
    "ecc.errors.corrected.volatile.total": "ecc_corrected", "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected",
    "retired_pages.pending": "retired_pending", "fabric.state": "fabric", "fabric.status": "fabric",
}
_PATH_CHECKS: tuple[tuple[Path, str], ...] = (
    *(((*_ECC_VOLATILE, *key), "ecc_corrected") for key in _CORRECTED),
    *(((*_ECC_VOLATILE, *key), "ecc_uncorrected") for key in _UNCORRECTED),
    ((*_RETIRED, "pending"), "retired_pending"),
    (_REMAP_PENDING, "remap_pending"), (_REMAP_FAILED, "remap_failed"),
    (_FABRIC_STATE, "fabric"), (_FABRIC_STATUS, "fabric"),
)


@dataclass(frozen=True)
class Unread:
    """A health fact nvidia-smi did not give: the check it is read for, the field (as --query-gpu names it, or
    -q's key path) and what nvidia-smi printed instead (`[Unknown Error]`)."""

    check: str
    field: str
    note: str


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
    unread: tuple[Unread, ...] = ()  # the facts nvidia-smi printed an error note for: not observed, never "fine"


@dataclass(frozen=True)
class _Value:
    lineno: int
    line: str
    text: str | None  # None: not applicable, or a note
    note: str | None = None  # the NVML error note printed instead of the value (not observed)
    label: str = ""  # the field as the report names it: --query-gpu's name, or -q's key path


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
    pair = _KEY_VALUE.fullmatch(line.strip())
    name = line.strip() if pair is None else pair.group(1)
    if pair is not None:
        path = tuple(part.lower() for part in (*stack, name))
        values[path] = _Value(lineno, line, *_reading(pair.group(2)), label=" / ".join((*stack, name)))
    stack.append(name)  # a key may have lines under it too (`Process ID : 25384` > `Type : C`)


def _reading(raw: str) -> tuple[str | None, str | None]:
    """(the value, None); (None, None) where it does not apply; (None, the note) where nvidia-smi printed an
    error note instead (`NVML_ERRORS`, or any bracketed note but `[N/A]` and `[Not Supported]`)."""
    value = raw.strip()
    bracketed = value.startswith("[") and value.endswith("]")
    inner = value[1:-1] if bracketed else value
    if inner in NOT_APPLICABLE:
        return None, None
    if bracketed or inner in NVML_ERRORS:
        return None, value
    return value, None


def _checks_of(path: Path) -> set[str]:
    """The checks a -q value at `path` is read for: its own fact's, or every fact under it (a section printed as
    one `: Unknown Error` line)."""
    found = {check for fact, check in _PATH_CHECKS if fact[:len(path)] == path}
    if path[:-1] == _RETIRED and path[-1].startswith("pending"):
        found.add("retired_pending")
    return found


def _q_unread(values: Mapping[Path, _Value]) -> tuple[Unread, ...]:
    return tuple(Unread(check, v.label, v.note) for path, v in values.items() if v.note is not None
                 for check in sorted(_checks_of(path)))


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
        pcie_gen=_number(values.get((*_GEN, "current")), "PCIe generation"),
        pcie_gen_max=_number(values.get((*_GEN, "max")), "PCIe generation"),
        pcie_width=_width(values.get((*_WIDTH_PATH, "current"))),
        pcie_width_max=_width(values.get((*_WIDTH_PATH, "max"))),
        unread=_q_unread(values),
    )


def _text(value: _Value | None) -> str | None:
    return None if value is None else value.text


def _switch(value: _Value | None, *, on: str, off: str) -> bool | None:
    if value is None or value.text is None:
        return None
    if value.text not in (on, off):
        raise ProbeParseError(value.lineno, value.line, f"expected {on!r} or {off!r}")
    return value.text == on


def _number(value: _Value | None, what: str) -> int | None:
    if value is None or value.text is None:
        return None
    return parse_int(value.text, value.lineno, value.line, what)


def _width(value: _Value | None) -> int | None:
    if value is None or value.text is None:
        return None
    match = _WIDTH.fullmatch(value.text)
    if match is None:
        raise ProbeParseError(value.lineno, value.line, "PCIe link width is not like '16x'")
    return int(match.group(1))


def _total(values: Mapping[Path, _Value], keys: tuple[Path, ...]) -> int | None:
    """The sum of the volatile ECC counters `keys` this driver prints; None when it prints none, or when one of
    them was not read (its note is in `unread`)."""
    printed = [values.get((*_ECC_VOLATILE, *key)) for key in keys]
    if any(v is not None and v.note is not None for v in printed):
        return None
    counts = [_number(v, "ECC error count") for v in printed]
    present = [n for n in counts if n is not None]
    return sum(present) if present else None


def _retired_pending(values: Mapping[Path, _Value]) -> _Value | None:
    """`Pending Page Blacklist` (most drivers) or `Pending Page Retirement` (newer ones) under Retired Pages."""
    return next((v for path, v in values.items()
                 if path[:-1] == _RETIRED and path[-1].startswith("pending")), None)


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
    values = [_Value(lineno, line, *_reading(cell), label=name)
              for cell, name in zip(cells, HEALTH_FIELDS, strict=True)]
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
        unread=tuple(Unread(_FIELD_CHECKS[v.label], v.label, v.note) for v in values
                     if v.note is not None and v.label in _FIELD_CHECKS),
    )


def remaps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "-q", "-d", "ROW_REMAPPER"]


def joined(facts: tuple[GpuHealth, ...], remaps: tuple[GpuHealth, ...]) -> tuple[GpuHealth, ...]:
    """Each GPU's facts with its row remapper's state; the two reads must list the same GPUs (by bus id)."""
    by_bus = {r.bus_id.upper(): r for r in remaps}
    if set(by_bus) != {f.bus_id.upper() for f in facts}:
        raise ProbeParseError(1, "", f"--query-gpu and -q -d ROW_REMAPPER list other GPUs ({len(facts)} and "
                                     f"{len(remaps)}; output cut?)")
    return tuple(_with_remapper(f, by_bus[f.bus_id.upper()]) for f in facts)


def _with_remapper(facts: GpuHealth, remapper: GpuHealth) -> GpuHealth:
    remap_unread = tuple(u for u in remapper.unread if u.check in _REMAP_CHECKS)
    return replace(facts, remap_pending=remapper.remap_pending, remap_failed=remapper.remap_failed,
                   unread=(*facts.unread, *remap_unread))


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
