"""How a reset's wall time grows with the number of nodes: 1 node vs N nodes, interleaved, medians.

Every node is the same busy simulated 8-GPU node (a serving unit on all GPUs, a
stray process, memory that lingers 1 s after death), served over loopback SSH.
If the task graph really runs hosts at once, N nodes take about as long as one
node's step chain, not N times it. Not a test: numbers on a shared machine are
noisy, so it prints medians of several interleaved rounds and their ratio.

    python benchmarks/scale.py [--nodes 16] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.report import HostStatus
from fleet.runlog.folder import RunLogs, new_run_id
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)


def spec(name: str) -> NodeSpec:
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=70_000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), linger_s=1.0)


async def one_round(count: int, tmp: Path, concurrency: int | None = None) -> dict[str, float]:
    names = [f"gpu-b{i:02d}" for i in range(1, count + 1)]
    async with SimFleet(tmp / f"sim-{count}", [spec(n) for n in names]) as sim:
        hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
        logs = RunLogs(tmp / "logs", new_run_id())
        logs.create()
        started, cpu_before = time.monotonic(), _cpu_s()
        report, _ = await run_hosts(hosts, RunOptions(concurrency=concurrency), logs)
        wall, cpu = time.monotonic() - started, _cpu_s() - cpu_before
        logs.close()
    clean = report.count(HostStatus.CLEAN)
    chains = [h.duration_s for h in report.hosts.values()]
    return {"wall_s": wall, "slowest_host_s": max(chains), "median_host_s": statistics.median(chains),
            "cpu_s": cpu, "cores_busy": cpu / wall, "clean": clean}


def _cpu_s() -> float:
    """CPU seconds of this process (fleet and the in-process SSH servers) and its reaped children
    (every fake nvidia-smi / systemctl / find / ps the nodes ran)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def main(nodes: int, rounds: int) -> dict[str, object]:
    modes = {"1": (1, None), str(nodes): (nodes, None), f"{nodes} -j1": (nodes, 1)}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        for r in range(rounds):
            for mode, (count, concurrency) in modes.items():  # interleaved: drift hits every mode alike
                results[mode].append(await one_round(count, Path(tmp) / f"r{r}-{count}-{concurrency}", concurrency))
    summary: dict[str, object] = {}
    for mode, runs in results.items():
        summary[mode] = {k: round(statistics.median(run[k] for run in runs), 2) for k in runs[0]}
    one, many, serial = summary["1"], summary[str(nodes)], summary[f"{nodes} -j1"]
    assert isinstance(one, dict) and isinstance(many, dict) and isinstance(serial, dict)
    summary["ratio_wall"] = round(many["wall_s"] / one["wall_s"], 2)
    summary["ratio_serial"] = round(serial["wall_s"] / many["wall_s"], 2)
    return summary


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summary = anyio.run(main, args.nodes, args.rounds)
    print(f"{'nodes':>8} {'wall s':>7} {'slowest host s':>15} {'median host s':>14} {'CPU s':>6} "
          f"{'cores busy':>10} {'clean':>6}   ({os.cpu_count()} cores)")
    for mode in ("1", str(args.nodes), f"{args.nodes} -j1"):
        row = summary[mode]
        assert isinstance(row, dict)
        print(f"{mode:>8} {row['wall_s']:>7} {row['slowest_host_s']:>15} {row['median_host_s']:>14} "
              f"{row['cpu_s']:>6} {row['cores_busy']:>10} {int(row['clean']):>6}")
    print(f"wall({args.nodes}) / wall(1) = {summary['ratio_wall']}; "
          f"serial (-j 1) / concurrent = {summary['ratio_serial']} (medians of {args.rounds} interleaved rounds)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    cli()
