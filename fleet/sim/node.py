"""A simulated 8-GPU node in a directory: the Python API tests and the demo drive.

    node = SimNode(tmp_path / "gpu-a01", NodeSpec("gpu-a01", units=(UnitSpec("sglang"),)))
    node.start()                    # setup() + units + workers + nvidia-persistenced; node.stop(): SIGKILL them all
    subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv"], env=node.env())

Under ROOT: dev/nvidia0..N-1, nvidiactl, nvidia-uvm (empty files standing for the device nodes), bin/nvidia-smi,
bin/systemctl, bin/journalctl, bin/sudo and, on a node with a fabric manager, bin/nv-fabricmanager (wrappers around
their `fleet.sim` modules: `fleet.sim.tools`), config.json (the spec), state/ (see `fleet.sim.state`), log/
(log/kern.log: the kernel log of this boot) and run/ (fleet's reset lock: `lock_file`; mode 0700, as fleet requires).
Everything else a command on the node uses (find over /proc, ps, kill, timeout, flock) is the real tool.

GPU health is part of the spec (healthy by default): Xids in the kernel log (`xids`, and `log_xid` for one now), each
fact of `fleet.model.gpu_facts`' table (ECC, row remapping, fabric, PCIe link, ...), MIG mode, and a leaked allocation
(`leaked_mib`) that only `nvidia-smi -r` frees, refused while anything holds that GPU, as the real one is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.model import gpu_facts
from fleet.sim import journalctl, nvidia_smi, pci, state, systemctl, tools, worker

REPO_ROOT = tools.REPO_ROOT
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
PERSISTENCED = "nvidia-persistenced"


class SimError(RuntimeError):
    """The simulated node could not do what was asked (start, stop, a bad mode)."""


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    """A systemd unit whose main process holds GPUs (`unitd` runs it)."""

    name: str
    gpus: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    mib: int = 30000
    process_name: str = "python3"
    restart: str = "no"
    restart_sec: float = 0.5
    ignore_sigterm: bool = False
    timeout_stop_sec: float = 90.0


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """A stray process holding GPUs, outside any unit.

    `user`: it runs as that user once it holds its devices (the node must be
    started as root). `child`: it starts that worker (name, gpus, mib,
    compute) as its own child first, as a daemon starts a helper.
    """

    gpus: tuple[int, ...]
    mib: int
    name: str = "python3"
    ignore_sigterm: bool = False
    compute: bool = True
    user: str | None = None
    child: WorkerSpec | None = None


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """Everything about one simulated node; stored as ROOT/config.json.

    GPU health (defaults: healthy): `ecc_error_gpus` report 1 uncorrected and `ecc_corrected_gpus` 3 corrected ECC
    errors (volatile and aggregate); `remap_pending_gpus` have a row remapping pending (a reset applies it),
    `remap_failed_gpus` a remapping failure; `fabric` is every GPU's NVSwitch fabric "STATE/STATUS" ("In
    Progress/N/A"; "N/A": no NVSwitch); `narrow_pcie_gpus` run their PCIe link at x8 of x16; `unread_fields` ((gpu,
    field), ...) and `smi_values` ((gpu, field, text), ...) print `[Unknown Error]` or `text` (as --query-gpu does;
    -q adds the unit) in that field of `fleet.model.gpu_facts`' table; `leaked_mib` ((gpu, MiB), ...) stays in
    memory.used with no process until `nvidia-smi -r`; `xids` ((gpu, code, text), ...) are in the kernel log from
    the node's start, `text` what follows the code (`pci.xid_message`), after a few boot messages as on every real
    boot. `journal` is what journalctl can read (`journalctl.JOURNAL_MODES`: "ok", or a journalctl built without
    pattern matching, no journal files, a user outside the journal's groups, a hang). `xid_on_kill`: a worker holding
    GPU memory that dies from a signal makes the driver log Xid 45 (Preemptive cleanup) for it on each of its GPUs,
    naming its pid and process name, as real drivers do for a process killed with GPU channels active (opt in).

    `minor_numbers` gives each GPU index its device minor number (dev/nvidia<minor>, `Minor Number` in `nvidia-smi
    -q`): real nodes number device files in the driver's probe order, not by nvidia-smi's index; empty, they are the
    same. `gpu_reset_s` is how long `nvidia-smi -r` takes; `smi_delay_s` how long every nvidia-smi call takes before
    it answers (8 GPUs without persistence mode: seconds). The last three: GPU settings a last user left behind.
    """

    name: str
    gpus: int = 8
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    memory_total_mib: int = 81559
    idle_mib: int = 0
    linger_s: float = 0.5
    units: tuple[UnitSpec, ...] = ()
    workers: tuple[WorkerSpec, ...] = ()
    protected_daemon: bool = True
    smi_mode: str = "ok"
    na_memory_gpus: tuple[int, ...] = ()
    ecc_error_gpus: tuple[int, ...] = ()
    driver_version: str = "550.90.07"
    fabric_manager: str | None = None  # nv-fabricmanager's version (an NVSwitch node); None: no such program
    vbios_version: str = gpu_facts.VBIOS.sim  # every GPU's; with `gpu_name`, `driver_version`: the rack compared
    mig_gpus: tuple[int, ...] = ()  # GPUs in MIG mode: mig.mode.current Enabled, MIG_IDLE_MIB used when idle
    systemd_version: int = 255  # what the fake systemctl accepts (before 252: no --kill-whom=)
    ecc_corrected_gpus: tuple[int, ...] = ()
    remap_pending_gpus: tuple[int, ...] = ()
    remap_failed_gpus: tuple[int, ...] = ()
    fabric: str = "Completed/Success"
    narrow_pcie_gpus: tuple[int, ...] = ()
    unread_fields: tuple[tuple[int, str], ...] = ()
    smi_values: tuple[tuple[int, str, str], ...] = ()
    leaked_mib: tuple[tuple[int, int], ...] = ()
    xids: tuple[tuple[int, int, str], ...] = ()
    minor_numbers: tuple[int, ...] = ()
    gpu_reset_s: float = 0.0
    smi_delay_s: float = 0.0
    journal: str = "ok"
    xid_on_kill: bool = False
    locked_clock_gpus: tuple[int, ...] = ()  # a last user's `nvidia-smi -lgc`: Applications Clocks Setting Active
    power_limits: tuple[tuple[int, float], ...] = ()  # (gpu, watts): a last user's lowered `nvidia-smi -pl`
    power_limit_refused: bool = False  # `nvidia-smi -pl` fails: Insufficient Permissions, exit 4

    def __post_init__(self) -> None:
        if self.journal not in journalctl.JOURNAL_MODES:
            modes = ", ".join(journalctl.JOURNAL_MODES)
            raise SimError(f"{self.name}: unknown journal {self.journal!r}; expected one of {modes}")
        minors = self.minor_numbers
        if minors and (len(minors) != self.gpus or len(set(minors)) != len(minors) or min(minors) < 0):
            raise SimError(f"{self.name}: minor_numbers must give each of the {self.gpus} GPUs its own number")

    def to_json(self) -> str:
        """The spec, and each row of the table of GPU facts (`state.SmiField`): the fake nvidia-smi answers them."""
        rows = [(f.query, list(f.q[0]), f.unit, f.sim) for f in gpu_facts.current()]
        return json.dumps({**dataclasses.asdict(self), "smi_fields": rows}, indent=1) + "\n"


def _worker_argv(root: Path, w: WorkerSpec) -> list[str]:
    options = ["--ignore-term"] if w.ignore_sigterm else []
    options += [] if w.compute else ["--no-compute"]
    options += ["--user", w.user] if w.user else []
    if w.child is not None:
        c = w.child
        options += ["--child-name", c.name, "--child-gpus", ",".join(map(str, c.gpus)), "--child-mib", str(c.mib)]
        options += [] if c.compute else ["--child-no-compute"]
    return worker.command(root, w.name, w.gpus, w.mib, *options)


class SimNode:
    """One simulated node rooted at a directory; see the module docstring."""

    def __init__(self, root: Path, spec: NodeSpec) -> None:
        self.root = root.resolve()
        self.spec = spec
        self.bin_dir = self.root / "bin"
        self.dev_dir = self.root / "dev"
        self._children: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"SimNode({self.spec.name!r}, root={str(self.root)!r})"

    def __enter__(self) -> SimNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ layout

    @property
    def devices_glob(self) -> str:
        """The pattern fleet's `devices` setting should use for this node."""
        return f"{self.dev_dir}/nvidia*"

    @property
    def nvidia_smi_path(self) -> str:
        return str(self.bin_dir / "nvidia-smi")

    @property
    def lock_file(self) -> str:
        """The path fleet's `lock_file` setting should use for this node."""
        return str(self.root / "run" / "fleet-reset.lock")

    def env(self) -> dict[str, str]:
        """The environment commands on this node run with: bin/ first on PATH, the repository on PYTHONPATH."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", os.defpath)])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    def setup(self) -> None:
        """Create the directories, device files, wrappers and config.json (idempotent); boot the GPUs:
        their health as the spec says (no reset yet) and a kernel log holding the spec's Xids."""
        for sub in ("bin", "dev", "log", "run", "state/procs", "state/units"):
            (self.root / sub).mkdir(mode=0o700 if sub == "run" else 0o777, parents=True, exist_ok=True)
        config = json.loads(self.spec.to_json())
        devices = [state.device_file(config, i) for i in range(self.spec.gpus)] + ["nvidiactl", "nvidia-uvm"]
        for device in devices:
            (self.dev_dir / device).touch()
        tools.install(self.bin_dir, self.root, fabric_manager=self.spec.fabric_manager is not None)
        self._write_config()
        state.write_health(self.root, state.initial_health(state.load_config(self.root)))
        state.kern_log(self.root).write_text("")
        booted = time.time()
        for message in journalctl.boot_messages(self.spec.driver_version):
            state.log_kernel(self.root, message, booted)
        for gpu, code, text in self.spec.xids:
            self._log_xid(gpu, code, text, booted)

    def _write_config(self) -> None:
        state.write_json(state.config_path(self.root), json.loads(self.spec.to_json()))

    # ------------------------------------------------------------ starting

    def start(self) -> None:
        """Start the protected daemon, every unit and every worker; wait until all registered."""
        if not state.config_path(self.root).exists():
            self.setup()
        daemon = WorkerSpec(gpus=(), mib=0, name=PERSISTENCED, compute=False)
        pids = [self._spawn(daemon)] if self.spec.protected_daemon else []
        for unit in self.spec.units:
            self._start_unit(unit.name)
        pids += [self._spawn(w) for w in self.spec.workers]
        pids += [state.read_unit(self.root, unit.name)["MainPID"] for unit in self.spec.units]
        self._await_registered(pids)

    def spawn_worker(self, w: WorkerSpec) -> int:
        """Start a stray worker and wait until it (and its child, if any) holds its device files; its pid."""
        pid = self._spawn(w)
        self._await_registered([pid])
        return pid

    def children_of(self, pid: int) -> list[int]:
        """The pids of the workers `pid` started itself (WorkerSpec.child)."""
        reg = state.read_json(state.procs_dir(self.root) / f"{pid}.json")
        return list(reg.get("children", [])) if reg else []

    def start_unit(self, name: str) -> None:
        """`systemctl start NAME`, then wait until its worker is registered."""
        self._start_unit(name)
        self._await_registered([state.read_unit(self.root, name)["MainPID"]])

    def _start_unit(self, name: str) -> None:
        try:
            proc = systemctl.start_unit(self.root, name, env=self.env())
        except systemctl.SystemctlError as err:
            raise SimError(str(err)) from err
        if proc is not None:
            self._children.append(proc)

    def _spawn(self, w: WorkerSpec) -> int:
        with open(self.root / "log" / f"worker-{w.name}.log", "ab") as log:
            proc = subprocess.Popen(
                _worker_argv(self.root, w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.root,
                env=self.env(),
                start_new_session=True,
            )
        state.append_pid(self.root, proc.pid)
        self._children.append(proc)
        return proc.pid

    def _await_registered(self, pids: list[int]) -> None:
        def missing() -> list[int]:
            return [p for p in pids if not (state.procs_dir(self.root) / f"{p}.json").exists()]

        if not state.wait_for(lambda: not missing(), START_TIMEOUT_S):
            raise SimError(f"{self.spec.name}: not registered after {START_TIMEOUT_S}s: pids {missing()}")
        children = [child for pid in pids for child in self.children_of(pid)]
        if children:
            self._await_registered(children)

    # ------------------------------------------------------------ runtime knobs and probes

    def set_smi_mode(self, mode: str) -> None:
        """Switch how the fake nvidia-smi behaves from its next call on."""
        if mode not in nvidia_smi.SMI_MODES:
            raise SimError(f"unknown smi_mode {mode!r}; expected one of {', '.join(nvidia_smi.SMI_MODES)}")
        self.spec = dataclasses.replace(self.spec, smi_mode=mode)
        self._write_config()

    def set_journal(self, mode: str) -> None:
        """Switch what the fake journalctl can read from its next call on (`journalctl.JOURNAL_MODES`)."""
        if mode not in journalctl.JOURNAL_MODES:
            raise SimError(f"unknown journal {mode!r}; expected one of {', '.join(journalctl.JOURNAL_MODES)}")
        self.spec = dataclasses.replace(self.spec, journal=mode)
        self._write_config()

    def log_xid(self, gpu: int, code: int, message: str) -> None:
        """Log Xid `code` on GPU `gpu` in the node's kernel log now; `message` is what follows the code
        ("pid=1234, name=python3, GPU has fallen off the bus.")."""
        self._log_xid(gpu, code, message, time.time())

    def _log_xid(self, gpu: int, code: int, message: str, when: float) -> None:
        if not 0 <= gpu < self.spec.gpus:
            raise SimError(f"{self.spec.name}: no GPU {gpu} (it has {self.spec.gpus})")
        state.log_kernel(self.root, pci.xid_message(pci.bus_id(gpu), code, message), when)

    def gpu_resets(self) -> list[int]:
        """The GPU indexes `nvidia-smi -r` reset so far, in order (one entry per GPU per reset)."""
        return list(state.read_health(self.root, state.load_config(self.root))["resets"])

    def gpu_memory(self) -> list[int | None]:
        """memory.used per GPU, as nvidia-smi would print it now (None = [N/A])."""
        return state.gpu_memory(self.root, state.load_config(self.root))

    def compute_pids(self) -> set[int]:
        """Pids nvidia-smi would list under --query-compute-apps now."""
        return {reg["pid"] for reg in state.compute_apps(self.root, state.load_config(self.root))}

    def unit_state(self, name: str) -> str:
        """The unit's ActiveState, as `systemctl show` reports it."""
        return state.read_unit(self.root, name)["ActiveState"]

    def unit_main_pid(self, name: str) -> int:
        return state.read_unit(self.root, name)["MainPID"]

    def recorded_pids(self) -> list[int]:
        """Every pid this node ever started (workers and unit supervisors)."""
        supervisors = [state.read_unit(self.root, u.name)["supervisor_pid"] for u in self.spec.units]
        return list(dict.fromkeys(state.logged_pids(self.root) + [p for p in supervisors if p > 0]))

    def alive(self, pid: int) -> bool:
        """True while `pid` runs (a zombie counts as dead)."""
        self._reap()
        return state.pid_alive(pid)

    # ------------------------------------------------------------ teardown

    def _reap(self) -> None:
        self._children = [proc for proc in self._children if proc.poll() is None]

    def _owned(self) -> dict[int, tuple[int, bool]]:
        """Recorded pids alive and started for this node (the cmdline names ROOT, so a reused
        pid is never ours): {pid: (start time, is a unit supervisor)}."""
        owned = {}
        for pid in self.recorded_pids():
            argv = state.cmdline(pid)
            if "--node" in argv and str(self.root) in argv and state.pid_alive(pid):
                owned[pid] = (state.starttime(pid), "fleet.sim.unitd" in argv)
        return owned

    def stop(self) -> None:
        """SIGKILL every recorded process still alive (supervisors and their process groups
        first, so nothing restarts), reap, and wait until all are gone; idempotent."""
        if not state.state_dir(self.root).exists():
            return
        doomed: dict[int, tuple[int, bool]] = {}

        def all_gone() -> bool:
            # A dying process keeps its start time but loses its cmdline: remember what was ours.
            doomed.update(self._owned())
            live = {pid: info for pid, info in doomed.items() if state.pid_alive(pid, info[0])}
            for pid in sorted(live, key=lambda p: not live[p][1]):
                _sigkill(pid, group=live[pid][1])
                _sigkill(pid)
            self._reap()
            return not live

        if not state.wait_for(all_gone, STOP_TIMEOUT_S, interval=0.02):
            raise SimError(f"{self.spec.name}: still alive after stop(): {sorted(doomed)}")
        for proc in self._children:
            proc.wait(timeout=STOP_TIMEOUT_S)
        self._children.clear()


def _sigkill(pid: int, group: bool = False) -> None:
    """SIGKILL `pid` (or its process group); a process already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
