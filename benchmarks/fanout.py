"""Fan-out side by side: `fleet reset` against a raw asyncssh floor, pdsh and Ansible, behind real OpenSSH.

N loopback hosts (127.0.0.2, .3, ...) are served by the real /usr/sbin/sshd: one daemon per 16
addresses, all on the same port (so pdsh works unmodified), each daemon with its own host key. Every
host is a simulated 8-GPU node (fleet.sim.node.SimNode: one serving unit holding all 8 GPUs). One
client key serves every host; `Match LocalAddress` gives each address its own authorized_keys file,
whose `environment="PATH=<node bin>:..."` makes that node's fake nvidia-smi/systemctl the ones found.

Per size and repetition (interleaved; the units are restarted before every measured run):

  fleet    `python -m fleet reset -i INV -g all -y --json --log-dir D` (the real CLI, a subprocess)
  floor    a minimal asyncssh script: one connection per host, all hosts at once, running exactly the
           wire command lines fleet ran on that host in that repetition (from its per-node logs; the
           lock holder is run the same way, stdin open until the host is done)
  pdsh     the same commands, one `pdsh -R ssh -w ... -f N` invocation per distinct command line and
           step (hosts whose line differs get their own invocation, all of a step's at once)
  ansible  the same commands, one play, `raw` over a per-host loop, forks=N, ControlPersist on

Each tool runs under a small wrapper (`_measure`, a child subreaper): wall time, CPU of the whole
client process tree (getrusage(RUSAGE_CHILDREN) after every descendant, orphans such as ssh
ControlPersist masters included, was reaped), ru_maxrss (largest single process), the tree's summed
PSS sampled over time, and the machine's busy CPU over the same interval (/proc/stat): what the
servers and the simulated nodes cost is that minus the client's. Both share this machine's cores.

    python benchmarks/fanout.py [--sizes 64,256,512] [--reps 3] [--tools fleet,floor,pdsh,ansible]
                                [--profile] [--bench-venv benchmarks/.bench-venv] [--json PATH]

Writes benchmarks/results/<timestamp>.json (and the py-spy profile next to it with --profile).
Everything it starts is ended by pid, and its temp dir removed, on success, failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import platform
import re
import resource
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SSHD = Path("/usr/sbin/sshd")
ADDRESSES_PER_SSHD = 16
UNIT = "sglang.service"
ALL_GPUS = (0, 1, 2, 3, 4, 5, 6, 7)
TOOLS = ("fleet", "floor", "pdsh", "ansible")
SIM_NODE_VAR = "FLEET_SIM_NODE"
PR_SET_CHILD_SUBREAPER = 36

SSHD_CONFIG = """\
Port {port}
{listen}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile none
PermitUserEnvironment yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
PrintMotd no
X11Forwarding no
MaxStartups 1000:30:2000
MaxSessions 1000
LogLevel ERROR
{matches}
"""


# ============================================================== small helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def set_subreaper() -> None:
    """Orphaned descendants are re-parented to this process (so they can be reaped, counted, killed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def process_table() -> dict[int, int]:
    """pid -> ppid for every live process (one /proc scan)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] != b"Z":
                table[int(entry.name)] = int(fields[1])
    return table


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    table = process_table() if table is None else table
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in table.items():
        children[ppid].append(pid)
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def reap_children() -> None:
    """Reap every child that has exited. This process is a subreaper: the workers of a stopped unit come
    back to it, and left as zombies they would pile up by N a run (pids, and a longer /proc for every
    node's holder scan). Popen objects whose child is reaped here read returncode 0, which is fine."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def mem_available_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def addresses(count: int) -> list[str]:
    """127.0.0.2 upwards, skipping .0 and .255 last octets."""
    out: list[str] = []
    address = ipaddress.IPv4Address("127.0.0.2")
    while len(out) < count:
        if address.packed[3] not in (0, 255):
            out.append(str(address))
        address += 1
    return out


def free_port(addrs: list[str]) -> int:
    """A TCP port free on every address."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            for address in addrs:
                with socket.socket() as s:
                    s.bind((address, port))
            return int(port)
        except OSError:
            continue
    raise RuntimeError("no port free on every address")


def listening(port: int) -> set[str]:
    """IPv4 addresses with a socket in LISTEN on port (/proc/net/tcp)."""
    found = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            local, state = parts[1], parts[3]
            hexaddr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(hexaddr)[::-1]))
    return found


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


# ============================================================== _measure: one tool run, its whole tree


def _read_pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:
        return 0


def measure_main(argv: list[str]) -> int:
    """`_measure OUT.json TIMEOUT_S MIN_FREE_MB -- CMD...`: run CMD, reap its whole tree, report usage."""
    out_path, timeout_s, min_free_mb = Path(argv[0]), float(argv[1]), int(argv[2])
    cmd = argv[argv.index("--") + 1:]
    set_subreaper()
    me = os.getpid()
    peak = {"pss_kb": 0, "procs": 0, "samples": 0}
    stop = threading.Event()
    aborted: list[str] = []

    def sampler() -> None:
        interval = 0.25
        while not stop.wait(interval):
            started = time.monotonic()
            tree = descendants(me)
            total = sum(_read_pss_kb(pid) for pid in tree)
            peak["pss_kb"] = max(peak["pss_kb"], total)
            peak["procs"] = max(peak["procs"], len(tree))
            peak["samples"] += 1
            if mem_available_mb() < min_free_mb and not aborted:
                aborted.append(f"memory: MemAvailable under {min_free_mb} MB")
                kill_pids(tree)
            # at most ~10% of one core on sampling, however large the tree
            interval = max(0.25, 10 * (time.monotonic() - started))

    self_before = resource.getrusage(resource.RUSAGE_SELF)
    busy_before, started = machine_busy_s(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        aborted.append(f"timeout after {timeout_s:g} s")
        kill_pids(descendants(me))
        rc = proc.wait()
    wall, busy_after = time.monotonic() - started, machine_busy_s()
    stop.set()
    thread.join()
    # Orphans (ssh ControlPersist masters, anything a tool left running) were re-parented here:
    # end them and reap them, so their CPU is in RUSAGE_CHILDREN too.
    orphans = descendants(me)
    kill_pids(orphans, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                kill_pids(descendants(me))
            time.sleep(0.02)
    kids, own = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    own_cpu = (own.ru_utime + own.ru_stime) - (self_before.ru_utime + self_before.ru_stime)
    result = {
        "rc": rc, "wall_s": wall, "cpu_user_s": kids.ru_utime, "cpu_sys_s": kids.ru_stime,
        "cpu_s": kids.ru_utime + kids.ru_stime, "maxrss_mb": kids.ru_maxrss / 1024,
        "peak_tree_pss_mb": peak["pss_kb"] / 1024, "peak_procs": peak["procs"], "rss_samples": peak["samples"],
        "machine_busy_s": busy_after - busy_before, "wrapper_cpu_s": own_cpu, "orphans": len(orphans),
        "aborted": aborted[0] if aborted else None,
    }
    out_path.write_text(json.dumps(result))
    return 0


# ============================================================== _floor: the raw asyncssh floor


def floor_main(argv: list[str]) -> int:
    """`_floor PLAN.json`: per host one connection, the planned lines in order, all hosts at once."""
    import asyncio

    import asyncssh

    plan = json.loads(Path(argv[0]).read_text())
    known_hosts = asyncssh.read_known_hosts(plan["known_hosts"])
    key = asyncssh.read_private_key(plan["identity_file"])

    async def one(host: dict[str, Any]) -> tuple[int, str | None]:
        ran = 0
        try:
            async with asyncssh.connect(
                host["address"], port=plan["port"], username=plan["user"], known_hosts=known_hosts,
                client_keys=[key], agent_path=None, config=None, connect_timeout=120,
            ) as conn:
                holder = None
                if host["hold"]:
                    holder = await conn.create_process(host["hold"], stdin=asyncssh.PIPE)
                    first = await holder.stdout.readline()
                    ran += 1
                    if first.strip() != "locked":
                        return ran, f"lock: {first.strip()!r}"
                for line in host["cmds"]:
                    await conn.run(line, check=False, stdin=asyncssh.DEVNULL, timeout=300)
                    ran += 1
                if holder is not None:
                    holder.stdin.write_eof()
                    await holder.wait(timeout=30)
            return ran, None
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            return ran, f"{type(exc).__name__}: {exc}"

    async def main() -> list[tuple[int, str | None]]:
        return await asyncio.gather(*(one(h) for h in plan["hosts"]))

    results = asyncio.run(main())
    errors = [e for _, e in results if e]
    print(json.dumps({"hosts": len(results), "failed": len(errors), "commands": sum(r for r, _ in results),
                      "errors": errors[:5]}))
    return 0


# ============================================================== the testbed: nodes behind real sshd


class Testbed:
    """N simulated nodes, ceil(N/16) sshd daemons on one port, one client key, the inventory."""

    def __init__(self, root: Path, count: int, *, linger_s: float, protected_daemon: bool) -> None:
        self.root = root
        self.count = count
        self.linger_s = linger_s
        self.protected_daemon = protected_daemon
        self.names = [f"n{i:04d}" for i in range(1, count + 1)]
        self.addrs = dict(zip(self.names, addresses(count), strict=True))
        self.nodes: dict[str, Any] = {}
        self.sshds: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        self.inventory = root / "inventory.yaml"

    # ---------------------------------------------------------- nodes

    def _spec(self, name: str) -> Any:
        from fleet.sim.node import NodeSpec, UnitSpec
        unit = UnitSpec(UNIT, gpus=ALL_GPUS, mib=70_000, process_name="sglang")
        return NodeSpec(name=name, units=(unit,), linger_s=self.linger_s, protected_daemon=self.protected_daemon)

    def start_nodes(self) -> None:
        from fleet.sim.node import SimNode
        for name in self.names:
            self.nodes[name] = SimNode(self.root / "nodes" / name, self._spec(name))

        def up(node: Any) -> None:
            node.setup()
            node.start()

        self._each(up)

    def restart_units(self) -> None:
        """Make every node busy again: its unit running, its worker holding all 8 GPUs."""
        def busy(node: Any) -> None:
            if node.unit_state(UNIT) != "active":
                node.start_unit(UNIT)

        self._each(busy)
        reap_children()

    def verify(self, owners: dict[str, str]) -> int:
        """Nodes where the run's lock command wrote `owners[name]` and the unit is no longer active:
        proof that the tool's first and its drain commands ran there."""
        from fleet.lock import owner_file
        ok = 0
        for name, owner in owners.items():
            node = self.nodes[name]
            with contextlib.suppress(OSError):
                written = Path(owner_file(node.lock_file)).read_text().strip()
                ok += written == owner and node.unit_state(UNIT) != "active"
        return ok

    def stop_nodes(self) -> None:
        self._each(lambda node: node.stop(), check=False)

    def _each(self, fn: Any, check: bool = True) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(fn, node) for node in self.nodes.values()]
            for future in futures:
                exc = future.exception()
                if exc is not None and check:
                    raise exc

    # ---------------------------------------------------------- sshd

    def start_sshd(self) -> None:
        SSHD.exists() or sys.exit(f"{SSHD} not found: apt-get install openssh-server")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fanout", "-f", str(self.key)],
                       check=True)
        public = (self.key.with_suffix(".pub")).read_text().strip()
        keys_dir = self.root / "authorized"
        keys_dir.mkdir()
        addrs = list(self.addrs.values())
        self.port = free_port(addrs)
        known: list[str] = []
        for first in range(0, self.count, ADDRESSES_PER_SSHD):
            names = self.names[first:first + ADDRESSES_PER_SSHD]
            directory = self.root / "sshd" / f"{first // ADDRESSES_PER_SSHD:03d}"
            directory.mkdir(parents=True)
            host_key = directory / "ssh_host_ed25519_key"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
            key_type, key_b64 = host_key.with_suffix(".pub").read_text().split()[:2]
            matches = []
            for name in names:
                address, node = self.addrs[name], self.nodes[name]
                env = node.env()
                # HOME: bash started by sshd sources ~/.bashrc even for `ssh host cmd`; this machine's
                # root dotfiles (pyenv init: ~0.2 s of CPU a command) are not part of a GPU node
                environment = {"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"], SIM_NODE_VAR: str(node.root),
                               "HOME": str(node.root)}
                options = ",".join(f'environment="{k}={v}"' for k, v in environment.items())
                (keys_dir / address).write_text(f"{options} {public}\n")
                matches.append(f"Match LocalAddress {address}\n    AuthorizedKeysFile {keys_dir / address}")
                known.append(f"[{address}]:{self.port} {key_type} {key_b64}")
            config = directory / "sshd_config"
            config.write_text(SSHD_CONFIG.format(
                port=self.port, dir=directory, listen="\n".join(f"ListenAddress {self.addrs[n]}" for n in names),
                matches="\n".join(matches)))
            with (directory / "sshd.log").open("wb") as err:
                self.sshds.append(subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=err,
                                                   stdin=subprocess.DEVNULL))
        self.known_hosts.write_text("\n".join(known) + "\n")
        deadline = time.monotonic() + 30
        while (missing := set(addrs) - listening(self.port)) and time.monotonic() < deadline:
            dead = [p.args for p in self.sshds if p.poll() is not None]
            if dead:
                raise RuntimeError(f"sshd exited: {dead}; see {self.root / 'sshd'}/*/sshd.log")
            time.sleep(0.1)
        if missing:
            raise RuntimeError(f"sshd not listening on {len(missing)} addresses, e.g. {sorted(missing)[:3]}")

    def stop_sshd(self) -> None:
        """Kill every sshd daemon and everything it started (connections, their commands), by pid."""
        table = process_table()
        for proc in self.sshds:
            kill_pids(descendants(proc.pid, table))
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self.sshds:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.sshds.clear()

    # ---------------------------------------------------------- inventory

    def write_inventory(self) -> None:
        import yaml
        defaults = {
            "user": "root", "port": self.port, "identity_file": str(self.key), "known_hosts": str(self.known_hosts),
            "gpus": 8, "services": [UNIT],
            # 2 cores serve all N nodes: generous bounds, so a slow box is not mistaken for a failing node
            "connect_timeout": 120, "command_timeout": 120, "drain_timeout": 120, "settle_timeout": 120,
        }
        hosts = {name: {"address": self.addrs[name], "devices": [node.devices_glob],
                        "nvidia_smi": node.nvidia_smi_path, "lock_file": node.lock_file}
                 for name, node in self.nodes.items()}
        self.inventory.write_text(yaml.safe_dump({"defaults": defaults, "hosts": hosts}, sort_keys=False))


