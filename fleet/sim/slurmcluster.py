"""A real Slurm cluster on loopback: munged, slurmctld and one `slurmd -N NODE` per simulated node.

    with SlurmCluster(tmp / "slurm", {"sim1": "127.0.0.2", "sim2": "127.0.0.3"}) as cluster:
        subprocess.run(["srun", "-N2", "hostname"], env={**os.environ, **cluster.env}, check=True)
        cluster.drain("sim2", "bad DIMM")

`start()` (or entering the block) writes a munge key, slurm.conf and a TaskProlog under ROOT, picks
free TCP ports, starts munged, slurmctld and every slurmd (Debian's packages `slurmctld slurmd
slurm-client munge`, run as root) in the foreground as children of this process, checks that the pid
file each one writes names that child, running that program, and waits until `sinfo` shows every node
idle. `stop()` (or leaving the block, also when start fails; idempotent, bounded) cancels every job,
ends the daemons by their pids (SIGTERM, then SIGKILL; reaped) and then SIGKILLs every process left
that belongs to this cluster (`processes()`): `FLEET_SLURM_CLUSTER=<token>` is in the daemons'
environment, which each `slurmstepd` inherits from its slurmd, and the TaskProlog exports it into
every task; a slurmstepd is also known by its working folder or an open file under ROOT. Nothing is
matched by process name. Files (conf, logs, spool) stay under ROOT, which the caller removes (the logs
are what explains a failure); nothing outside ROOT is touched.

Slurm 22.05 as seen here: a drain shows in `sinfo` at once; after a resume the node reads `idle*` (not
responding) until slurmctld pings it, well under a second later (`wait_node_state`). srun onto a
drained node queues and waits ("Required node not available") unless given `--immediate`. A batch
job waits for slurmctld's first scheduling pass, about 3 s after it started; srun allocates at once.
A TaskProlog's `export NAME=value` sets value literally: no quotes are removed, nothing is expanded.

Under ROOT: munge.key, slurm.conf, taskprolog, run/ (munge socket, pid files), log/ (one log per
daemon, `slurmd-NODE.log`), spool/ (`ctld` state, one spool per node), jobs/ (sbatch's cwd and output).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from fleet.sim.node import SimError
from fleet.sim.ports import free_ports

PACKAGES = "slurmctld slurmd slurm-client munge"
MARKER_VAR = "FLEET_SLURM_CLUSTER"
CLUSTER_NAME = "fleettest"
DEFAULT_PARTITION = "gpu"
START_TIMEOUT_S = 30.0  # every daemon up and every node idle
STOP_TIMEOUT_S = 10.0  # per phase: jobs ending, then daemons ending after SIGTERM
CLIENT_TIMEOUT_S = 30.0  # one Slurm client command
JOB_TIMEOUT_S = 30.0  # a submitted job running, a cancelled one gone
LOG_TAIL_LINES = 12
SUN_PATH_MAX = 107  # bytes in a unix socket's path
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# program -> the Debian package that has it
PROGRAMS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmstepd": "slurmd",
    "srun": "slurm-client",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_CONF = """\
