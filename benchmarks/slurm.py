"""`fleet reset --slurm` two ways on the same simulated nodes: SSH fan-out against `--via srun`, the controller's cost.

For each size N (--sizes) and each repetition (--reps, interleaved: every repetition runs every size and
both modes, the modes' order alternating), a fresh set of N busy simulated 8-GPU nodes (a serving unit on
all GPUs, a stray process, memory that lingers 0.5 s after death) is served over loopback SSH by this
process (`fleet.sim.fleetsim`), with a real Slurm cluster over them (`fleet.sim.slurmcluster`: munged,
slurmctld and one slurmd per node, children of this process). Setting up and tearing down is not timed.
Then `fleet reset -i INVENTORY --group sim -y --slurm --drain-wait 30s --json` runs as a subprocess, with
`--via srun` or without (SSH fan-out), and every host must end clean. Measured per run:

    wall s        the fleet process, from its start until it was reaped
    ctl CPU s     its rusage from os.wait4 (user + system): the fleet process and the children it reaped,
                  i.e. scontrol, squeue, srun; not the node side
    node CPU s    the node side. ssh: this process's own CPU and its reaped children's over the run, less
                  the controller's: the in-process SSH servers and every command they ran on the nodes.
                  srun: each node's `fleet node-run` and every command it ran, measured on the node by a
                  `fleet` wrapper first on the tasks' PATH (/bin/sh `times` after the real fleet exits).
                  NOT included: slurmstepd, which Slurm double-forks away from slurmd (its parent is then
                  init, so its CPU is counted nowhere this process can read); it is srun's per-node
                  transport, as the SSH servers are SSH's, so the srun figure is low by that much.
    daemons CPU s munged, slurmctld and every slurmd (live daemons, /proc/PID/stat: own and reaped
                  children's CPU, in clock ticks), over the run; slurmstepd not included, as above
    cmds/host     the remote commands in each host's log (<log-dir>/<run_id>/<host>.jsonl: `batch` events
                  and the `command` events outside a batch, fleet.node.node.is_remote_command), min-max
                  over the hosts

It prints the medians per size and mode and the ratios srun/ssh of wall and controller CPU. Every simulated
node shares this machine's cores, so the wall time here also pays for the whole node side (with srun, a
Python `fleet node-run` per node); on a real fleet each node has its own. Not a test: numbers on a shared
machine are noisy. Needs root and Debian's `slurmctld slurmd slurm-client munge`.

    python benchmarks/slurm.py [--sizes 4,8,16] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from fleet.sim import slurmcluster
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.sim.slurmcluster import SlurmCluster

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
MODES = ("ssh", "srun")
# The nodes run no job: the wait ends at Slurm's first answer. Not 0: with SSH fan-out, `--drain-wait 0` skips
# even an idle node ("job ? still running ... after 0 s"), its wait ending before the first poll.
DRAIN_WAIT = "30s"
RUN_TIMEOUT_S = 600.0  # one fleet run, at most
STOP_TIMEOUT_S = 120.0  # fleet's own cleanup after a SIGINT (srun's is bounded at 90 s), then SIGKILL
CLK_TCK = os.sysconf("SC_CLK_TCK")
# `fleet` on each node's task PATH: the real one, then what it and its reaped children used (sh's `times`).
WRAPPER = """#!/bin/sh
# benchmarks/slurm.py: the real fleet, then its CPU (and its reaped children's) into {out}/NODE-PID.times
{real} "$@"
rc=$?
times > {out}/"${{SLURMD_NODENAME:-unknown}}-$$.times"
exit $rc
"""
_TIMES = re.compile(r"(\d+)m([\d.]+)s")


def spec(name: str) -> NodeSpec:
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=70_000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), linger_s=0.5)


def _rusage_s() -> float:
    """CPU seconds of this process and of its reaped children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _daemons_s(cluster: SlurmCluster) -> float:
    """CPU seconds of the cluster's live daemons and their reaped children (/proc/PID/stat)."""
    total = 0
    for pid in cluster.pids.values():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