# ============================================================== from fleet's logs to the others' plans


def fleet_commands(log_dir: Path) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """host -> the `command` events of its JSONL log, in order (the lock holder is logged when released);
    and how many hosts took the lock without a `command` event for it.

    fleet logs the lock command when its release returns a result; when the release times out
    (RELEASE_TIMEOUT_S, a loaded machine) the holder is killed and no `command` event is written. Such a
    host's lock command is rebuilt from its `lock_acquired` event (fleet.lock.lock_argv, the run id, the
    bound the other hosts' lock commands had) so that every replay runs the same commands.
    """
    from fleet.lock import LOCK_WAIT_S, lock_argv
    out: dict[str, list[dict[str, Any]]] = {}
    acquired: dict[str, dict[str, Any]] = {}
    for path in sorted(log_dir.glob("*/*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[path.stem] = [e for e in events if e.get("event") == "command"]
        acquired.update({path.stem: e for e in events if e.get("event") == "lock_acquired"})
    bounds = [e["timeout_s"] for evs in out.values() for e in evs if e["argv"][0] == "flock"]
    missing = [h for h, evs in out.items() if h in acquired and not any(e["argv"][0] == "flock" for e in evs)]
    for host in missing:
        event = acquired[host]
        out[host].append({"event": "command", "argv": lock_argv(event["lock_file"], event["run_id"], LOCK_WAIT_S),
                          "timeout_s": median(bounds), "rebuilt": True})
    return out, len(missing)


def lock_argv(argv: list[str], owner: str | None) -> list[str]:
    """The lock command with `owner` written to the lock's owner file instead of fleet's run id: after a
    replay, every node's owner file says which tool's lock command last ran there."""
    return [*argv[:-2], owner, argv[-1]] if owner else list(argv)


def replay_owner(events: list[dict[str, Any]], tool: str, rep: int) -> str:
    """A run id of fleet's shape for a replay: `<fleet's timestamp>-<tool><rep>`."""
    fleet_run = next((e["argv"][-2] for e in events if e["argv"][0] == "flock"), "run-")
    return f"{fleet_run.split('-', 1)[0]}-{tool}{rep}"


def wire_lines(events: list[dict[str, Any]], owner: str | None = None) -> tuple[str | None, list[str]]:
    """(the lock holder's wire line, the other commands' wire lines), rebuilt as fleet.ssh does."""
    from fleet.probes import reap
    from fleet.transport import bounded_argv, command_line
    hold, cmds = None, []
    for e in events:
        if e["argv"] and e["argv"][0] == "flock":
            hold = command_line(bounded_argv(lock_argv(e["argv"], owner), e["timeout_s"]))
        else:
            cmds.append(command_line(bounded_argv(e["argv"], e["timeout_s"], mark=reap.marker(secrets.token_hex(8)))))
    return hold, cmds


def generic_line(events: list[dict[str, Any]], index: int, root: str, owner: str | None = None) -> str:
    """One host's command `index` with its node folder written as "$FLEET_SIM_NODE" (expanded by the node's
    login shell to the same path) and a token shared by every host: the same line for every host, for pdsh."""
    from fleet.probes import reap
    from fleet.transport import bounded_argv
    e = events[index]
    is_hold = e["argv"][0] == "flock"
    mark = None if is_hold else reap.marker(f"{index + 1:016x}")
    words = []
    argv = lock_argv(e["argv"], owner) if is_hold else e["argv"]
    for arg in bounded_argv(argv, e["timeout_s"], mark=mark):
        pieces = arg.split(root)
        if len(pieces) == 1:
            words.append(shlex.quote(arg))
        else:
            words.append(f'"${SIM_NODE_VAR}"'.join(shlex.quote(p) if p else "" for p in pieces))
    line = " ".join(words)
    return f"{line} </dev/null" if is_hold else line


def ordered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lock holder first (it is taken before anything else), then the rest in order."""
    return sorted(events, key=lambda e: e["argv"][0] != "flock")


# ============================================================== the runs


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.python = sys.executable
        self.venv = Path(args.bench_venv).resolve()
        self.current: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "PYTHONSTARTUP")}
        self.env["PYTHONPATH"] = str(REPO)
        # The OpenSSH client gets the key exchange asyncssh (fleet, floor) negotiates with this sshd;
        # OpenSSH 9.2's default, sntrup761x25519, costs ~6x the client CPU of curve25519 per connection.
        self.kex_option = f" -o KexAlgorithms={args.ssh_kex}" if args.ssh_kex else ""

    def measure(self, label: str, cmd: list[str], env: dict[str, str] | None = None,
                stdout: Path | None = None) -> dict[str, Any]:
        out = self.tmp / f"measure-{label}.json"
        stdout_path = stdout or self.tmp / f"{label}.out"
        wrapper = [self.python, str(Path(__file__).resolve()), "_measure", str(out), str(self.args.run_timeout),
                   str(self.args.min_free_mb), "--", *cmd]
        with stdout_path.open("wb") as so, (self.tmp / f"{label}.err").open("wb") as se:
            self.current = subprocess.Popen(wrapper, stdout=so, stderr=se, env=env or self.env,
                                            start_new_session=True, cwd=self.tmp)
            self.current.wait()
            self.current = None
        if not out.exists():
            raise RuntimeError(f"{label}: the measuring wrapper failed: {(self.tmp / f'{label}.err').read_text()[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["stdout_path"], result["stderr_path"] = str(stdout_path), str(self.tmp / f"{label}.err")
        return result

    def abort_current(self) -> None:
        proc = self.current
        if proc is not None and proc.poll() is None:
            kill_pids(descendants(proc.pid) + [proc.pid])
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    # ---------------------------------------------------------- fleet

    def run_fleet(self, bed: Testbed, label: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        log_dir = self.tmp / f"logs-{label}"
        cmd = [self.python, "-m", "fleet", "reset", "-i", str(bed.inventory), "-g", "all", "-y", "--json",
               "--log-dir", str(log_dir)]
        m = self.measure(label, cmd)
        try:
            report = json.loads(Path(m["stdout_path"]).read_text())
            summary = report["summary"]
            m["ok_hosts"] = summary["clean"]
            m["failed_hosts"] = bed.count - summary["clean"]
            errors = Counter(h["error"] for h in report["hosts"].values() if h["error"])
            m["errors"] = [f"{n}x {e}" for e, n in errors.most_common(3)]
            m["fleet_duration_s"] = report["duration_s"]
            m["verified_hosts"] = bed.verify({name: report["run_id"] for name in bed.names})
        except (ValueError, KeyError, OSError) as exc:
            m["ok_hosts"], m["failed_hosts"] = 0, bed.count
            m["errors"] = [f"no JSON report ({exc}); stderr: {Path(m['stderr_path']).read_text()[-500:]}"]
        commands, m["lock_command_not_logged"] = fleet_commands(log_dir)
        counts = [len(v) for v in commands.values()]
        m["commands"] = sum(counts)
        m["commands_per_host"] = {"median": median(counts), "min": min(counts, default=0),
                                  "max": max(counts, default=0)}
        m["commands_by_step"] = dict(Counter(
            f"{e.get('step', 'lock')}:{os.path.basename(e['argv'][0])}" for evs in commands.values() for e in evs))
        return m, commands

    # ---------------------------------------------------------- floor

    def run_floor(self, bed: Testbed, label: str, commands: dict[str, list[dict[str, Any]]],
                  rep: int) -> dict[str, Any]:
        hosts = []
        for name, events in commands.items():
            hold, cmds = wire_lines(events, replay_owner(events, "floor", rep))
            hosts.append({"address": bed.addrs[name], "hold": hold, "cmds": cmds})
        plan = self.tmp / f"plan-{label}.json"
        plan.write_text(json.dumps({"port": bed.port, "user": "root", "identity_file": str(bed.key),
                                    "known_hosts": str(bed.known_hosts), "hosts": hosts}))
        m = self.measure(label, [self.python, str(Path(__file__).resolve()), "_floor", str(plan)])
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "floor", rep) for n, ev in commands.items()})
        try:
            out = json.loads(Path(m["stdout_path"]).read_text())
            m["failed_hosts"], m["commands"], m["errors"] = out["failed"], out["commands"], out["errors"]
            m["failed_hosts"] += bed.count - out["hosts"]
        except (ValueError, KeyError, OSError) as exc:
            m["failed_hosts"], m["commands"] = bed.count, 0
            m["errors"] = [f"no output ({exc}): {Path(m['stderr_path']).read_text()[-500:]}"]
        return m

    # ---------------------------------------------------------- pdsh

    def run_pdsh(self, bed: Testbed, label: str, commands: dict[str, list[dict[str, Any]]],
                 rep: int) -> dict[str, Any]:
        work = self.tmp / f"pdsh-{label}"
        work.mkdir()
        ssh_args = (f"-F /dev/null -p {bed.port} -i {bed.key} -o IdentitiesOnly=yes -o BatchMode=yes "
                    f"-o UserKnownHostsFile={bed.known_hosts} -o StrictHostKeyChecking=yes{self.kex_option}")
        steps = max((len(v) for v in commands.values()), default=0)
        script = ["#!/bin/bash", "cd " + shlex.quote(str(work))]
        invocations = total = 0
        for j in range(steps):
            groups: dict[str, list[str]] = defaultdict(list)
            for name, events in commands.items():
                events = ordered(events)
                if j < len(events):
                    owner = replay_owner(events, "pdsh", rep)
                    groups[generic_line(events, j, str(bed.nodes[name].root), owner)].append(bed.addrs[name])
            for g, (line, addrs) in enumerate(groups.items()):
                hosts_file = work / f"hosts-{j}-{g}"
                hosts_file.write_text("\n".join(addrs) + "\n")
                total += len(addrs)
                invocations += 1
                script.append(f"pdsh -R ssh -l root -t 120 -f {len(addrs)} -w ^{hosts_file.name} "
                              f"{shlex.quote(line)} >out-{j}-{g} 2>err-{j}-{g} &")
            script.append("wait")
        (work / "run.sh").write_text("\n".join(script) + "\n")
        env = dict(self.env, PDSH_SSH_ARGS_APPEND=ssh_args)
        m = self.measure(label, ["/bin/bash", str(work / "run.sh")], env=env)
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "pdsh", rep) for n, ev in commands.items()})
        failed: set[str] = set()
        bad = re.compile(r"^pdsh@[^:]*: ([0-9.]+): (ssh exited with exit code 255|.*timed? ?out)")
        for err in work.glob("err-*"):
            for line in err.read_text(errors="replace").splitlines():
                match = bad.match(line)
                if match:
                    failed.add(match.group(1))
        m["failed_hosts"], m["commands"], m["invocations"] = len(failed), total, invocations
        m["errors"] = sorted(failed)[:5]
        return m

    # ---------------------------------------------------------- ansible

    def run_ansible(self, bed: Testbed, label: str, commands: dict[str, list[dict[str, Any]]],
                    rep: int) -> dict[str, Any]:
        import yaml

        class Unsafe(str):
            pass

        class Dumper(yaml.SafeDumper):
            pass

        Dumper.add_representer(Unsafe, lambda d, v: d.represent_scalar("!unsafe", str(v), style="'"))
        work = self.tmp / f"ansible-{label}"
        (work / "cp").mkdir(parents=True)
        hosts = {}
        for name, events in commands.items():
            events = ordered(events)
            root = str(bed.nodes[name].root)
            owner = replay_owner(events, "ansible", rep)
            hold, cmds = wire_lines(events, owner)
            lines = ([generic_line(events, 0, root, owner).replace(f'"${SIM_NODE_VAR}"', shlex.quote(root))]
                     if hold else []) + cmds
            hosts[name] = {"ansible_host": bed.addrs[name], "fleet_cmds": [Unsafe(c) for c in lines]}
        common = (f"-F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={bed.known_hosts} "
                  f"-o StrictHostKeyChecking=yes{self.kex_option}")
        inventory = {"all": {"hosts": hosts, "vars": {
            "ansible_port": bed.port, "ansible_user": "root", "ansible_ssh_private_key_file": str(bed.key),
            "ansible_ssh_common_args": common}}}
        (work / "inventory.yml").write_text(yaml.dump(inventory, Dumper=Dumper, sort_keys=False, width=1 << 20))
        (work / "play.yml").write_text(yaml.safe_dump([{
            "hosts": "all", "gather_facts": False,
            "tasks": [{"name": "fleet's commands", "raw": "{{ item }}", "loop": "{{ fleet_cmds }}",
                       "failed_when": False, "loop_control": {"label": "cmd"}}]}], sort_keys=False))
        (work / "ansible.cfg").write_text(
            f"[defaults]\nforks = {bed.count}\nhost_key_checking = True\ngathering = explicit\n"
            f"retry_files_enabled = False\ntimeout = 120\n"
            f"[ssh_connection]\nssh_args = -o ControlMaster=auto -o ControlPersist=60s\n"
            f"control_path_dir = {work / 'cp'}\ncontrol_path = %(directory)s/%%C\n")
        env = dict(self.env, ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_HOME=str(work / "home"),
                   ANSIBLE_LOCAL_TEMP=str(work / "tmp"), ANSIBLE_NOCOLOR="1")
        env.pop("PYTHONPATH", None)
        m = self.measure(label, [str(self.venv / "bin" / "ansible-playbook"), "-i", str(work / "inventory.yml"),
                                 str(work / "play.yml")], env=env)
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "ansible", rep) for n, ev in commands.items()})
        failed = 0
        recap = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
        seen = 0
        for line in Path(m["stdout_path"]).read_text(errors="replace").splitlines():
            match = recap.match(line)
            if match:
                seen += 1
                failed += int(match.group(4)) > 0 or int(match.group(5)) > 0
        m["failed_hosts"] = failed + (bed.count - seen)
        m["commands"] = sum(len(h["fleet_cmds"]) for h in hosts.values())
        m["errors"] = [] if not m["failed_hosts"] else [Path(m["stdout_path"]).read_text()[-500:]]
        return m

    # ---------------------------------------------------------- profile

    def profile(self, bed: Testbed) -> dict[str, Any]:
        py_spy = self.venv / "bin" / "py-spy"
        raw = self.tmp / "profile.txt"
        # --gil: only samples of the thread holding the GIL, i.e. Python running (a sampler counts wall time
        # of any thread not idle, and on a busy machine idle detection misses blocked pool threads)
        cmd = [str(py_spy), "record", "--format", "raw", "--nolineno", "--rate", "100", "--subprocesses", "--gil",
               "-o", str(raw), "--", self.python, "-m", "fleet", "reset", "-i", str(bed.inventory), "-g", "all",
               "-y", "--json", "--log-dir", str(self.tmp / "logs-profile")]
        m = self.measure("profile", cmd)
        if not raw.exists():
            return {"error": Path(m["stderr_path"]).read_text()[-1000:]}
        stamp = self.args.stamp
        RESULTS.mkdir(parents=True, exist_ok=True)
        kept = RESULTS / f"{stamp}-profile-{bed.count}.folded"
        shutil.copy(raw, kept)
        return {"folded": str(kept), "wall_s": m["wall_s"], **summarise_profile(raw.read_text())}


def summarise_profile(text: str, top: int = 12) -> dict[str, Any]:
    """Top frames by own time (leaf samples) and cumulative time (stacks containing them), and by file."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    own_file: Counter[str] = Counter()
    by_fleet: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        own_file[_file_of(frames[-1])] += n
        for frame in set(frames):
            cumulative[frame] += n
        # what fleet code the time is spent for: the deepest frame in fleet/ (startup/imports otherwise)
        mine = [f for f in frames if "(fleet/" in f and not f.startswith("<module>")]
        by_fleet[mine[-1] if mine else "(outside fleet frames: imports, interpreter start/exit)"] += n

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "samples": n, "pct": round(100 * n / total, 1)} for f, n in counter.most_common(top)]

    return {"samples": total, "top_own": rows(own), "top_cumulative": rows(cumulative),
            "top_own_by_file": rows(own_file), "top_by_fleet_frame": rows(by_fleet)}


