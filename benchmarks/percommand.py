"""What one more host and one more command cost the controller: the two terms of the cost model.

N hosts behind the real OpenSSH sshd (the fan-out testbed: benchmarks/fanoutlib/testbed.py), each
reached with fleet's own transport (`fleet.transport.ssh.open_ssh`: host key checked, AES-GCM, keepalives, every
command bounded by `timeout` and marked) running K bounded `true` commands in a row, all hosts at
once. Client CPU (user+sys of this process) is measured for K = 0 (connect and close only), 4, 8, 16
and 32, interleaved over several rounds; medians. A least-squares line through (K, CPU per host) gives
the cost of a connection (intercept) and of a command (slope): a reset's controller CPU per host is
about connect + commands x per-command plus fleet's own bookkeeping (logs, report), which
benchmarks/fanout.py measures whole.

    python benchmarks/percommand.py [--hosts 64] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from fanoutlib.common import log
from fanoutlib.procs import set_subreaper
from fanoutlib.testbed import Testbed

from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.transport.ssh import open_ssh

COUNTS = (0, 4, 8, 16, 32)


async def _one_host(host: Host, commands: int) -> None:
    async with await open_ssh(host) as ssh:
        for _ in range(commands):
            result = await ssh.run(["true"], timeout=30)
            if result.exit_status != 0:
                raise RuntimeError(f"true exited {result.exit_status}: {result.stderr!r}")


async def _round(hosts: list[Host], commands: int) -> tuple[float, float]:
    """(client CPU s, wall s) for every host connecting and running `commands` commands at once."""
    cpu, wall = time.process_time(), time.monotonic()
    async with anyio.create_task_group() as tg:
        for host in hosts:
            tg.start_soon(_one_host, host, commands)
    return time.process_time() - cpu, time.monotonic() - wall


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def measure(bed: Testbed, rounds: int) -> dict[str, Any]:
    hosts = list(select(load_inventory(bed.inventory), groups=["all"]))
    samples: dict[int, list[float]] = {k: [] for k in COUNTS}
    anyio.run(_round, hosts, 1)  # warm up: imports, first connections
    for r in range(rounds):
        order = COUNTS if r % 2 == 0 else tuple(reversed(COUNTS))
        for k in order:
            cpu, wall = anyio.run(_round, hosts, k)
            samples[k].append(cpu)
            log(f"round {r + 1}/{rounds}: {len(hosts)} hosts x {k:2d} commands: "
                f"client CPU {cpu:.2f} s ({1000 * cpu / len(hosts):.2f} ms/host), wall {wall:.2f} s")
    per_host = {k: 1000 * statistics.median(v) / len(hosts) for k, v in samples.items()}
    connect_ms, command_ms = fit([(float(k), v) for k, v in per_host.items()])
    return {"hosts": len(hosts), "rounds": rounds, "cpu_ms_per_host": per_host,
            "connect_ms": round(connect_ms, 2), "command_ms": round(command_ms, 3)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    set_subreaper()
    root = Path(tempfile.mkdtemp(prefix="pc-", dir="/tmp"))
    bed = Testbed(root, args.hosts, linger_s=0.5, protected_daemon=False)
    try:
        bed.start_nodes()
        bed.start_sshd()
        bed.write_inventory()
        result = measure(bed, args.rounds)
    finally:
        bed.stop_sshd()
        bed.stop_nodes()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nfleet's SSH transport, {result['hosts']} hosts behind real sshd, medians of {result['rounds']} rounds:")
    print(f"{'commands/host':>14} {'client CPU ms/host':>19}")
    for k, ms in result["cpu_ms_per_host"].items():
        print(f"{k:>14} {ms:>19.2f}")
    print(f"connect (key exchange, auth, close): {result['connect_ms']} ms; each command: {result['command_ms']} ms "
          f"(least squares)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