def _node_side_s(folder: Path, count: int) -> float:
    """Sum of the wrapper's `times` files: children's user + system, one file per node."""
    files = sorted(folder.glob("*.times"))
    if len(files) != count:
        raise RuntimeError(f"{len(files)} node CPU files in {folder}, not {count}: {[f.name for f in files]}")
    total = 0.0
    for path in files:
        lines = path.read_text().splitlines()
        values = [int(m) * 60 + float(s) for m, s in _TIMES.findall(lines[1])] if len(lines) >= 2 else []
        if len(values) != 2:
            raise RuntimeError(f"{path}: not sh's `times` output: {lines!r}")
        total += sum(values)
    return total


@contextlib.asynccontextmanager
async def _cluster(root: Path, count: int) -> AsyncIterator[tuple[SimFleet, SlurmCluster, Path]]:
    """N busy nodes behind SSH and a Slurm cluster over them, a `fleet` wrapper first on its tasks' PATH."""
    names = [f"sim{i}" for i in range(1, count + 1)]
    wrap, node_cpu = root / "wrap", root / "node-cpu"
    wrap.mkdir(parents=True)
    node_cpu.mkdir()
    real = Path(sys.executable).parent / "fleet"
    (wrap / "fleet").write_text(WRAPPER.format(real=shlex.quote(str(real)), out=shlex.quote(str(node_cpu))))
    (wrap / "fleet").chmod(0o755)
    async with SimFleet(root / "fleet", [spec(n) for n in names]) as sim:
        task_env = {n: {"PATH": f"{wrap}:{node.env()['PATH']}"} for n, node in sim.nodes.items()}
        with SlurmCluster(root / "slurm", {n: sim.address(n) for n in names}, task_env=task_env) as cluster:
            yield sim, cluster, node_cpu


async def _run_fleet(argv: list[str], env: dict[str, str], out: Path, err: Path) -> tuple[float, float, int]:
    """Run fleet; return (wall s, CPU s of it and its reaped children, exit code). The event loop keeps
    serving SSH meanwhile. Interrupted (Ctrl-C): fleet gets one SIGINT and time to clean up, then SIGKILL."""
    started = time.monotonic()
    proc = _start(argv, env, out, err)
    pidfd = os.pidfd_open(proc.pid)  # readable once the process has exited
    try:
        with anyio.fail_after(RUN_TIMEOUT_S):
            await anyio.wait_readable(pidfd)
        usage = _reap(proc)
        return time.monotonic() - started, usage.ru_utime + usage.ru_stime, proc.returncode or 0
    finally:
        try:
            if proc.returncode is None:
                with anyio.CancelScope(shield=True):
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGINT)
                    with anyio.move_on_after(STOP_TIMEOUT_S):
                        await anyio.wait_readable(pidfd)
                    if proc.poll() is None:
                        proc.kill()
                        _reap(proc)
        finally:
            os.close(pidfd)


def _start(argv: list[str], env: dict[str, str], out: Path, err: Path) -> subprocess.Popen[bytes]:
    """fleet in its own session: a terminal's ^C reaches only this process, which passes one SIGINT on."""
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True)