def _file_of(frame: str) -> str:
    match = re.search(r"\(([^()]*)\)$", frame)
    if not match:
        return frame
    path = match.group(1)
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


# ============================================================== orchestration and reporting


def run_size(bench: Bench, count: int, results: dict[str, Any]) -> None:
    args = bench.args
    root = bench.tmp / f"bed-{count}"
    root.mkdir()
    bed = Testbed(root, count, linger_s=args.linger, protected_daemon=args.protected_daemon)
    size: dict[str, Any] = {"nodes": count, "runs": {t: [] for t in args.tools}}
    results["sizes"][str(count)] = size
    try:
        t0 = time.monotonic()
        bed.start_nodes()
        log(f"N={count}: {count} nodes up in {time.monotonic() - t0:.1f} s; MemAvailable {mem_available_mb()} MB")
        bed.start_sshd()
        bed.write_inventory()
        log(f"N={count}: {len(bed.sshds)} sshd daemons on port {bed.port}")
        others = [t for t in args.tools if t != "fleet"]
        for rep in range(args.reps):
            rotation = others[rep % len(others):] + others[:rep % len(others)] if others else []
            commands: dict[str, list[dict[str, Any]]] = {}
            for tool in ["fleet", *rotation]:
                if tool not in args.tools:
                    continue
                if tool != "fleet" and not commands:
                    log(f"N={count} rep {rep + 1}: no fleet commands to replay; {tool} skipped")
                    continue
                bed.restart_units()
                time.sleep(args.pause)
                label = f"{count}-{rep}-{tool}"
                if tool == "fleet":
                    m, commands = bench.run_fleet(bed, label)
                else:
                    m = getattr(bench, f"run_{tool}")(bed, label, commands, rep)
                m["rep"] = rep
                size["runs"][tool].append(m)
                log(f"N={count} rep {rep + 1}/{args.reps} {tool:8s} wall {m['wall_s']:7.2f} s  "
                    f"client CPU {m['cpu_s']:7.2f} s  ({1000 * m['cpu_s'] / count:6.1f} ms/host)  "
                    f"maxrss {m['maxrss_mb']:6.1f} MB  failed {m['failed_hosts']}  "
                    f"verified {m.get('verified_hosts', '?')}/{count}"
                    + (f"  [{m['aborted']}]" if m.get("aborted") else "")
                    + (f"  ({m['lock_command_not_logged']} lock commands not logged by fleet: rebuilt)"
                       if m.get("lock_command_not_logged") else "")
                    + (f"  e.g. {m['errors'][0][:160]}" if m.get("errors") else ""))
        # The nodes are clean now (the last run stopped every unit): what a reset of healthy hosts costs.
        time.sleep(args.pause)
        m, _ = bench.run_fleet(bed, f"{count}-idle-fleet")
        size["idle_fleet"] = m
        log(f"N={count} fleet on already clean nodes: wall {m['wall_s']:.2f} s, client CPU {m['cpu_s']:.2f} s, "
            f"{m['commands_per_host']['median']:g} commands/host, failed {m['failed_hosts']}")
        if args.profile and count == max(args.sizes) and "fleet" in args.tools:
            bed.restart_units()
            time.sleep(args.pause)
            log(f"N={count}: profiling one fleet reset under py-spy")
            results["profile"] = bench.profile(bed)
    finally:
        bench.abort_current()
        bed.stop_sshd()
        bed.stop_nodes()


