"""nvidia-smi probes: GPU and compute-app queries, and why nvidia-smi failed.

nvidia-smi marks missing values as `[N/A]`, `N/A`, `[Not Supported]` and other
bracketed notes, or leaves them empty: all of those parse as None.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleet.node import bounds
from fleet.node.probe import Probe
from fleet.node.probes.parse import LINE_CLIP, ProbeParseError, lines, parse_int
from fleet.transport.base import CommandResult, clip

# mig.mode.current: an idle MIG-enabled GPU holds some MiB with no process (its instances' reservations).
SETTLE_FIELDS = ("index", "uuid", "memory.used", "mig.mode.current")
VERIFY_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "memory.used",
    "memory.total",
    "ecc.errors.uncorrected.volatile.total",
    "mig.mode.current",
)
COMPUTE_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
SMI_FORMAT = "--format=csv,noheader,nounits"
SMI_SEPARATOR = ", "

# Values nvidia-smi prints when it has none; any other "[...]" note counts too.
NULL_VALUES = frozenset(
    {
        "",
        "N/A",
        "[N/A]",
        "[Not Supported]",
        "[Unknown Error]",
        "[Requested functionality has been deprecated]",
        "[GPU is lost]",
    }
)

_MIB = re.compile(r"(-?\d+)(?: MiB)?")


@dataclass(frozen=True, kw_only=True)
class GpuRow:
    index: int
    memory_used_mib: int | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    ecc_uncorrected: int | None = None
    mig: bool = False  # MIG mode is enabled (mig.mode.current; `[N/A]` on a GPU without MIG: not enabled)


@dataclass(frozen=True, kw_only=True)
class ComputeApp:
    gpu_uuid: str | None
    pid: int
    process_name: str
    used_mib: int | None


# --- values -------------------------------------------------------------------


def field_value(raw: str) -> str | None:
    """One nvidia-smi value, None when it is a not-available marker."""
    value = raw.strip()
    if value in NULL_VALUES or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def parse_mib(raw: str | None) -> int | None:
    """A memory value: `123` or `123 MiB`; anything else (N/A, ...) is None."""
    if raw is None:
        return None
    if raw.isdecimal():  # the common case, as the pattern reads it
        return int(raw)
    match = _MIB.fullmatch(raw.strip())
    return int(match.group(1)) if match else None


def _optional_int(value: str | None) -> int | None:
    if value is None or not value.lstrip("-").isdigit():
        return None
    return int(value)


def split_csv(line: str, lineno: int, expected: int) -> list[str]:
    columns = line.split(SMI_SEPARATOR)
    if len(columns) != expected:
        raise ProbeParseError(lineno, line, f"expected {expected} columns, got {len(columns)}")
    return columns


# --- nvidia-smi --query-gpu -------------------------------------------------


def gpu_query_argv(nvidia_smi: str, fields: Sequence[str]) -> list[str]:
    if not fields or any(not f or "," in f or " " in f for f in fields):
        raise ValueError(f"bad nvidia-smi field list: {list(fields)}")
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), SMI_FORMAT]


def parse_gpu_query(text: str, fields: Sequence[str]) -> tuple[GpuRow, ...]:
    """Rows of `--query-gpu=FIELDS --format=csv,noheader,nounits`."""
    if "index" not in fields:
        raise ValueError("the field list must contain 'index'")
    pick = _row_picker(tuple(fields))
    rows = []
    for lineno, line in lines(text):
        values: list[str | None] = list(map(str.strip, split_csv(line, lineno, len(fields))))
        if "[" in line or not NULL_VALUES.isdisjoint(values):  # a value that may be a marker: each through field_value
            values = [field_value(raw or "") for raw in values]
        values.append(None)  # what a field not asked reads as
        rows.append(_gpu_row(pick(values), lineno, line))
    return tuple(rows)


# The fields a `GpuRow` is made of, in `_gpu_row`'s order.
_ROW_FIELDS = ("index", "memory.used", "uuid", "pci.bus_id", "name", "memory.total",
               "ecc.errors.uncorrected.volatile.total", "mig.mode.current")


@functools.lru_cache(maxsize=16)
def _row_picker(fields: tuple[str, ...]) -> Callable[[list[str | None]], tuple[str | None, ...]]:
    """Of a row's values (and a None after them), those `_gpu_row` takes, in its order: a field not asked is the
    None. One per field list (the few the probes ask)."""
    at = {name: i for i, name in enumerate(fields)}  # a field listed twice: its last value, as a dict of them read
    return operator.itemgetter(*(at.get(name, len(fields)) for name in _ROW_FIELDS))


def _gpu_row(values: tuple[str | None, ...], lineno: int, line: str) -> GpuRow:
    """The row of one GPU, from the values `_row_picker` took (`_ROW_FIELDS`' order)."""
    index, used, uuid, bus_id, name, total, ecc, mig = values
    return GpuRow(index=parse_int(index or "", lineno, line, "GPU index"), memory_used_mib=parse_mib(used), uuid=uuid,
                  pci_bus_id=bus_id, name=name, memory_total_mib=parse_mib(total), ecc_uncorrected=_optional_int(ecc),
                  mig=mig == "Enabled")


# --- nvidia-smi --query-compute-apps -----------------------------------------


def compute_apps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), SMI_FORMAT]


def parse_compute_apps(text: str) -> tuple[ComputeApp, ...]:
    """Rows of `compute_apps_argv`; a process name may itself contain ", "."""
    return tuple(_compute_app(lineno, line) for lineno, line in lines(text))


