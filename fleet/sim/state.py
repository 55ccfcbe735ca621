"""The files a simulated node keeps under ROOT, and the rules that read them.

Everything here is stdlib only: the fake `nvidia-smi`, `systemctl`, unit
supervisor and worker all import it, and they are started often.

    ROOT/config.json            the NodeSpec, as JSON
    ROOT/libexec/NAME           a link to Python named after a process, its launcher
    ROOT/state/pids.log         every pid ever started on the node, one per line
    ROOT/state/procs/PID.json   a worker's registration (see `Registration`)
    ROOT/state/units/NAME.json  a unit's state, written by its supervisor only
    ROOT/state/health.json      what a GPU reset changes (see `Health`), seeded from config.json
    ROOT/state/*.lock           fcntl locks guarding read-modify-write updates
    ROOT/log/kern.log           the kernel log this boot, one JSON record a line (see `KernelRecord`)

A registration counts while its process is alive (same start time, not a
zombie) and for `linger_s` seconds after it died, like a driver tearing down
a context; then it is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from fleet.inventory.validate import UNIT_SUFFIXES  # systemd's unit types, declared once (stdlib only)
from fleet.sim.pci import bus_id, xid_message


class UnitConfig(TypedDict):
    """One unit as config.json stores it (mirrors `UnitSpec`)."""

    name: str
    gpus: list[int]
    mib: int
    process_name: str
    restart: str
    restart_sec: float
    ignore_sigterm: bool
    timeout_stop_sec: float


# One fact of the table of GPU facts (`fleet.model.gpu_facts.Field`) as config.json carries it to the fake
# nvidia-smi: (its --query-gpu field, its -q key path, the unit -q prints after it, what a healthy GPU prints).
SmiField = tuple[str, list[str], str, str]


class NodeConfig(TypedDict):
    """The parts of config.json the node-side tools read."""

    name: str
    gpus: int
    gpu_name: str
    memory_total_mib: int
    idle_mib: int
    linger_s: float
    units: list[UnitConfig]
    protected_daemon: bool
    smi_mode: str
    na_memory_gpus: list[int]
    ecc_error_gpus: list[int]
    driver_version: str
    vbios_version: str
    mig_gpus: list[int]
    systemd_version: int
    ecc_corrected_gpus: list[int]
    remap_pending_gpus: list[int]
    remap_failed_gpus: list[int]
    fabric: str
    narrow_pcie_gpus: list[int]
    unread_fields: list[tuple[int, str]]
    smi_fields: list[SmiField]
    smi_values: list[tuple[int, str, str]]
    leaked_mib: list[tuple[int, int]]
    xids: list[tuple[int, int, str]]
    journal: str
    xid_on_kill: bool
    locked_clock_gpus: list[int]
    power_limits: list[tuple[int, float]]
    power_limit_refused: bool
    minor_numbers: list[int]
    gpu_reset_s: float
    smi_delay_s: float


# What an idle MIG-enabled GPU reports used with no process at all: its GPU instances' reservations
# (tests/fixtures/nvidia-smi/h200-mig_drv590.48.01_1gpu_table_idle-mig-55MiB-no-procs.txt).
MIG_IDLE_MIB = 55


class Registration(TypedDict):
    """state/procs/PID.json: one process holding device files."""

    pid: int
    starttime: int
    name: str
    gpus: list[int]
    mib: int
    compute: bool
    unit: NotRequired[str]
    children: NotRequired[list[int]]
    died_at: NotRequired[float]


class Health(TypedDict):
    """state/health.json: the GPU state a reset (`nvidia-smi -r`) changes."""

    leaked_mib: list[int]  # per GPU index: MiB used with no process (a leaked context)
    remap_pending: list[int]  # GPU indexes with a row remapping pending (a reset applies it)
    resets: list[int]  # GPU indexes reset so far, in order
    settings: NotRequired[dict[str, dict[str, str]]]  # per GPU index: --query-gpu field -> what nvidia-smi set it to


def settings_of(health: Health) -> dict[int, dict[str, str]]:
    """The settings nvidia-smi changed (`fleet.sim.smi_settings`), per GPU index: they win over the spec's."""
    return {int(gpu): said for gpu, said in health.get("settings", {}).items()}