def summarise(results: dict[str, Any]) -> None:
    for size in results["sizes"].values():
        n = size["nodes"]
        med: dict[str, dict[str, float]] = {}
        for tool, runs in size["runs"].items():
            if not runs:
                continue
            keys = ("wall_s", "cpu_s", "cpu_user_s", "cpu_sys_s", "maxrss_mb", "peak_tree_pss_mb",
                    "machine_busy_s", "failed_hosts", "commands")
            row = {k: median([float(r[k]) for r in runs]) for k in keys}
            row["cpu_ms_per_host"] = 1000 * row["cpu_s"] / n
            row["server_cpu_s"] = median([r["machine_busy_s"] - r["cpu_s"] - r["wrapper_cpu_s"] for r in runs])
            row["commands_per_host"] = row["commands"] / n
            row["reps"] = len(runs)
            row["verified_min"] = min(int(r.get("verified_hosts", 0)) for r in runs)
            med[tool] = row
        size["median"] = med
        ratios: dict[str, float] = {}

        def ratio(name: str, a: str, b: str, key: str) -> None:
            if a in med and b in med and med[b][key] > 0:
                ratios[name] = round(med[a][key] / med[b][key], 2)

        ratio("fleet/floor cpu", "fleet", "floor", "cpu_s")
        ratio("fleet/floor wall", "fleet", "floor", "wall_s")
        ratio("pdsh/fleet cpu", "pdsh", "fleet", "cpu_s")
        ratio("ansible/fleet cpu", "ansible", "fleet", "cpu_s")
        ratio("pdsh/fleet wall", "pdsh", "fleet", "wall_s")
        ratio("ansible/fleet wall", "ansible", "fleet", "wall_s")
        size["ratios"] = ratios
    # marginal client CPU per host: least-squares slope of median CPU over the sizes
    sizes = sorted(results["sizes"].values(), key=lambda s: s["nodes"])
    marginal = {}
    for tool in TOOLS:
        pts = [(s["nodes"], s["median"][tool]["cpu_s"]) for s in sizes if tool in s.get("median", {})]
        if len(pts) >= 2:
            mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            marginal[tool] = {"ms_per_host": round(1000 * slope, 2), "fixed_s": round(my - slope * mx, 3)}
    results["marginal_cpu"] = marginal


