"""A fake `nvidia-smi` that prints what the real one prints, byte for byte.

ROOT/bin/nvidia-smi runs `python -m fleet.sim.nvidia_smi --node ROOT ARGS...`.
Supported:

    nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i IDS]
    nvidia-smi --query-compute-apps=FIELDS --format=... [-i IDS]
    nvidia-smi -L
    nvidia-smi -q [-i IDS]          (every GPU's section of a real 590-driver capture, see below)
    nvidia-smi -r [-i IDS]          (a GPU reset: refused while anything holds the GPU)
    nvidia-smi                      (the summary table, 550-driver layout)

CSV: `, ` between values, a newline after every line, the header keeps its
` [MiB]` units even with nounits, `[N/A]` never carries a unit, and with no
compute apps the output is the header alone (or nothing with noheader).
config.json's `smi_mode` makes it fail as the real one does: "hang" blocks
until signalled; "driver-not-loaded" (exit 9), "no-devices" (6) and
"nvml-mismatch" (18) print the real messages; "killed" is SIGKILLed at once, as
the kernel's OOM killer ends a process (exit 137 with no bound reached); `smi_delay_s`
makes every call take that long first (8 GPUs without persistence mode).
The GPU facts fleet reads (config.json's `smi_fields`, written from the table of GPU facts,
`fleet.model.gpu_facts`: each fact's --query-gpu field, -q key path, unit and healthy value) are
answered from that table: a healthy GPU prints each row's value, the node's health knobs (ECC
errors, remaps, the fabric, a narrow link, persistence) and `smi_values` ((gpu, field, text), ...)
change it for a GPU, and `unread_fields` ((gpu, field), ...) print `[Unknown Error]` in
--query-gpu and `Unknown Error` at its key in -q, as the real tool prints NVML's error string for a
value it could not read. Stdlib only: it is polled.

`-q` is rendered from q_template.txt, a real `nvidia-smi -q` of one idle H200 on driver 590.48.01
(utkuozdemir/nvidia_gpu_exporter, MIT; the same text as
tests/fixtures/nvidia-smi/h200_drv590.48.01_1gpu_q_idle.txt): one `GPU <bus id>` section per GPU,
every line kept, the node's values put where the real tool prints them (`q_values`).

`-r` resets the selected GPUs (all without `-i`) at once: refused, with the real message and exit
status 255, while any process holds one of their device files or a registration is on one;
otherwise it takes `gpu_reset_s` seconds, frees their leaked memory, applies their pending row remaps,
records the reset (state/health.json) and prints what the real tool prints. A GPU's device file is
dev/nvidia<minor> and `-q` prints that minor number (`minor_numbers`; by default the index).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

from fleet.sim import smi_settings, state
from fleet.sim.pci import bus_id

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
FAILURES = {
    "driver-not-loaded": (DRIVER_NOT_LOADED, 9),
    "no-devices": ("No devices were found\n", 6),
    "nvml-mismatch": (
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161\n",
        18,
    ),
}
SMI_MODES = ("ok", "hang", "killed", *FAILURES)
# What the real tool prints for a value NVML could not read (NVML_ERROR_UNKNOWN's string; bracketed in CSV).
UNREAD = "Unknown Error"
# PCI addresses of the eight GPUs of a real HGX H100 board (GPUD capture, driver 550.90.07).
RESERVED_MIB = 479
CUDA_VERSION = "12.4"


T = TypeVar("T")


class Failure(Exception):
    """nvidia-smi gave up: `text` goes to stdout, the exit status is `code`."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


def usage_failure(message: str) -> Failure:
    return Failure(f"{message}\n", 2)


def mode_failure(mode: str) -> Failure:
    text, code = FAILURES[mode]
    return Failure(text, code)