def _reap(proc: subprocess.Popen[bytes]) -> resource.struct_rusage:
    """Wait for proc (it has exited, or is about to: SIGKILL) and return its rusage, children included."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


async def one_run(mode: str, count: int, root: Path) -> dict[str, float]:
    async with _cluster(root, count) as (sim, cluster, node_cpu):
        logs = root / "logs"
        argv = [sys.executable, "-m", "fleet", "reset", "-i", str(sim.inventory_path), "--group", "sim", "-y",
                "--slurm", "--drain-wait", DRAIN_WAIT, "--log-dir", str(logs), "--json"]
        if mode == "srun":
            argv += ["--via", "srun"]
        out, err = root / "fleet.out", root / "fleet.err"
        bench_before, daemons_before = _rusage_s(), _daemons_s(cluster)
        wall, ctl_cpu, code = await _run_fleet(argv, {**os.environ, **cluster.env}, out, err)
        bench_cpu, daemons_cpu = _rusage_s() - bench_before - ctl_cpu, _daemons_s(cluster) - daemons_before
        try:
            document = json.loads(out.read_text())
        except ValueError:
            document = {}
        statuses = {h: d.get("status") for h, d in document.get("hosts", {}).items()}
        if code != 0 or len(statuses) != count or set(statuses.values()) != {"clean"}:
            tail = "\n".join(err.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{mode} x{count}: fleet exited {code}, hosts {statuses}\n{tail}")
        commands = [_commands(logs / document["run_id"] / f"{host}.jsonl") for host in statuses]
        node_side = bench_cpu if mode == "ssh" else _node_side_s(node_cpu, count)
    return {"wall_s": wall, "ctl_cpu_s": ctl_cpu, "node_cpu_s": node_side, "daemons_cpu_s": daemons_cpu,
            "bench_cpu_s": bench_cpu, "cmds_min": min(commands), "cmds_max": max(commands), "clean": len(statuses)}


def _commands(path: Path) -> int:
    from fleet.node.node import is_remote_command
    return sum(1 for line in path.read_text().splitlines() if is_remote_command(json.loads(line)))


async def main(sizes: list[int], reps: int) -> dict[str, Any]:
    results: dict[int, dict[str, list[dict[str, float]]]] = {n: {m: [] for m in MODES} for n in sizes}
    with tempfile.TemporaryDirectory(prefix="fleet-bslurm-") as tmp:
        for r in range(reps):
            for count in sizes:
                order = MODES if r % 2 == 0 else MODES[::-1]  # drift and warm-up hit both modes alike
                for mode in order:
                    run = await one_run(mode, count, Path(tmp) / f"r{r}-{count}-{mode}")
                    results[count][mode].append(run)
                    print(f"  rep {r + 1}/{reps}, {count} nodes, {mode}: wall {run['wall_s']:.2f} s, controller CPU "
                          f"{run['ctl_cpu_s']:.2f} s", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {"reps": reps, "cores": os.cpu_count(), "sizes": {}}
    for count, by_mode in results.items():
        row: dict[str, Any] = {}
        for mode, runs in by_mode.items():
            row[mode] = {k: round(statistics.median(run[k] for run in runs), 3) for k in runs[0]}
            row[mode]["cmds_min"] = min(run["cmds_min"] for run in runs)
            row[mode]["cmds_max"] = max(run["cmds_max"] for run in runs)
            row[mode]["runs"] = [{k: round(v, 3) for k, v in run.items()} for run in runs]
        row["ratio_wall"] = round(row["srun"]["wall_s"] / row["ssh"]["wall_s"], 2)
        row["ratio_ctl_cpu"] = round(row["srun"]["ctl_cpu_s"] / row["ssh"]["ctl_cpu_s"], 2)
        summary["sizes"][str(count)] = row
    return summary


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4,8,16", help="comma-separated node counts (default 4,8,16)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    missing = slurmcluster.available()
    if missing is not None:
        sys.exit(f"benchmarks/slurm.py: {missing}")
    summary = anyio.run(main, sizes, args.reps)
    print(f"{'nodes':>5} {'mode':>5} {'wall s':>7} {'ctl CPU s':>9} {'node CPU s':>10} {'daemons CPU s':>13} "
          f"{'cmds/host':>9} {'clean':>5}   ({summary['cores']} cores)")
    for size, row in summary["sizes"].items():
        for mode in MODES:
            m = row[mode]
            cmds = f"{m['cmds_min']}-{m['cmds_max']}" if m["cmds_min"] != m["cmds_max"] else str(m["cmds_min"])
            print(f"{size:>5} {mode:>5} {m['wall_s']:>7.2f} {m['ctl_cpu_s']:>9.2f} {m['node_cpu_s']:>10.2f} "
                  f"{m['daemons_cpu_s']:>13.2f} {cmds:>9} {int(m['clean']):>5}")
    ratios = "; ".join(f"{size}: wall {row['ratio_wall']}, controller CPU {row['ratio_ctl_cpu']}"
                       for size, row in summary["sizes"].items())
    print(f"srun / ssh by nodes: {ratios} (medians of {summary['reps']} interleaved repetitions)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    cli()