def print_table(results: dict[str, Any]) -> None:
    cores = os.cpu_count()
    print()
    print(f"fan-out: fleet vs raw asyncssh floor vs pdsh vs Ansible, real OpenSSH sshd on loopback; "
          f"medians of {results['reps']} interleaved repetitions")
    print(f"NOTE: the {cores} cores of this machine also run every sshd and every simulated node: 'client CPU' is "
          f"the client process tree only; 'servers CPU' = machine busy CPU - client CPU over the same interval.")
    head = (f"{'N':>5} {'tool':<8} {'wall s':>8} {'client CPU s':>12} {'ms/host':>8} {'maxRSS MB':>9} "
            f"{'tree PSS MB':>11} {'servers CPU s':>13} {'cmds/host':>9} {'failed':>6} {'verified':>8}")
    print(head)
    print("-" * len(head))
    for size in results["sizes"].values():
        for tool, row in size.get("median", {}).items():
            print(f"{size['nodes']:>5} {tool:<8} {row['wall_s']:>8.2f} {row['cpu_s']:>12.2f} "
                  f"{row['cpu_ms_per_host']:>8.1f} {row['maxrss_mb']:>9.1f} {row['peak_tree_pss_mb']:>11.1f} "
                  f"{row['server_cpu_s']:>13.1f} {row['commands_per_host']:>9.1f} {int(row['failed_hosts']):>6} "
                  f"{row['verified_min']:>8}")
        unlogged = [r.get("lock_command_not_logged", 0) for r in size["runs"].get("fleet", [])]
        if any(unlogged):
            print(f"      fleet logged no `command` event for the lock of {unlogged} hosts (per repetition): its release "
                  f"timed out; the replays rebuild it from `lock_acquired`")
        idle = size.get("idle_fleet")
        if idle:
            print(f"      fleet on already clean nodes (1 run): wall {idle['wall_s']:.2f} s, client CPU "
                  f"{idle['cpu_s']:.2f} s ({1000 * idle['cpu_s'] / size['nodes']:.1f} ms/host), "
                  f"{idle['commands_per_host']['median']:g} commands/host, failed {int(idle['failed_hosts'])}")
        if size.get("ratios"):
            print("      ratios: " + ", ".join(f"{k} {v}" for k, v in size["ratios"].items()))
    if results.get("marginal_cpu"):
        print("marginal client CPU per host (slope over sizes): " + ", ".join(
            f"{t} {v['ms_per_host']} ms (+{v['fixed_s']} s fixed)" for t, v in results["marginal_cpu"].items()))
    targets = results.get("targets")
    if targets:
        print("issue targets at N=%s:" % targets["n"])
        for name, (value, goal, ok) in targets["checks"].items():
            print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value} (target {goal})")
    prof = results.get("profile")
    if prof and "top_own" in prof:
        print(f"profile of fleet at N={max(results['sizes_asked'])}: {prof['samples']} samples, folded stacks in "
              f"{prof['folded']}")
        print("  top own time:")
        for r in prof["top_own"][:10]:
            print(f"    {r['pct']:5.1f}%  {r['frame']}")
        print("  top cumulative time:")
        for r in prof["top_cumulative"][:10]:
            print(f"    {r['pct']:5.1f}%  {r['frame']}")
        print("  time by the deepest fleet/ frame on the stack (what fleet code it was spent for):")
        for r in prof["top_by_fleet_frame"][:10]:
            print(f"    {r['pct']:5.1f}%  {r['frame']}")
        print("  own time by file:")
        for r in prof["top_own_by_file"][:10]:
            print(f"    {r['pct']:5.1f}%  {r['frame']}")