def _compute_app(lineno: int, line: str) -> ComputeApp:
    left = line.split(SMI_SEPARATOR, 2)
    right = left[-1].rsplit(SMI_SEPARATOR, 1)
    if len(left) != 3 or len(right) != 2:
        raise ProbeParseError(lineno, line, f"expected {len(COMPUTE_APPS_FIELDS)} columns")
    return ComputeApp(gpu_uuid=field_value(left[0]), pid=parse_int(left[1], lineno, line, "pid"), process_name=right[0],
                      used_mib=parse_mib(field_value(right[1])))


# --- nvidia-smi -q: device minor numbers --------------------------------------

_Q_SECTION = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*")
_Q_MINOR = re.compile(r" {4}Minor Number\s*:\s*(\d+)\s*")
_DEVICE = re.compile(r"nvidia(\d+)")


def device_minor(path: str) -> int | None:
    """The minor number a GPU device file's name carries (`/dev/nvidia3` -> 3); None for any other file
    (nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    match = _DEVICE.fullmatch(path.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def parse_minor_numbers(text: str) -> dict[int, str]:
    """Device minor number -> PCI bus id (upper case, as `--query-gpu=pci.bus_id` prints it), from `nvidia-smi
    -q`. `/dev/nvidiaN`'s N is the GPU's minor number, not its nvidia-smi index: they differ on real nodes. A
    section whose `Minor Number` is missing or not a number (`N/A`) is left out; so is a number two sections
    claim (neither can be trusted)."""
    found: dict[int, str] = {}
    twice: set[int] = set()
    bus_id: str | None = None
    for _, line in lines(text):
        section = _Q_SECTION.fullmatch(line)
        if section is not None:
            bus_id = section.group(1).upper()
            continue
        minor = _Q_MINOR.fullmatch(line) if bus_id is not None else None
        if minor is not None and bus_id is not None:
            number = int(minor.group(1))
            if number in found:
                twice.add(number)
            found[number] = bus_id
            bus_id = None  # one minor number per section
    return {n: bus for n, bus in found.items() if n not in twice}


# --- nvidia-smi failures ------------------------------------------------------

# (substring, one-line meaning), first match wins; matched in stdout and stderr.
_SMI_FAILURES = (
    ("couldn't communicate with the NVIDIA driver", "NVIDIA driver not loaded"),
    ("Driver/library version mismatch", "NVML driver/library version mismatch (reboot or reload needed)"),
    ("GPU is lost", "GPU fallen off the bus"),
    ("fallen off the bus", "GPU fallen off the bus"),
    ("Unable to determine the device handle", "GPU fallen off the bus"),
    ("No devices were found", "no NVIDIA devices found"),
    ("No supported GPUs were found", "no supported NVIDIA GPUs found"),
    ("In use by another client", "GPU reset refused"),
)


def classify_smi_failure(exit_status: int | None, stdout: str, stderr: str) -> str:
    """One line for humans saying why nvidia-smi failed."""
    status = "was ended by a signal" if exit_status is None else f"exited {exit_status}"
    first = _first_line(stderr) or _first_line(stdout) or "no output"
    if exit_status == 127:
        return f"nvidia-smi not found (exit 127): {first}"
    for needle, meaning in _SMI_FAILURES:
        detail = _line_with(needle, stderr) or _line_with(needle, stdout)
        if detail is not None:
            return f"{meaning} (nvidia-smi {status}): {clip(detail, LINE_CLIP)}"
    return f"nvidia-smi {status}: {clip(first, LINE_CLIP)}"


def _first_line(text: str) -> str | None:
    return next((line.strip() for _, line in lines(text)), None)


def _line_with(needle: str, text: str) -> str | None:
    return next((line.strip() for _, line in lines(text) if needle in line), None)


# --- the probes -------------------------------------------------------------

# A query that does not answer: the step fails with this (status timeout), it is not retried.
SMI_HANG = "nvidia-smi did not answer within {s} s ({bound}): driver may be wedged; " + bounds.WEDGED_REMEDY


def _explain(result: CommandResult) -> str:
    return classify_smi_failure(result.exit_status, result.stdout, result.stderr)


def gpu_query(nvidia_smi: str, fields: Sequence[str]) -> Probe[tuple[GpuRow, ...]]:
    return _gpu_query(nvidia_smi, tuple(fields))


# A probe is a value (frozen, what to run and how to read it: no answer): made once for every host and poll that
# asks the same, not once a host and poll (a Probe, its argv and its checks: about 25 K instructions each).
_MADE = 256


@functools.lru_cache(maxsize=_MADE)
def _gpu_query(nvidia_smi: str, fields: tuple[str, ...]) -> Probe[tuple[GpuRow, ...]]:
    return Probe(argv=tuple(gpu_query_argv(nvidia_smi, fields)), what="nvidia-smi",
                 parse=lambda text: parse_gpu_query(text, fields),
                 reads="nvidia-smi output", hang=SMI_HANG, explain=_explain, driver=True)


@functools.lru_cache(maxsize=_MADE)
def compute_apps(nvidia_smi: str) -> Probe[tuple[ComputeApp, ...]]:
    return Probe(argv=tuple(compute_apps_argv(nvidia_smi)), what="nvidia-smi", parse=parse_compute_apps,
                 reads="nvidia-smi output",
                 hang=SMI_HANG, explain=_explain, driver=True)