# Gpu and App are NamedTuples, built by keyword: a dataclass would import `dataclasses` (and `inspect`) in every
# call of this polled tool, about 11 ms more than its 60 ms (measured on a 2-core machine).
class Gpu(NamedTuple):
    """One GPU as a query sees it; `number` is its index."""

    number: int
    name: str
    uuid: str
    bus_id: str
    serial: str
    total: int
    used: int | None
    driver: str
    gpu_count: int
    timestamp: str
    facts: Mapping[str, str]  # the table's facts, by --query-gpu field, as --query-gpu prints them (nounits)
    mig: bool = False
    minor: int | None = None  # the device file's minor number (dev/nvidia<minor>); None: the index

    @property
    def persistence(self) -> bool:
        return self.facts.get("persistence_mode") == "Enabled"

    @property
    def ecc(self) -> str:
        """Volatile uncorrectable ECC errors, as the summary table and the aggregate field print them."""
        return self.facts.get("ecc.errors.uncorrected.volatile.total", "0")

    @property
    def free(self) -> int | None:
        """Like the real H100 captures: total - reserved - used + 1 (each is rounded down from bytes)."""
        return None if self.used is None else max(0, self.total - RESERVED_MIB - self.used + 1)


class App(NamedTuple):
    """One compute process on one GPU."""

    gpu: Gpu
    pid: int
    name: str
    mib: int


def yes_no(flag: bool) -> str:
    return "Yes" if flag else "No"


NARROW_LINK_WIDTH = 8
CORRECTED_ERRORS = 3  # what a GPU of NodeSpec.ecc_corrected_gpus reports


def fabric_of(spec: str) -> tuple[str, str]:
    """NodeSpec.fabric as (state, status): "Completed/Success", "In Progress/N/A"; "N/A" alone is a
    node without an NVSwitch fabric (both N/A, as -q prints on such a GPU)."""
    if spec == "N/A":
        return ("N/A", "N/A")
    fabric_state, _, status = spec.partition("/")
    return (fabric_state, status or "N/A")


def modeled(config: state.NodeConfig, index: int, remap_pending: Collection[int]) -> dict[str, str]:
    """What the node's health knobs (NodeSpec) make one GPU print, by --query-gpu field."""
    fabric_state, fabric_status = fabric_of(config["fabric"])
    mig = "Enabled" if index in config["mig_gpus"] else "Disabled"
    said = {
        "name": config["gpu_name"],
        "driver_version": config["driver_version"],
        "vbios_version": config["vbios_version"],
        "mig.mode.current": mig,
        "mig.mode.pending": mig,
        "persistence_mode": "Enabled" if config["protected_daemon"] else "Disabled",
        "ecc.errors.uncorrected.volatile.total": str(int(index in config["ecc_error_gpus"])),
        "ecc.errors.corrected.volatile.total": str(CORRECTED_ERRORS if index in config["ecc_corrected_gpus"] else 0),
        "remapped_rows.pending": yes_no(index in remap_pending),
        "remapped_rows.failure": yes_no(index in config["remap_failed_gpus"]),
        "fabric.state": fabric_state,
        "fabric.status": fabric_status,
    }
    said |= smi_settings.app_clocks(config["driver_version"], config["gpu_name"])
    said |= {"pcie.link.width.current": str(NARROW_LINK_WIDTH)} if index in config["narrow_pcie_gpus"] else {}
    said |= {smi_settings.REASON: "Active"} if index in config["locked_clock_gpus"] else {}
    limits = [f"{watts:.2f}" for gpu, watts in config["power_limits"] if gpu == index]
    return said | ({"power.limit": limits[-1], "enforced.power.limit": limits[-1]} if limits else {})