def check_targets(results: dict[str, Any]) -> None:
    sizes = results["sizes"]
    if not sizes:
        return
    measured = [k for k, v in sizes.items() if v.get("median")]
    if not measured:
        return
    n = max(measured, key=int)
    med, ratios = sizes[n].get("median", {}), sizes[n].get("ratios", {})
    checks: dict[str, tuple[Any, str, bool]] = {}
    if "fleet/floor cpu" in ratios:
        checks["client CPU per host fleet/floor"] = (ratios["fleet/floor cpu"], "<= 1.5", ratios["fleet/floor cpu"] <= 1.5)
    if "pdsh/fleet cpu" in ratios:
        checks["client CPU per host pdsh/fleet"] = (ratios["pdsh/fleet cpu"], ">= 10", ratios["pdsh/fleet cpu"] >= 10)
    if "ansible/fleet cpu" in ratios:
        checks["client CPU per host ansible/fleet"] = (ratios["ansible/fleet cpu"], ">= 20",
                                                       ratios["ansible/fleet cpu"] >= 20)
    if "fleet/floor wall" in ratios:
        checks["wall fleet/floor"] = (ratios["fleet/floor wall"], "<= 1.2 (at 512)", ratios["fleet/floor wall"] <= 1.2)
    if "fleet" in med:
        rss = round(med["fleet"]["maxrss_mb"], 1)
        checks["fleet peak RSS MB"] = (rss, "< 150 (at 512)", rss < 150)
    results["targets"] = {"n": int(n), "checks": checks}