# Written by fleet.sim.slurmcluster: a whole cluster on loopback, every path under {root}.
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/run/munge.sock
CredType=cred/munge
StateSaveLocation={root}/spool/ctld
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
TaskProlog={root}/taskprolog
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
# a batch job starts at the next scheduling pass (default: up to 3 s later)
SchedulerParameters=batch_sched_delay=0
"""


class SlurmClusterError(SimError):
    """The Slurm cluster could not start, stop or answer as asked."""


def available() -> str | None:
    """None when this machine can run a SlurmCluster, else the one-line reason (what to install)."""
    missing = sorted({package for program, package in PROGRAMS.items() if _which(program) is None})
    if missing:
        return f"Slurm is not installed (missing {' '.join(missing)}): apt-get install {PACKAGES}"
    if os.geteuid() != 0:
        return "a simulated Slurm cluster runs its slurmd as root: run as root"
    return None


class SlurmCluster:
    """A real slurmctld and one slurmd per node, all on loopback; see the module docstring.

    `nodes` maps each node name to its own 127.x.y.z address. `partitions` maps partition names to
    node names (the first is the default); by default every node is in one partition, `gpu`.
    `task_env` maps a node name to variables every task on that node gets, set by the TaskProlog to
    exactly the given value (any value without a newline; give PATH in full, e.g. a SimNode's
    `env()["PATH"]`; without one a task keeps the PATH srun or sbatch passed it). Every task's PATH
    also contains the folder of `sys.executable`, appended when missing, so the running venv's
    `fleet` is found as it would be on a node where fleet is installed. `gpus` maps a node name to its
    GPU count: `GresTypes=gpu`, the node's `Gres=gpu:N`, and one gres.conf line `Name=gpu File=PATH` a
    GPU, PATH a character device made under ROOT/gres/NODE/ with the null device's numbers (slurmd drops
    a GPU with no File and refuses a File that is no device; writes to these are discarded, as to
    /dev/null), and select/cons_tres (select/linear cannot give a step GPUs). The cluster does not
    constrain devices (no cgroups here); what it shows is what a ConstrainDevices cluster enforces: a
    step gets the GPUs it asks for (`SLURM_STEP_GPUS`), and none without asking. slurmctld starts with its
    state cleared (`-c`): a ROOT used before starts as a new cluster.
    """

    def __init__(
        self,
        root: Path,
        nodes: Mapping[str, str],
        *,
        partitions: Mapping[str, Sequence[str]] | None = None,
        task_env: Mapping[str, Mapping[str, str]] | None = None,
        gpus: Mapping[str, int] | None = None,
    ) -> None:
        self.root = root.absolute()
        self.nodes = _check_nodes(nodes)
        for node in gpus or {}:
            self._known(node)
        self.gpus = {node: count for node, count in (gpus or {}).items() if count > 0}
        self.partitions = _check_partitions(partitions, self.nodes)
        self.task_env = _check_task_env(task_env, self.nodes)
        self.token = secrets.token_hex(8)
        self.conf_path = self.root / "slurm.conf"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.jobs_dir = self.root / "jobs"
        _check_socket_room(self.root, self.nodes)
        self.controller_port = 0
        self.node_ports: dict[str, int] = {}
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._started = False
        self._stopped = False

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        """Start munged, slurmctld and every slurmd; return once every node is idle. Stops on error."""
        if self._started:
            raise SlurmClusterError("this SlurmCluster was started before; make a new one")
        reason = available()
        if reason is not None:
            raise SlurmClusterError(reason)
        self._started = True
        try:
            self._lay_out()
            self._start_munged()
            self._start_daemons({"slurmctld": [_program("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf_path)]})
            self._start_daemons({
                f"slurmd {node}": [_program("slurmd"), "-D", "-f", str(self.conf_path), "-N", node]
                for node in self.nodes
            })
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel every job, end every daemon and every process of this cluster; idempotent, bounded."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        try:
            if self._alive("slurmctld") and _listens(self.controller_port):  # else clients retry for seconds
                self._cancel_all_jobs()
        finally:
            slurmds = [name for name in self._daemons if name.startswith("slurmd ")]
            for names in (slurmds, ["slurmctld"], ["munged"]):
                self._end([self._daemons[name] for name in names if name in self._daemons])
            self._sweep()

    # --- what callers use --------------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        """Each daemon's pid (its pid file says the same): "munged", "slurmctld", "slurmd NODE"."""
        return {name: process.pid for name, process in self._daemons.items()}

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's clients (srun, scontrol, sinfo...) need to reach this cluster, to add to an
        environment: `{**os.environ, **cluster.env}`, or `os.environ.update(cluster.env)`."""
        return {"SLURM_CONF": str(self.conf_path)}

    def client_env(self) -> dict[str, str]:
        """os.environ without any inherited SLURM_* variable, plus `env`: what `run` uses."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(self.env)
        return env

    def run(
        self, *argv: str, timeout: float = CLIENT_TIMEOUT_S, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (`scontrol ...`) against this cluster; raise on failure or timeout."""
        try:
            result = subprocess.run(
                list(argv), env=self.client_env(), cwd=self.jobs_dir, input=stdin,
                stdin=subprocess.DEVNULL if stdin is None else None,
                capture_output=True, text=True, timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise SlurmClusterError(f"{shlex.join(argv)} did not end within {timeout:g} s") from e
        except OSError as e:
            raise SlurmClusterError(f"{shlex.join(argv)}: {e}") from e
        if result.returncode != 0:
            raise SlurmClusterError(
                f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip() or result.stdout.strip()}"
            )
        return result

    def submit_sleep(self, node: str, seconds: int = 600) -> int:
        """Submit `sleep SECONDS` as a batch job on node; return its job id once it is RUNNING."""
        self._known(node)
        out = self.run(
            "sbatch", "--parsable", "-w", node, "-N1", "-J", f"sleep-{node}", "-o", str(self.jobs_dir / "slurm-%j.out"),
            "--wrap", f"sleep {int(seconds)}",
        ).stdout
        job_id = int(out.strip().split(";")[0])
        try:
            self._wait(lambda: self.job_state(job_id) == "RUNNING", JOB_TIMEOUT_S,
                       lambda: f"job {job_id} on {node} is not RUNNING (state {self.job_state(job_id)!r})")
        except BaseException:
            with contextlib.suppress(SlurmClusterError):
                self.run("scancel", str(job_id))
            raise
        return job_id

    def cancel(self, job_id: int) -> None:
        """Cancel a job; return once it has left the queue (ended)."""
        self.run("scancel", str(job_id))
        self._wait(lambda: self.job_state(job_id) == "", JOB_TIMEOUT_S,
                   lambda: f"job {job_id} did not end after scancel (state {self.job_state(job_id)!r})")

    def job_state(self, job_id: int) -> str:
        """The job's state as squeue says it (RUNNING, PENDING, COMPLETING...), "" once it left the queue."""
        out = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T", timeout=CLIENT_TIMEOUT_S).stdout
        return out.strip()

    def jobs(self, timeout: float = CLIENT_TIMEOUT_S) -> list[int]:
        """The ids of every job in the queue (pending, running, completing)."""
        return [int(line) for line in self.run("squeue", "-h", "-o", "%A", timeout=timeout).stdout.split()]

    def drain(self, node: str, reason: str) -> None:
        """`scontrol update NodeName=node State=DRAIN Reason=reason`."""
        self._known(node)
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        """`scontrol update NodeName=node State=RESUME`."""
        self._known(node)
        self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """slurmctld stopped (SIGSTOP) while the block runs: a controller that answers nothing, as one too busy to
        (clients time out after MessageTimeout, 10 s; what they sent is still read once it runs again). It is
        continued (SIGCONT) when the block ends, also on error."""
        pid = self._daemons["slurmctld"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def save_point(self) -> None:
        """Keep a copy of what slurmctld has saved so far (StateSaveLocation), for `crash_controller`."""
        saved = self.root / "spool" / "ctld.saved"
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(self.root / "spool" / "ctld", saved)

    def crash_controller(self, *, unsaved_since_save_point: bool = False) -> None:
        """slurmctld SIGKILLed (by its pid): what it had not saved to StateSaveLocation yet is lost. With
        `unsaved_since_save_point`, it is killed as if it had saved nothing since `save_point` (its saved state is
        put back as it was then): a crash right before its state save."""
        process = self._daemons["slurmctld"]
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        if unsaved_since_save_point:
            state = self.root / "spool" / "ctld"
            shutil.rmtree(state)
            shutil.copytree(self.root / "spool" / "ctld.saved", state)

    def start_controller(self) -> None:
        """slurmctld started again after a crash, recovering its saved state (no `-c`); return once every slurmd has
        registered with it again (no node UNKNOWN any more)."""
        (self.run_dir / "slurmctld.pid").unlink(missing_ok=True)
        self._start_daemons({"slurmctld": [_program("slurmctld"), "-D", "-i", "-f", str(self.conf_path)]})

        def registered() -> bool:
            with contextlib.suppress(SlurmClusterError, ValueError):
                return all(not state.startswith("unk") for state in self.node_states().values())
            return False

        self._wait(registered, START_TIMEOUT_S, lambda: f"the nodes did not register: {self.node_states()}")

    def node_state(self, node: str) -> str:
        """sinfo's long state of node: idle, allocated, drained, draining, down... ("*": not responding)."""
        self._known(node)
        lines = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").stdout.split()
        return lines[0] if lines else ""

    def wait_node_state(self, node: str, *states: str, timeout: float = JOB_TIMEOUT_S) -> str:
        """Poll until node's state is one of states (e.g. "idle" after a resume); return it."""
        self._wait(lambda: self.node_state(node) in states, timeout,
                   lambda: f"{node} is {self.node_state(node)!r}, not {' or '.join(states)},")
        return self.node_state(node)

    def node_states(self) -> dict[str, str]:
        """Every node's long state, as `node_state`."""
        states: dict[str, str] = {}
        for line in self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.splitlines():
            name, _, state = line.strip().partition(" ")
            states.setdefault(name, state.strip())
        return states

    def node_reason(self, node: str) -> str:
        """Why node is drained or down, as set by `scontrol update ... Reason=`; "" when none."""
        self._known(node)
        out = self.run("scontrol", "show", "node", node).stdout
        match = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?\s*$", out, re.MULTILINE)
        return match.group(1) if match else ""

    def reservations(self) -> list[str]:
        """The names of every reservation (`scontrol show reservation`)."""
        out = self.run("scontrol", "show", "reservation").stdout
        return re.findall(r"ReservationName=(\S+)", out)

    def processes(self) -> list[int]:
        """Every live process of this cluster but the caller: daemons, slurmstepds, tasks.

        A process is this cluster's when its environment holds `FLEET_SLURM_CLUSTER=<token>` (the
        daemons, the slurmstepds they start, every task through the TaskProlog), or when it runs
        slurmstepd with its working folder or an open file under ROOT (its node's log, its spool).
        """
        marker = f"{MARKER_VAR}={self.token}".encode()
        stepd = os.path.realpath(_program("slurmstepd"))
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            pid = int(entry.name)
            if marker in _environ(pid) or (_exe(pid) == stepd and self._holds_root(pid)):
                found.append(pid)
        return sorted(found)

    def _holds_root(self, pid: int) -> bool:
        """pid's working folder or one of its open files is under ROOT."""
        try:
            paths = [os.readlink(f"/proc/{pid}/cwd")]
            paths += [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            return False
        return any(Path(p).is_relative_to(self.root) for p in paths)

    def log_tail(self, *daemons: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the daemons' logs under log/ (all of them when none is named: "slurmd sim3"),
        each headed by its file name; NAME.out is what the daemon wrote to stdout and stderr."""
        stems = {name.replace(" ", "-") for name in daemons}
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            if stems and path.stem not in stems:
                continue
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def _known(self, node: str) -> None:
        if node not in self.nodes:
            raise ValueError(f"{node!r} is not a node of this cluster ({', '.join(self.nodes)})")

    # --- start ---------------------------------------------------------------------------------

    def _lay_out(self) -> None:
        for sub in ("log", "run", "jobs", "spool/ctld", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        (self.root / "plugstack.conf").write_text("")  # not /etc/slurm's
        prolog = self.root / "taskprolog"
        prolog.write_text(self._task_prolog())
        prolog.chmod(0o755)
        ports = free_ports(1 + len(self.nodes))
        self.controller_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))
        self.conf_path.write_text(self._conf())
        (self.root / "gres.conf").write_text("".join(
            f"NodeName={node} Name=gpu File={path}\n" for node in self.gpus for path in self._gpu_devices(node)))

    def _gpu_devices(self, node: str) -> list[Path]:
        """The node's GPU device files for gres.conf: character devices 1:3 (the null device's numbers)."""
        folder = self.root / "gres" / node
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"nvidia{i}" for i in range(self.gpus[node])]
        for path in paths:
            if not path.exists():
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        return paths

    def _conf(self) -> str:
        text = _CONF.format(root=self.root, cluster=CLUSTER_NAME, ctld_port=self.controller_port,
                            slurmd_port=next(iter(self.node_ports.values())))
        if self.gpus:  # GPUs as GPU clusters have them: gres, and the select plugin that places steps on them
            text = text.replace("SelectType=select/linear", "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core")
            text += "GresTypes=gpu\n"
        for node, address in self.nodes.items():
            gres = f" Gres=gpu:{self.gpus[node]}" if node in self.gpus else ""
            text += (f"NodeName={node} NodeHostname=localhost NodeAddr={address} Port={self.node_ports[node]}"
                     f" CPUs=1{gres} State=UNKNOWN\n")
        for i, (partition, members) in enumerate(self.partitions.items()):
            default = "YES" if i == 0 else "NO"
            text += f"PartitionName={partition} Nodes={','.join(members)} Default={default} MaxTime=INFINITE State=UP\n"
        return text

    def _task_prolog(self) -> str:
        """A shell script printing one `export NAME=value` line per variable of the task. slurmstepd (22.05)
        takes the value literally, from after the `=` to the end of the line (no quotes removed, nothing
        expanded), so the script prints each value as given and any value without a newline survives."""
        lines = [
            "#!/bin/sh",
            "# Written by fleet.sim.slurmcluster: the TaskProlog. Each `export NAME=value` line it prints sets",
            "# that variable of the task to value, taken literally up to the end of the line.",
            f"printf 'export %s=%s\\n' {MARKER_VAR} {shlex.quote(self.token)}",
            "path=$PATH",
            'case "$SLURMD_NODENAME" in',
        ]
        for node, env in self.task_env.items():
            lines.append(f"{shlex.quote(node)})")
            for name, value in env.items():
                if name == "PATH":
                    lines.append(f"  path={shlex.quote(value)}")
                else:
                    lines.append(f"  printf 'export %s=%s\\n' {name} {shlex.quote(value)}")
            lines.append("  ;;")
        venv_bin = shlex.quote(str(Path(sys.executable).parent))
        lines += [
            "esac",
            f'case ":$path:" in *:{venv_bin}:*) ;; *) path="${{path:+$path:}}"{venv_bin} ;; esac',
            "printf 'export PATH=%s\\n' \"$path\"",
            "",
        ]
        return "\n".join(lines)

    def _daemon_env(self) -> dict[str, str]:
        return {
            # slurmstepd and slurmctld's slurmscriptd write their process title over the start of their
            # environment block (seen: its first ~70 bytes zeroed in /proc/PID/environ): this room comes
            # first so that the marker, last, stays readable there.
            "FLEET_SLURM_TITLE_ROOM": "." * 512,
            "PATH": SBIN_PATH,
            "LANG": "C",
            "SLURM_CONF": str(self.conf_path),
            MARKER_VAR: self.token,
        }

    def _start_munged(self) -> None:
        socket_path = self.run_dir / "munge.sock"
        self._start_daemons({"munged": [
            _program("munged"), "--foreground", "--force", f"--key-file={self.root / 'munge.key'}",
            f"--socket={socket_path}", f"--pid-file={self.run_dir / 'munged.pid'}",
            f"--log-file={self.log_dir / 'munged.log'}", f"--seed-file={self.run_dir / 'munge.seed'}",
        ]})
        self._wait(socket_path.exists, START_TIMEOUT_S, lambda: f"munged made no socket at {socket_path}")

    def _start_daemons(self, argvs: Mapping[str, list[str]]) -> None:
        """Start daemons in the foreground (our children: we reap them); return once each one's pid file
        names it, it runs its program and it carries the marker."""
        for name, argv in argvs.items():
            with (self.log_dir / f"{name.replace(' ', '-')}.out").open("ab") as out:
                self._daemons[name] = subprocess.Popen(
                    argv, env=self._daemon_env(), cwd=self.root, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,  # no terminal's ^C: stop() ends them
                )
        for name, argv in argvs.items():
            self._wait_recorded(name, Path(argv[0]).name)

    def _wait_recorded(self, name: str, program: str) -> None:
        process = self._daemons[name]
        pid_file = self.run_dir / (f"slurmd-{name[7:]}.pid" if name.startswith("slurmd ") else f"{name}.pid")

        def recorded() -> bool:
            if process.poll() is not None:
                raise SlurmClusterError(f"{name} exited {process.returncode}:\n{self.log_tail(name)}")
            return _read_pid(pid_file) == process.pid and _is_ours(process.pid, program, self.token)

        self._wait(recorded, START_TIMEOUT_S, lambda: f"{name} wrote no pid file naming {process.pid} at {pid_file}")

    def _wait_idle(self) -> None:
        def all_idle() -> bool:
            for name in self.pids:
                if not self._alive(name):
                    raise SlurmClusterError(f"{name} (pid {self.pids[name]}) exited:\n{self.log_tail(name)}")
            with contextlib.suppress(SlurmClusterError):
                states = self.node_states()
                return all(states.get(node) == "idle" for node in self.nodes)
            return False

        self._wait(all_idle, START_TIMEOUT_S, lambda: "not every node is idle")

    def _wait(self, done: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
        """Poll done() until true; raise with what() and the logs' tails after timeout seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while not done():
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"{what()} within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    # --- stop ----------------------------------------------------------------------------------

    def _alive(self, name: str) -> bool:
        process = self._daemons.get(name)
        return process is not None and process.poll() is None

    def _cancel_all_jobs(self) -> None:
        """scancel every job and wait (bounded) until the queue is empty; on errors, the sweep is left."""
        with contextlib.suppress(SlurmClusterError, ValueError):
            jobs = self.jobs(STOP_TIMEOUT_S)
            if jobs:
                self.run("scancel", *map(str, jobs), timeout=STOP_TIMEOUT_S)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while jobs and time.monotonic() < deadline:
                time.sleep(0.1)
                jobs = self.jobs(STOP_TIMEOUT_S)

    def _end(self, processes: Sequence[subprocess.Popen[bytes]]) -> None:
        """SIGTERM the daemons, wait (bounded) for them all, SIGKILL those left; reap them."""
        for process in processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _sweep(self) -> None:
        """SIGKILL every process of this cluster still alive (slurmstepds, tasks), until none is (bounded)."""
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.05)


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.pathsep.join([os.environ.get("PATH", ""), SBIN_PATH]))


def _program(program: str) -> str:
    path = _which(program)
    if path is None:
        raise SlurmClusterError(f"{program} not found: apt-get install {PACKAGES}")
    return path


def _check_nodes(nodes: Mapping[str, str]) -> dict[str, str]:
    if not nodes:
        raise ValueError("a Slurm cluster needs at least one node")
    for name, address in nodes.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"node name {name!r}: letters, digits, '_', '.' and '-' only")
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            raise ValueError(f"node {name}: address {address!r} is not an IPv4 address") from None
        if not ip.is_loopback:
            raise ValueError(f"node {name}: address {address} is not a loopback address (127.x.y.z)")
    return dict(nodes)