def facts_of(config: state.NodeConfig, index: int, remap_pending: Collection[int],
             settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each fact of the table (`smi_fields`) one GPU prints: the row's healthy value, what the node's knobs make
    of it, what `smi_values` sets, what nvidia-smi's settings commands set since (`settings`), `[Unknown Error]`
    where `unread_fields` names it."""
    known = {field: healthy for field, _, _, healthy in config["smi_fields"]}
    said = known | {k: v for k, v in modeled(config, index, remap_pending).items() if k in known}
    said |= {field: text for gpu, field, text in config["smi_values"] if gpu == index}
    said |= {k: v for k, v in (settings or {}).items() if k in known}
    return said | {field: f"[{UNREAD}]" for gpu, field in config["unread_fields"] if gpu == index}


def temperature(gpu: Gpu) -> int:
    """An idle H100's temperature, varied a little per GPU."""
    return 24 + gpu.number % 4


Getter = Callable[[Gpu], object]
GPU_FIELDS: dict[str, tuple[str | None, Getter]] = {
    "timestamp": (None, lambda g: g.timestamp),
    "driver_version": (None, lambda g: g.driver),
    "count": (None, lambda g: g.gpu_count),
    "name": (None, lambda g: g.name),
    "serial": (None, lambda g: g.serial),
    "uuid": (None, lambda g: g.uuid),
    "pci.bus_id": (None, lambda g: g.bus_id),
    "index": (None, lambda g: g.number),
    "pstate": (None, lambda g: "P0"),
    "compute_mode": (None, lambda g: "Default"),
    "mig.mode.current": (None, lambda g: "Enabled" if g.mig else "Disabled"),
    "memory.total": ("MiB", lambda g: g.total),
    "memory.reserved": ("MiB", lambda g: RESERVED_MIB),
    "memory.used": ("MiB", lambda g: g.used),
    "memory.free": ("MiB", lambda g: g.free),
    "utilization.gpu": ("%", lambda g: 0),
    "temperature.gpu": (None, temperature),
    "ecc.errors.corrected.aggregate.total": (None, lambda g: g.facts.get("ecc.errors.corrected.volatile.total")),
    "ecc.errors.uncorrected.aggregate.total": (None, lambda g: g.ecc),
    # The table's facts (`smi_fields`: persistence, volatile ECC, retired pages, remapped rows, the fabric, the
    # PCIe link) are added per node from config.json: `gpu_fields`.
}
GPU_ALIASES = {"gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
GPU_FIELDS |= {alias: GPU_FIELDS[field] for alias, field in GPU_ALIASES.items()}



def gpu_fields(config: state.NodeConfig) -> dict[str, tuple[str | None, Getter]]:
    """Every --query-gpu field this node knows: the fixed ones and the table's (`smi_fields`), printed as said
    (`[N/A]`, a note, a value: never with a unit, as the fields the table reads have none with nounits)."""
    return GPU_FIELDS | {field: (csv_unit(unit), fact_of(field)) for field, _, unit, _ in config["smi_fields"]}


def csv_unit(unit: str) -> str | None:
    """The unit --format=csv prints (`[W]`, `700.00 W`) for what -q prints after a value: one after a space (` W`,
    ` MHz`); none for one written onto the number (a PCIe link's `16x`)."""
    return unit.strip() if unit.startswith(" ") else None


def fact_of(field: str) -> Getter:
    return lambda g: g.facts[field]


APP_FIELDS: dict[str, tuple[str | None, Callable[[App], object]]] = {
    "timestamp": (None, lambda a: a.gpu.timestamp),
    "gpu_name": (None, lambda a: a.gpu.name),
    "gpu_bus_id": (None, lambda a: a.gpu.bus_id),
    "gpu_serial": (None, lambda a: a.gpu.serial),
    "gpu_uuid": (None, lambda a: a.gpu.uuid),
    "pid": (None, lambda a: a.pid),
    "process_name": (None, lambda a: a.name),
    "name": (None, lambda a: a.name),
    "used_gpu_memory": ("MiB", lambda a: a.mib),
    "used_memory": ("MiB", lambda a: a.mib),
}


# ---------------------------------------------------------------- the GPUs


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID per node name and GPU index."""
    digest = hashlib.sha256(f"{node}/gpu{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def gpu_serial(node: str, index: int) -> str:
    digest = hashlib.sha256(f"{node}/serial{index}".encode()).hexdigest()
    return f"16{int(digest[:16], 16) % 10**11:011d}"


def timestamp() -> str:
    now = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


def make_gpu(
    config: state.NodeConfig, index: int, used: int | None, stamp: str, remap_pending: Collection[int] = (),
    settings: Mapping[str, str] | None = None,
) -> Gpu:
    node = config["name"]
    facts = facts_of(config, index, remap_pending, settings)
    return Gpu(
        number=index,
        name=config["gpu_name"],
        uuid=gpu_uuid(node, index),
        bus_id=bus_id(index),
        serial=gpu_serial(node, index),
        total=config["memory_total_mib"],
        used=used,
        driver=config["driver_version"],
        gpu_count=config["gpus"],
        timestamp=stamp,
        facts=facts,
        mig=facts.get("mig.mode.current", "Enabled" if index in config["mig_gpus"] else "") == "Enabled",
        minor=state.minor_of(config, index),
    )


def gpus(root: Path, config: state.NodeConfig) -> list[Gpu]:
    """Every GPU of the node with its memory.used (and what a reset changes) right now."""
    stamp = timestamp()
    health = state.read_health(root, config)
    settings = state.settings_of(health)
    return [make_gpu(config, i, used, stamp, health["remap_pending"], settings.get(i))
            for i, used in enumerate(state.gpu_memory(root, config))]


def compute_apps(root: Path, config: state.NodeConfig, selected: list[Gpu]) -> list[App]:
    """One row per (GPU, live compute process on it), by GPU then pid."""
    regs = state.compute_apps(root, config)
    return [App(gpu=g, pid=r["pid"], name=r["name"], mib=r["mib"]) for g in selected for r in regs
            if g.number in r["gpus"]]


def select_gpus(all_gpus: list[Gpu], ids: str | None) -> list[Gpu]:
    """The GPUs `-i` names (indices, UUIDs or PCI bus ids, comma-separated); all without `-i`."""
    if ids is None:
        return all_gpus
    wanted = [part.strip() for part in ids.split(",")]
    chosen = [g for g in all_gpus if str(g.number) in wanted or g.uuid in wanted or g.bus_id in wanted]
    if len(chosen) != len(wanted):
        raise mode_failure("no-devices")
    return chosen


# ---------------------------------------------------------------- CSV


def parse_format(spec: str | None) -> tuple[bool, bool]:
    """(header, units) from `--format=csv[,noheader][,nounits]`."""
    if spec is None:
        raise usage_failure("\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.")
    parts = [part.strip() for part in spec.split(",")]
    if "csv" not in parts or not set(parts) <= {"csv", "noheader", "nounits"}:
        raise usage_failure(f"ERROR: Option --format={spec} is not recognized. Please run 'nvidia-smi -h'.")
    return "noheader" not in parts, "nounits" not in parts


def parse_fields(spec: str, known: Mapping[str, object]) -> list[str]:
    """The requested fields, or the real error for the first unknown one (exit 2)."""
    fields = [part.strip() for part in spec.split(",")]
    for field in fields:
        if field.lower() not in known:
            raise Failure(f'Field "{field}" is not a valid field to query.\n\n', 2)
    return fields


def cell(value: object, unit: str | None, units: bool) -> str:
    """A value as CSV prints it: a note (`[N/A]`, `[Requested functionality has been deprecated]`) never with a unit."""
    if value is None:
        return "[N/A]"
    text = str(value)
    return f"{text} {unit}" if units and unit and not text.startswith("[") else text


def render_csv(
    fields: list[str],
    table: Mapping[str, tuple[str | None, Callable[[T], object]]],
    rows: Sequence[T],
    fmt: tuple[bool, bool],
) -> str:
    header, units = fmt
    specs = [table[field.lower()] for field in fields]
    lines = [", ".join(f"{f} [{u}]" if u else f for f, (u, _) in zip(fields, specs, strict=True))]
    lines = lines if header else []
    lines += [", ".join(cell(get(row), unit, units) for unit, get in specs) for row in rows]
    return "".join(f"{line}\n" for line in lines)


# ---------------------------------------------------------------- the summary table

RULE = "+" + "-" * 89 + "+"
GPU_RULE = "+-----------------------------------------+------------------------+----------------------+"
TABLE_HEAD = (
    "|-----------------------------------------+------------------------+----------------------+",
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|=========================================+========================+======================|",
)
PROCESS_HEAD = (
    "| Processes:                                                                              |",
    "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|=========================================================================================|",
)


def banner(driver: str) -> str:
    return f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {CUDA_VERSION:<9}|"


def gpu_rows(gpu: Gpu) -> list[str]:
    used = "N/A" if gpu.used is None else f"{gpu.used}MiB"
    mode = "On" if gpu.persistence else "Off"
    power = 70 + gpu.number % 5
    temp = temperature(gpu)
    return [
        f"| {gpu.number:>3}  {gpu.name:<28}{mode:>5}  | {gpu.bus_id:>18} Off | {gpu.ecc:>20} |",
        f"| N/A   {temp}C    P0 {power:>14}W /  700W | {used:>10} /{gpu.total:>7}MiB | {'0%':>7}{'Default':>13} |",
        f"| {'':>39} | {'':>22} | {'Disabled':>20} |",
        GPU_RULE,
    ]


def process_rows(apps: list[App]) -> list[str]:
    if not apps:
        return [f"|  {'No running processes found':<87}|"]
    rows = []
    for app in apps:
        name = app.name if len(app.name) <= 42 else "..." + app.name[-39:]
        rows.append(f"| {app.gpu.number:>4}   N/A  N/A {app.pid:>9}{'C':>7}   {name:<42}{app.mib:>7}MiB |")
    return rows


def summary(gpus_shown: list[Gpu], apps: list[App], driver: str) -> str:
    """Plain `nvidia-smi`: the GPU table, then the process table."""
    lines = [time.strftime("%a %b %e %H:%M:%S %Y"), RULE, banner(driver), *TABLE_HEAD]
    for gpu in gpus_shown:
        lines += gpu_rows(gpu)
    lines += ["", RULE, *PROCESS_HEAD, *process_rows(apps), RULE]
    return "".join(f"{line}\n" for line in lines)


def list_gpus(gpus_shown: list[Gpu]) -> str:
    """`nvidia-smi -L`."""
    return "".join(f"GPU {g.number}: {g.name} (UUID: {g.uuid})\n" for g in gpus_shown)


# ---------------------------------------------------------------- -q (the full query)

Q_TEMPLATE = Path(__file__).with_name("q_template.txt")
Q_INDENT = 4
# The Processes entries keep the older, narrower key column (the colon at index 42, where the rest of
# -q has it at 55 on recent drivers): so print the real 535.183.01 capture
# (tests/fixtures/nvidia-smi/8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt) and a public 580.173.02 one.
Q_PROCESS_KEY_WIDTH = 42
Q_KEY_COLUMN = 55  # where the capture's other keys end
KeyPath = tuple[str, ...]


def q_template() -> tuple[list[str], list[str]]:
    """(the header up to `Attached GPUs`, one GPU's section after its `GPU <bus id>` line)."""
    lines = Q_TEMPLATE.read_text().split("\n")[:-1]  # the capture ends with a newline
    first = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    return lines[:first], lines[first + 1 :]


def q_fill(
    lines: list[str], values: Mapping[KeyPath, str], base: int, blocks: Mapping[KeyPath, list[str]] | None = None
) -> list[str]:
    """`lines` with the value of each `Key : value` line whose key path (its enclosing sections by
    indentation, minus `base` levels) is in `values` replaced, key and padding kept; a line whose
    path is in `blocks` is replaced by those lines."""
    out: list[str] = []
    path: list[str] = []
    seen: set[KeyPath] = set()
    for line in lines:
        level = max(0, (len(line) - len(line.lstrip(" "))) // Q_INDENT - base)
        key, sep, _ = line.partition(" : ")
        del path[level:]
        path.append(key.strip())
        seen.add(tuple(path))
        block = (blocks or {}).get(tuple(path))
        value = values.get(tuple(path)) if sep else None
        if block is not None:
            out += block
        else:
            out.append(line if value is None else f"{key} : {value}")
    return out + q_added({p: v for p, v in values.items() if p not in seen}, base)


def q_added(values: Mapping[KeyPath, str], base: int) -> list[str]:
    """Lines for values at key paths the captured text lacks (a fact a registered row reads): each under its
    sections, named once, at the end, in the capture's layout (the colon in column Q_KEY_COLUMN)."""
    out: list[str] = []
    opened: set[KeyPath] = set()
    for path, value in sorted(values.items()):
        for depth in range(1, len(path)):
            if path[:depth] not in opened:
                opened.add(path[:depth])
                out.append(" " * Q_INDENT * (depth - 1 + base) + path[depth - 1])
        key = " " * Q_INDENT * (len(path) - 1 + base) + path[-1]
        out.append(f"{key:<{Q_KEY_COLUMN}}: {value}")
    return out


def q_processes(apps: list[App]) -> list[str]:
    """The `Processes` section with one entry per compute app, as the real tool lists them."""

    def row(indent: int, key: str, value: object) -> str:
        return f"{' ' * indent + key:<{Q_PROCESS_KEY_WIDTH}}: {value}"

    lines = [" " * Q_INDENT + "Processes"]
    for app in apps:
        lines += [
            row(8, "GPU instance ID", "N/A"),
            row(8, "Compute instance ID", "N/A"),
            row(8, "Process ID", app.pid),
            row(12, "Type", "C"),
            row(12, "Name", app.name),
            row(12, "Used GPU Memory", f"{app.mib} MiB"),
        ]
    return lines


def q_text(said: str, unit: str) -> str:
    """A --query-gpu value as -q prints it: a note bare (`[N/A]` -> `N/A`), a value with its unit (`16x`)."""
    if said.startswith("[") and said.endswith("]"):
        return said[1:-1]
    return f"{said}{unit}" if said != "N/A" else said


def q_values(gpu: Gpu, fields: Sequence[state.SmiField], header: Collection[str]) -> dict[KeyPath, str]:
    """What the node puts in one GPU's -q section, by key path (the rest stays as captured): the table's facts
    (`smi_fields`) where their rows say -q prints them (but the header's: `Driver Version`), and the GPU's own
    identity and memory."""
    _, bus, device_fn = gpu.bus_id.split(":")
    mib = {"Total": gpu.total, "Reserved": RESERVED_MIB, "Used": gpu.used, "Free": gpu.free}
    values: dict[KeyPath, str] = {
        ("Serial Number",): gpu.serial,
        ("GPU UUID",): gpu.uuid,
        ("Minor Number",): str(gpu.number if gpu.minor is None else gpu.minor),
        ("Board ID",): f"0x{bus}00",  # as real HGX boards show it (the 535.183.01 8-GPU capture)
        ("GSP Firmware Version",): gpu.driver,
        ("PCI", "Bus"): f"0x{bus}",
        ("PCI", "Device"): f"0x{device_fn.split('.')[0]}",
        ("PCI", "Domain"): "0x0000",
        ("PCI", "Bus Id"): gpu.bus_id,
        **{("FB Memory Usage", key): "N/A" if v is None else f"{v} MiB" for key, v in mib.items()},
        ("ECC Errors", "Aggregate", "SRAM Correctable"): q_text(gpu.facts["ecc.errors.corrected.volatile.total"], ""),
        ("ECC Errors", "Aggregate", "DRAM Uncorrectable"): q_text(gpu.ecc, ""),
    }
    values |= {tuple(path): q_text(gpu.facts[field], unit) for field, path, unit, _ in fields
               if path and not (len(path) == 1 and path[0] in header)}
    if gpu.facts.get("fabric.state") == "N/A":  # no fabric: no clique either
        values[("Fabric", "CliqueId")] = values[("Fabric", "ClusterUUID")] = "N/A"
    return values


def query(gpus_shown: list[Gpu], apps: list[App], config: state.NodeConfig) -> str:
    """`nvidia-smi -q`: the header, then one section per GPU shown, a blank line between two."""
    head, section = q_template()
    header: dict[KeyPath, str] = {
        ("Timestamp",): time.strftime("%a %b %e %H:%M:%S %Y"),
        ("Driver Version",): config["driver_version"],
        ("CUDA Version",): CUDA_VERSION,
        ("Attached GPUs",): str(config["gpus"]),
    }
    lines = q_fill(head, header, 0)
    for n, gpu in enumerate(gpus_shown):
        own = [app for app in apps if app.gpu.number == gpu.number]
        # With none, the line stays as captured: "Processes : None".
        processes: dict[KeyPath, list[str]] = {("Processes",): q_processes(own)} if own else {}
        values = q_values(gpu, config["smi_fields"], {line.partition(" : ")[0].strip() for line in head})
        lines += ([""] if n else []) + [f"GPU {gpu.bus_id}", *q_fill(section, values, 1, processes)]
    return "".join(f"{line}\n" for line in lines)


# `-q -d TYPE[,TYPE]`: the header, then per GPU its `GPU <bus id>` line and only those sections, each GPU's
# block followed by a blank line (tests/fixtures/nvidia-smi/8x-gpu_drv535.86.10_q-d-page-retirement_...).
DISPLAY_SECTIONS = {"PAGE_RETIREMENT": "Retired Pages", "ROW_REMAPPER": "Remapped Rows"}


def displayed(text: str, types: str) -> str:
    """The -q text kept to the sections `-d types` names."""
    wanted = set()
    for kind in types.split(","):
        if kind.strip().upper() not in DISPLAY_SECTIONS:
            raise usage_failure(f"ERROR: Option -d {types} is not recognized. Please run 'nvidia-smi -h'.")
        wanted.add(DISPLAY_SECTIONS[kind.strip().upper()])
    out, keep, in_gpu = [], False, False
    for line in text.split("\n")[:-1]:
        if line.startswith("GPU "):
            out += ([""] if in_gpu else []) + [line]
            in_gpu, keep = True, False
        elif not in_gpu:
            out.append(line)
        elif line.startswith(" " * Q_INDENT) and not line.startswith(" " * (2 * Q_INDENT)):
            keep = line.strip() in wanted
            out += [line] if keep else []
        elif keep and line.strip():
            out.append(line)
    return "".join(f"{line}\n" for line in [*out, ""])


# ---------------------------------------------------------------- -r (GPU reset)

# The refusal: tests/fixtures/nvidia-smi/error_gpu-reset-in-use.txt (one GPU, exit 255 per
# NVIDIA/NVSentinel#1690); the plural form as yandex-cloud/docs quotes `sudo nvidia-smi -r` on two GPUs
# (en/_includes/compute/gpu-mig-troubleshooting.md @ e7ba56b8: "2 devices are ... using these devices").
IN_USE_STATUS = 255
IN_USE_CAUSE = (
    "currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics "
    "application such as an X server, or a monitoring application such as another instance of nvidia-smi). "
    "Please first kill all processes using {these} and all compute applications running in the system."
)


def in_use(bus_ids: list[str]) -> Failure:
    n = len(bus_ids)
    count = "1 device is " if n == 1 else f"{n} devices are "
    cause = IN_USE_CAUSE.format(these="this device" if n == 1 else "these devices")
    rows = [f"  GPU {bus}: In use by another client" for bus in bus_ids]
    lines = ["", "The following GPUs could not be reset:", *rows, "", count + cause]
    return Failure("".join(f"{line}\n" for line in lines), IN_USE_STATUS)


def reset(root: Path, config: state.NodeConfig, targets: list[Gpu]) -> str:
    """`nvidia-smi -r`: all of `targets` at once, or none while any is in use.

    The success text: one line per GPU, then "All done." -- as yandex-cloud/docs shows `sudo nvidia-smi -r`
    on two GPUs (ru/compute/operations/enable-mig.md @ 1de839a5: "GPU 00000000:8B:00.0 was successfully
    reset." ... "All done.") and a public MIG walkthrough `nvidia-smi -i 2 --gpu-reset` on one."""
    busy = set(state.gpus_in_use(root, config, [g.number for g in targets]))
    if busy:
        raise in_use([g.bus_id for g in targets if g.number in busy])
    time.sleep(config["gpu_reset_s"])  # a whole HGX baseboard's reset takes far longer than a query
    state.reset_gpus(root, config, [g.number for g in targets])
    smi_settings.applied(root, config, targets_of(targets))
    return "".join(f"GPU {g.bus_id} was successfully reset.\n" for g in targets) + "All done.\n"


def targets_of(shown: list[Gpu]) -> list[smi_settings.Target]:
    return [smi_settings.Target(g.number, g.bus_id, g.facts) for g in shown]


# ---------------------------------------------------------------- command line

OPTIONS = {
    "--query-gpu": "query-gpu",
    "--query-compute-apps": "query-compute-apps",
    "--format": "format",
    "-i": "id",
    "--id": "id",
    "-L": "list",
    "--list-gpus": "list",
    "-q": "query",
    "--query": "query",
    "-d": "display",
    "--display": "display",
    "-r": "reset",
    "--gpu-reset": "reset",
    **smi_settings.OPTIONS,
}
FLAGS = {"list", "query", "reset", *smi_settings.FLAGS}  # options without a value


def parse_args(argv: list[str]) -> dict[str, str]:
    """Options as {key: value}; `--opt=value` and `--opt value` both work."""
    opts: dict[str, str] = {}
    tokens = iter(argv)
    for token in tokens:
        name, has_value, value = token.partition("=") if token.startswith("--") else (token, "", "")
        key = OPTIONS.get(name)
        if key is None:
            raise usage_failure(f"ERROR: Option {token} is not recognized. Please run 'nvidia-smi -h'.")
        if key not in FLAGS and not has_value:
            value = next(tokens, "")
        opts[key] = value
    return opts


def hang() -> None:
    """What a wedged driver looks like: block until a signal ends the process."""
    while True:
        time.sleep(3600)


def answer(root: Path, opts: dict[str, str]) -> str:
    """The text nvidia-smi prints for `opts`, or a `Failure`."""
    fmt = parse_format(opts.get("format")) if "query-gpu" in opts or "query-compute-apps" in opts else None
    config = state.load_config(root)
    known = gpu_fields(config)
    gpu_fields_asked = parse_fields(opts["query-gpu"], known) if "query-gpu" in opts else None
    app_fields = parse_fields(opts["query-compute-apps"], APP_FIELDS) if "query-compute-apps" in opts else None
    if config["smi_mode"] == "hang":
        hang()
    if config["smi_mode"] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(config["smi_delay_s"])  # initialising 8 GPUs again without persistence mode: 1-3 s each
    if config["smi_mode"] in FAILURES:
        raise mode_failure(config["smi_mode"])
    shown = select_gpus(gpus(root, config), opts.get("id"))
    if "reset" in opts:
        return reset(root, config, shown)
    if smi_settings.asked(opts):
        try:
            return smi_settings.change(root, config, opts, targets_of(shown))
        except smi_settings.Refused as refused:
            raise Failure(refused.text, refused.code) from None
    if gpu_fields_asked is not None and fmt is not None:
        return render_csv(gpu_fields_asked, known, shown, fmt)
    if app_fields is not None and fmt is not None:
        return render_csv(app_fields, APP_FIELDS, compute_apps(root, config, shown), fmt)
    if "list" in opts:
        return list_gpus(shown)
    if "query" in opts:
        text = query(shown, compute_apps(root, config, shown), config)
        return displayed(text, opts["display"]) if "display" in opts else text
    return summary(shown, compute_apps(root, config, shown), config["driver_version"])


def run(root: Path, argv: list[str]) -> int:
    """Print what nvidia-smi would for `argv` on the node at `root`; the exit status."""
    try:
        sys.stdout.write(answer(root, parse_args(argv)))
    except Failure as failure:
        sys.stdout.write(failure.text)
        return failure.code
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["--node"] or len(args) < 2:
        sys.stderr.write("usage: python -m fleet.sim.nvidia_smi --node ROOT ARGS...\n")
        return 2
    return run(Path(args[1]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