# ============================================================== main


def _interrupt(signum: int, frame: object) -> None:
    log(f"got {signal.Signals(signum).name}")
    raise KeyboardInterrupt


def versions(venv: Path) -> dict[str, str]:
    def first_line(cmd: list[str]) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unavailable: {exc}"
        return ((done.stdout or "") + (done.stderr or "")).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    import asyncssh
    return {"openssh": first_line(["ssh", "-V"]), "pdsh": first_line(["pdsh", "-V"]),
            "ansible": first_line([str(venv / "bin" / "ansible-playbook"), "--version"]),
            "py-spy": first_line([str(venv / "bin" / "py-spy"), "--version"]), "asyncssh": asyncssh.__version__}


def ensure_pdsh() -> str | None:
    if shutil.which("pdsh"):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("pdsh missing: apt-get install -y pdsh")
        done = subprocess.run(["apt-get", "install", "-y", "-q", "pdsh"], capture_output=True, text=True)
        if done.returncode == 0 and shutil.which("pdsh"):
            return None
        return f"apt-get install pdsh failed: {done.stderr.strip()[-300:]}"
    return "pdsh not installed (apt-get install pdsh)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=os.environ.get("BENCH_SIZES", "64,256,512"),
                   help="comma-separated node counts (env BENCH_SIZES)")
    p.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "3")))
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--bench-venv", default=str(REPO / "benchmarks" / ".bench-venv"),
                   help="venv holding ansible-core and py-spy")
    p.add_argument("--profile", action="store_true", help="py-spy profile of one fleet reset at the largest size")
    p.add_argument("--linger", type=float, default=0.5, help="seconds a dead worker's GPU memory lingers")
    p.add_argument("--protected-daemon", action="store_true", help="also run nvidia-persistenced on every node")
    p.add_argument("--pause", type=float, default=2.0, help="seconds of quiet before every measured run")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="bound on one measured run")
    p.add_argument("--min-free-mb", type=int, default=1500, help="abort a run when MemAvailable drops under this")
    p.add_argument("--ssh-kex", default="curve25519-sha256",
                   help="KexAlgorithms for pdsh's and Ansible's ssh ('' = OpenSSH's default); the default is what "
                        "asyncssh negotiates with this sshd, so every tool pays the same key exchange")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, plans, outputs) for debugging")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.tools = [t for t in args.tools.split(",") if t]
    unknown = set(args.tools) - set(TOOLS)
    if unknown:
        p.error(f"unknown tools {sorted(unknown)}")
    if args.reps < 1 or not args.sizes or min(args.sizes) < 1:
        p.error("need --reps >= 1 and sizes >= 1")
    args.stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    skipped: dict[str, str] = {}
    if "pdsh" in args.tools and (why := ensure_pdsh()):
        skipped["pdsh"] = why
    venv = Path(args.bench_venv)
    if "ansible" in args.tools and not (venv / "bin" / "ansible-playbook").exists():
        skipped["ansible"] = f"{venv}/bin/ansible-playbook missing (make bench creates it: pip install ansible-core)"
    if args.profile and not (venv / "bin" / "py-spy").exists():
        skipped["profile"] = f"{venv}/bin/py-spy missing (pip install py-spy)"
        args.profile = False
    for tool, why in skipped.items():
        log(f"{tool} skipped: {why}")
    args.tools = [t for t in args.tools if t not in skipped]
    if "fleet" not in args.tools:
        sys.exit("fleet must be among --tools: the others replay its commands")
    os.environ.pop("SSH_AUTH_SOCK", None)

    set_subreaper()  # anything a run leaves behind comes back to us and is killed at the end
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="fo-", dir="/tmp"))  # short: ssh ControlPath must fit 108 bytes
    results: dict[str, Any] = {
        "started_at": args.stamp, "sizes_asked": args.sizes, "reps": args.reps, "tools": args.tools,
        "skipped": skipped, "machine": {"cores": os.cpu_count(), "mem_available_mb": mem_available_mb(),
                                        "python": platform.python_version(), "kernel": platform.release()},
        "workload": {"unit": UNIT, "gpus": 8, "mib_per_gpu": 70000, "linger_s": args.linger,
                     "protected_daemon": args.protected_daemon, "stray_workers": 0},
        "ssh_kex_for_openssh_clients": args.ssh_kex or "OpenSSH default", "versions": versions(venv),
        "note": "sshd daemons and simulated nodes share the client's cores; client CPU is measured apart",
        "sizes": {},
    }
    bench = Bench(args, tmp)
    interrupted = False
    try:
        for count in args.sizes:
            run_size(bench, count, results)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    finally:
        bench.abort_current()
        leftovers = descendants(os.getpid())
        kill_pids(leftovers)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if leftovers:
            log(f"killed {len(leftovers)} leftover processes")
    summarise(results)
    check_targets(results)
    results["interrupted"] = interrupted
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.stamp}.json"
    text = json.dumps(results, indent=1, default=str) + "\n"
    out.write_text(text)
    if args.json:
        args.json.write_text(text)
    print_table(results)
    print(f"results: {out}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        sys.exit(measure_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "_floor":
        sys.exit(floor_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