def _check_partitions(partitions: Mapping[str, Sequence[str]] | None, nodes: Mapping[str, str]) -> dict[str, list[str]]:
    if partitions is None:
        return {DEFAULT_PARTITION: list(nodes)}
    if not partitions:
        raise ValueError("partitions: give at least one, or None for the default")
    checked: dict[str, list[str]] = {}
    for name, members in partitions.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"partition name {name!r}: letters, digits, '_', '.' and '-' only")
        if isinstance(members, str) or not members:
            raise ValueError(f"partition {name}: give a non-empty list of node names")
        unknown = [m for m in members if m not in nodes]
        if unknown:
            raise ValueError(f"partition {name}: unknown nodes {unknown}")
        checked[name] = list(members)
    return checked


def _check_task_env(
    task_env: Mapping[str, Mapping[str, str]] | None, nodes: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    checked: dict[str, dict[str, str]] = {}
    for node, env in (task_env or {}).items():
        if node not in nodes:
            raise ValueError(f"task_env for unknown node {node!r}")
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name) or name == MARKER_VAR:
                raise ValueError(f"task_env[{node!r}]: {name!r} cannot be set")
            if "\n" in value or "\0" in value:
                raise ValueError(f"task_env[{node!r}][{name!r}]: a TaskProlog cannot set a newline or NUL")
        checked[node] = dict(env)
    return checked


def _check_socket_room(root: Path, nodes: Mapping[str, str]) -> None:
    """Refuse a ROOT too long for the unix sockets under it: munged's, and each step's in its node's spool."""
    sockets = [root / "run" / "munge.sock"]
    sockets += [root / "spool" / n / f"{n}_{2**32 - 2}.{2**32 - 2}" for n in nodes]
    longest = max(sockets, key=lambda p: len(bytes(p)))
    if len(bytes(longest)) > SUN_PATH_MAX:
        raise ValueError(f"root {root} is too long for unix sockets like {longest}: use a shorter one")



def _listens(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


def _is_ours(pid: int, program: str, token: str) -> bool:
    """pid is a live process running program (its real path) and carrying this cluster's marker."""
    if f"{MARKER_VAR}={token}".encode() not in _environ(pid):
        return False
    return _exe(pid) == os.path.realpath(_program(program))  # Debian: /usr/sbin/slurmd -> ... -> slurmd-wlm


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
