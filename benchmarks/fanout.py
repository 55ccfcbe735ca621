"""Fan-out side by side: `fleet reset` against a raw asyncssh floor, pdsh and Ansible, behind real OpenSSH.

N loopback hosts (127.0.0.2, .3, ...) are served by the real /usr/sbin/sshd: one daemon per 16
addresses, all on the same port (so pdsh works unmodified), each daemon with its own host key. Every
host is a simulated 8-GPU node (fleet.sim.node.SimNode: one serving unit holding all 8 GPUs). One
client key serves every host; `Match LocalAddress` gives each address its own authorized_keys file,
whose `environment="PATH=<node bin>:..."` makes that node's fake nvidia-smi/systemctl the ones found.
Each node has its own process table, as a real node has: its processes live in a PID namespace of their own
with its own /proc (fanoutlib/pidns.py), and every SSH session to its address runs inside it (a forced
command, `nsenter`). `--shared-proc` puts every node in this machine's one table instead (as the testbed
did before fe7a526): then each node's holder scan walks every node's processes.

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
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fanoutlib.common import REPO, RESULTS, RIVALS, SSHD, TOOLS, UNIT, log
from fanoutlib.floor import floor_main
from fanoutlib.measure import measure_main
from fanoutlib.procs import descendants, kill_pids, mem_available_mb, set_subreaper
from fanoutlib.summary import check_targets, print_table, summarise
from fanoutlib.testbed import BENCH_BOUNDS, Testbed
from fanoutlib.tools import Bench

# ============================================================== orchestration


def run_size(bench: Bench, count: int, results: dict[str, Any]) -> None:
    args = bench.args
    root = bench.tmp / f"bed-{count}"
    root.mkdir()
    bed = Testbed(root, count, linger_s=args.linger, protected_daemon=args.protected_daemon, bounds=args.fleet_bounds,
                  own_proc=not args.shared_proc)
    size: dict[str, Any] = {"nodes": count, "runs": {t: [] for t in args.tools}}
    results["sizes"][str(count)] = size
    try:
        t0 = time.monotonic()
        bed.start_nodes()
        log(f"N={count}: {count} nodes up in {time.monotonic() - t0:.1f} s; MemAvailable {mem_available_mb()} MB")
        bed.start_sshd()
        bed.write_inventory()
        log(f"N={count}: {len(bed.sshds)} sshd daemons on port {bed.port}")
        for rep in range(args.reps):
            run_rep(bench, bed, size, rep)
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


def run_rep(bench: Bench, bed: Testbed, size: dict[str, Any], rep: int) -> None:
    """One repetition: fleet first, then the others (in an order rotated by rep) replaying its commands."""
    args, count = bench.args, bed.count
    others = [t for t in args.tools if t != "fleet"]
    rotation = others[rep % len(others):] + others[:rep % len(others)] if others else []
    commands: dict[str, list[dict[str, Any]]] = {}
    for tool in ["fleet", *rotation]:
        if tool not in args.tools:
            continue
        if tool != "fleet" and not commands:
            log(f"N={count} rep {rep + 1}: no fleet commands to replay; {tool} skipped")
            continue
        if tool in RIVALS and count >= args.rivals_large and rep >= args.rival_reps_large:
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
        text = (done.stdout or "") + (done.stderr or "")
        return text.strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    from fleet.transport.ssh.asyncssh_quiet import asyncssh  # its import-time warning is not the bench's news
    return {"openssh": first_line(["ssh", "-V"]), "pdsh": first_line(["pdsh", "-V"]),
            "ansible": first_line([str(venv / "bin" / "ansible-playbook"), "--version"]),
            "py-spy": first_line([str(venv / "bin" / "py-spy"), "--version"]), "asyncssh": asyncssh.__version__}


def ensure_installed(command: str, package: str) -> str | None:
    """None when `command` is there, after `apt-get install package` when root can; else why not."""
    if shutil.which(command):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"{command} missing: apt-get install -y {package}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package],
                              capture_output=True, text=True, env=env, check=False)
        if done.returncode == 0 and shutil.which(command):
            return None
        return f"apt-get install {package} failed: {done.stderr.strip()[-300:]}"
    return f"{command} not installed (apt-get install {package})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=os.environ.get("BENCH_SIZES", "64,256,512"),
                   help="comma-separated node counts (env BENCH_SIZES)")
    p.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "3")))
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--rival-reps-large", type=int, default=int(os.environ.get("BENCH_RIVAL_REPS_LARGE", "1")),
                   help="at sizes from --rivals-large up, pdsh and Ansible run in this many repetitions only "
                        "(at 512 hosts each costs minutes of CPU on a small machine); fleet and floor run in all")
    p.add_argument("--rivals-large", type=int, default=512, help="see --rival-reps-large")
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
    p.add_argument("--fleet-bounds", choices=("bench", "defaults"), default="bench",
                   help="fleet's bounds in the inventory: bench = 120 s connect/command/drain/settle (a starved box is "
                        "slow, not failing); defaults = none written, fleet's own defaults (README's host variables)")
    p.add_argument("--shared-proc", action="store_true",
                   help="every node in this machine's one process table (no PID namespace a node): each node's holder "
                        "scan then walks every node's processes; for comparison with figures measured before fe7a526")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, scripts, outputs) for debugging")
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


def skip_unavailable(args: argparse.Namespace, venv: Path) -> dict[str, str]:
    """Tools (and the profile) whose programs are missing: dropped from args, with the reason."""
    skipped: dict[str, str] = {}
    if why := ensure_installed(str(SSHD), "openssh-server"):
        sys.exit(f"the testbed needs OpenSSH's sshd: {why}")
    if "pdsh" in args.tools and (why := ensure_installed("pdsh", "pdsh")):
        skipped["pdsh"] = why
    if "ansible" in args.tools and not (venv / "bin" / "ansible-playbook").exists():
        skipped["ansible"] = (f"{venv}/bin/ansible-playbook missing "
                              f"(make bench creates it: pip install ansible-core)")
    if args.profile and not (venv / "bin" / "py-spy").exists():
        skipped["profile"] = f"{venv}/bin/py-spy missing (pip install py-spy)"
        args.profile = False
    for tool, why in skipped.items():
        log(f"{tool} skipped: {why}")
    args.tools = [t for t in args.tools if t not in skipped]
    return skipped


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    venv = Path(args.bench_venv)
    skipped = skip_unavailable(args, venv)
    if "fleet" not in args.tools:
        sys.exit("fleet must be among --tools: the others replay its commands")
    os.environ.pop("SSH_AUTH_SOCK", None)

    set_subreaper()  # anything a run leaves behind comes back to us and is killed at the end
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="fo-", dir="/tmp"))  # short: ssh ControlPath must fit 108 bytes
    results: dict[str, Any] = {
        "started_at": args.stamp, "sizes_asked": args.sizes, "reps": args.reps, "tools": args.tools,
        "rival_reps_large": {"from_size": args.rivals_large, "reps": args.rival_reps_large},
        "skipped": skipped, "machine": {"cores": os.cpu_count(), "mem_available_mb": mem_available_mb(),
                                        "python": platform.python_version(), "kernel": platform.release()},
        "workload": {"unit": UNIT, "gpus": 8, "mib_per_gpu": 70000, "linger_s": args.linger,
                     "protected_daemon": args.protected_daemon, "stray_workers": 0},
        "fleet_bounds": BENCH_BOUNDS if args.fleet_bounds == "bench" else "fleet's defaults",
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
        clean_up(bench, tmp, keep=args.keep)
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


def clean_up(bench: Bench, tmp: Path, *, keep: bool) -> None:
    """End the measured run if one is going, kill and reap whatever is left, remove the temp dir."""
    bench.abort_current()
    leftovers = descendants(os.getpid())
    kill_pids(leftovers)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    if keep:
        log(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if leftovers:
        log(f"killed {len(leftovers)} leftover processes")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        sys.exit(measure_main(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "_floor":
        sys.exit(floor_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