def set_settings(root: Path, config: NodeConfig, gpu: int, said: Mapping[str, str]) -> None:
    """Record what a settings command of nvidia-smi changed on one GPU."""
    with locked(state_dir(root) / "health.lock"):
        health = read_health(root, config)
        mine = health.setdefault("settings", {}).setdefault(str(gpu), {})
        mine.update(said)
        write_health(root, health)


def mig_gpus(root: Path, config: NodeConfig) -> set[int]:
    """The GPUs in MIG mode now: the spec's, as nvidia-smi's settings and resets changed them."""
    now = set(config["mig_gpus"])
    for gpu, said in settings_of(read_health(root, config)).items():
        if "mig.mode.current" in said:
            (now.add if said["mig.mode.current"] == "Enabled" else now.discard)(gpu)
    return now


class KernelRecord(TypedDict):
    """One line of log/kern.log: a kernel message and when it was logged (µs since the epoch)."""

    usec: int
    message: str


class UnitStatus(TypedDict):
    """state/units/NAME.json: what `systemctl show` reports for a unit."""

    ActiveState: str
    SubState: str
    Result: str
    MainPID: int
    main_starttime: int
    supervisor_pid: int
    pids: list[int]


INACTIVE: UnitStatus = {
    "ActiveState": "inactive",
    "SubState": "dead",
    "Result": "success",
    "MainPID": 0,
    "main_starttime": 0,
    "supervisor_pid": 0,
    "pids": [],
}


# ---------------------------------------------------------------- paths


def state_dir(root: Path) -> Path:
    return root / "state"


def procs_dir(root: Path) -> Path:
    return state_dir(root) / "procs"


def units_dir(root: Path) -> Path:
    return state_dir(root) / "units"


def pids_log(root: Path) -> Path:
    return state_dir(root) / "pids.log"


def config_path(root: Path) -> Path:
    return root / "config.json"


def health_path(root: Path) -> Path:
    return state_dir(root) / "health.json"


def kern_log(root: Path) -> Path:
    return root / "log" / "kern.log"


def canonical_unit(name: str) -> str:
    """`sglang` -> `sglang.service`, as systemctl does; other suffixes kept."""
    return name if name.endswith(UNIT_SUFFIXES) else f"{name}.service"


def unit_path(root: Path, name: str) -> Path:
    return units_dir(root) / f"{canonical_unit(name)}.json"


def unit_lock(root: Path, name: str) -> Path:
    """Held by unitd while it starts a worker and by `systemctl kill` while it signals."""
    return units_dir(root) / f"{canonical_unit(name)}.lock"


# ---------------------------------------------------------------- files


def write_json(path: Path, data: object) -> None:
    """Replace `path` atomically: readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on `path` (created if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def launcher(root: Path, name: str) -> str:
    """ROOT/libexec/NAME, a symlink to this Python (made once): exec'd under that name, a
    process looks like a program called NAME, as a real daemon does (argv[0] is the path,
    the kernel's comm its basename cut to 15 characters, /proc/PID/exe the interpreter)."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad process name {name!r}")
    path = root / "libexec" / name
    if not path.is_symlink():
        path.parent.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.symlink_to(os.path.realpath(sys.executable))
    return str(path)


def append_pid(root: Path, pid: int) -> None:
    """Add `pid` to pids.log with one O_APPEND write (atomic for short lines)."""
    fd = os.open(pids_log(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{pid}\n".encode())
    finally:
        os.close(fd)


def logged_pids(root: Path) -> list[int]:
    """Every pid in pids.log, first occurrence order, without duplicates."""
    try:
        lines = pids_log(root).read_text().split()
    except FileNotFoundError:
        return []
    return list(dict.fromkeys(int(line) for line in lines if line.isdigit()))


def load_config(root: Path) -> NodeConfig:
    return cast(NodeConfig, json.loads(config_path(root).read_text()))


def find_unit(config: NodeConfig, name: str) -> UnitConfig | None:
    wanted = canonical_unit(name)
    return next((u for u in config["units"] if canonical_unit(u["name"]) == wanted), None)


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


# ---------------------------------------------------------------- /proc


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) from /proc/PID/stat, or None if there is no such pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def starttime(pid: int) -> int:
    """Field 22 of /proc/PID/stat (clock ticks since boot); 0 if the pid is gone."""
    stat = proc_stat(pid)
    return stat[1] if stat else 0


def pid_alive(pid: int, start: int | None = None) -> bool:
    """True if `pid` runs and is not a zombie (and, given `start`, is that same process)."""
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start is None or stat[1] == start


def cmdline(pid: int) -> list[str]:
    """argv of `pid`; empty once it is gone (or while it exits)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


# ---------------------------------------------------------------- registrations


def register(root: Path, reg: Registration) -> None:
    """Publish a process's registration (replacing any left by an earlier use of its pid)."""
    with locked(state_dir(root) / "procs.lock"):
        write_json(procs_dir(root) / f"{reg['pid']}.json", reg)


def mark_died(root: Path, pid: int, start: int, when: float) -> None:
    """Record that process (`pid`, `start`) died at `when`, unless a death time is known; the first to record it
    logs the Xid 45 the driver logs for a worker killed with GPU memory, on a node that does (`xid_on_kill`)."""
    path = procs_dir(root) / f"{pid}.json"
    with locked(state_dir(root) / "procs.lock"):
        reg = cast(Registration | None, read_json(path))
        if reg is None or reg["starttime"] != start or "died_at" in reg:
            return
        reg["died_at"] = when
        write_json(path, reg)
    if reg["mib"] > 0 and load_config(root).get("xid_on_kill"):
        for gpu in reg["gpus"]:
            text = f"pid={pid}, name={reg['name'][:15]}, Ch 00000001"  # comm: the kernel keeps 15 characters
            log_kernel(root, xid_message(bus_id(gpu), 45, text), when)


def _forget(root: Path, reg: Registration) -> None:
    path = procs_dir(root) / f"{reg['pid']}.json"
    with locked(state_dir(root) / "procs.lock"):
        current = cast(Registration | None, read_json(path))
        if current is not None and current["starttime"] == reg["starttime"]:
            path.unlink()


def registrations(root: Path) -> list[Registration]:
    """Every registration on file, live or not, by pid."""
    regs: list[Registration] = []
    for path in sorted(procs_dir(root).glob("*.json")):
        reg = cast(Registration | None, read_json(path))
        if reg is not None:
            regs.append(reg)
    return sorted(regs, key=lambda r: r["pid"])


def holding(root: Path, linger_s: float, now: float | None = None) -> tuple[list[Registration], list[Registration]]:
    """(live, lingering) registrations now; records deaths and drops expired ones."""
    now = time.time() if now is None else now
    live: list[Registration] = []
    lingering: list[Registration] = []
    for reg in registrations(root):
        if pid_alive(reg["pid"], reg["starttime"]):
            live.append(reg)
            continue
        if "died_at" not in reg:
            mark_died(root, reg["pid"], reg["starttime"], now)
            reg["died_at"] = now
        if now - reg["died_at"] < linger_s:
            lingering.append(reg)
        else:
            _forget(root, reg)
    return live, lingering


def gpu_memory(root: Path, config: NodeConfig) -> list[int | None]:
    """memory.used per GPU index as nvidia-smi reports it (None = `[N/A]`): the idle base, MIG's
    reservation, a leaked allocation (until a reset) and every live or lingering registration."""
    live, lingering = holding(root, config["linger_s"])
    mig = mig_gpus(root, config)
    leaked = read_health(root, config)["leaked_mib"]
    used = [config["idle_mib"] + (MIG_IDLE_MIB if i in mig else 0) + leaked[i] for i in range(config["gpus"])]
    for reg in live + lingering:
        for gpu in reg["gpus"]:
            if 0 <= gpu < len(used):
                used[gpu] += reg["mib"]
    na = set(config["na_memory_gpus"])
    return [None if i in na else mib for i, mib in enumerate(used)]


def compute_apps(root: Path, config: NodeConfig) -> list[Registration]:
    """Live compute registrations (what `--query-compute-apps` lists)."""
    live, _ = holding(root, config["linger_s"])
    return [reg for reg in live if reg["compute"]]


def minor_of(config: NodeConfig, gpu: int) -> int:
    """The device minor number of GPU index `gpu`, whose device file is dev/nvidia<minor>: `minor_numbers`
    when the spec sets them (real nodes number device files in the driver's probe order, not by index)."""
    minors = config["minor_numbers"]
    return minors[gpu] if 0 <= gpu < len(minors) else gpu


def device_file(config: NodeConfig, gpu: int) -> str:
    """The name of GPU index `gpu`'s device file under ROOT/dev."""
    return f"nvidia{minor_of(config, gpu)}"


def device_holders(root: Path, config: NodeConfig, gpus: Collection[int]) -> dict[int, set[int]]:
    """{GPU index: pids with its ROOT/dev/nvidia<minor> open}, from a scan of /proc/*/fd (as `fuser`
    would; processes this user may not inspect are skipped)."""
    dev = Path(os.path.realpath(root)) / "dev"
    wanted = {str(dev / device_file(config, gpu)): gpu for gpu in gpus}
    held: dict[int, set[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                gpu = wanted.get(os.readlink(f"{fd_dir}/{fd}"))
                if gpu is not None:
                    held.setdefault(gpu, set()).add(int(entry.name))
    return held


def gpus_in_use(root: Path, config: NodeConfig, gpus: Collection[int]) -> list[int]:
    """Those of `gpus` a reset must refuse: a process holds the GPU's device file, or a registration
    (live, or lingering while its context is torn down) is on it."""
    live, lingering = holding(root, config["linger_s"])
    registered = {gpu for reg in live + lingering for gpu in reg["gpus"]}
    opened = device_holders(root, config, gpus)
    return sorted(gpu for gpu in set(gpus) if gpu in registered or gpu in opened)


# ---------------------------------------------------------------- GPU health (what a reset changes)


def initial_health(config: NodeConfig) -> Health:
    """The health a node starts with, from its spec: leaked allocations, pending remaps, no reset."""
    leaked = [0] * config["gpus"]
    for gpu, mib in config["leaked_mib"]:
        if 0 <= gpu < len(leaked):
            leaked[gpu] += mib
    return {"leaked_mib": leaked, "remap_pending": sorted(set(config["remap_pending_gpus"])), "resets": []}


def read_health(root: Path, config: NodeConfig) -> Health:
    """state/health.json, or (before the node wrote one) the health its spec starts with."""
    health = cast(Health | None, read_json(health_path(root)))
    return initial_health(config) if health is None else health


def write_health(root: Path, health: Health) -> None:
    write_json(health_path(root), health)


def reset_gpus(root: Path, config: NodeConfig, gpus: Collection[int]) -> None:
    """Record a successful reset of `gpus`: their leaked memory is freed, pending remaps applied."""
    done = sorted(set(gpus))
    with locked(state_dir(root) / "health.lock"):
        health = read_health(root, config)
        for gpu in done:
            if 0 <= gpu < len(health["leaked_mib"]):
                health["leaked_mib"][gpu] = 0
        health["resets"] += done
        health["remap_pending"] = [gpu for gpu in health["remap_pending"] if gpu not in done]
        write_health(root, health)


# ---------------------------------------------------------------- the kernel log


def log_kernel(root: Path, message: str | bytes, when: float | None = None) -> None:
    """Append one kernel message to log/kern.log with one O_APPEND write; bytes are kept as bytes (those not UTF-8
    surrogate-escaped in the record), as journald keeps what the kernel wrote."""
    stamp = time.time() if when is None else when
    text = message.decode("utf-8", "surrogateescape") if isinstance(message, bytes) else message
    record: KernelRecord = {"usec": int(stamp * 1_000_000), "message": text}
    fd = os.open(kern_log(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def kernel_records(root: Path) -> list[KernelRecord]:
    """Every kernel message this boot, oldest first (a torn last line is skipped)."""
    try:
        lines = kern_log(root).read_text().splitlines()
    except FileNotFoundError:
        return []
    records: list[KernelRecord] = []
    for line in lines:
        with contextlib.suppress(ValueError):
            records.append(cast(KernelRecord, json.loads(line)))
    return records


# ---------------------------------------------------------------- units


def read_unit(root: Path, name: str) -> UnitStatus:
    """A unit's state; never started -> inactive/dead; supervisor gone -> failed."""
    status = cast(UnitStatus | None, read_json(unit_path(root, name)))
    if status is None:
        return INACTIVE.copy()
    settled = status["ActiveState"] in ("inactive", "failed")
    if not settled and not pid_alive(status["supervisor_pid"]):
        status.update({"ActiveState": "failed", "SubState": "failed", "Result": "signal", "MainPID": 0, "pids": []})
    return status
