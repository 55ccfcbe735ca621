"""`connectstorm.py _storm INVENTORY OUT.json`: every host of the inventory at once through fleet's own connect
path, in this process alone, and what that cost it.

Each host, as the task graph (`fleet.engine.graph`) takes it: a slot of the graph's limiter (`-j`; unset, as by default,
one a host: no bound), then `fleet.transport.connect(host)` (the graph's default connector: `open_ssh`, with
everything fleet does before and during the handshake: known_hosts, ssh_config, the bounds of the host's
`connect_timeout`), then one `true` through the Transport (`Transport.run`, bounded by the host's
`command_timeout` on both ends), then the close, shielded and bounded by the graph's CLOSE_TIMEOUT_S. A connect
that raises fleet's TransportError is the host `unreachable` (as in the graph); a command that fails or raises is
the host `failed`. With `--hold` a host closes only once every host has its answer (every session held at once,
as during a reset whose walks outlast the storm); without it each host closes after its command.

Not included: the reset's steps, the per-host logs, the report and the history (`controller.py` measures those,
with no SSH), the interpreter's start and imports (measured apart, as `startup_cpu_s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import resource
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from fleet.app.run import raise_fd_limit
from fleet.engine.graph import CLOSE_TIMEOUT_S
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.errors import TransportError
from fleet.transport import Transport, connect

from .sampler import Sampler

LAG_TICK_S = 0.1


@dataclass
class Tally:
    """What the storm saw, host by host: counters kept at the connect call itself."""

    hosts: int
    connecting: int = 0
    peak_connecting: int = 0
    held: int = 0
    peak_held: int = 0
    answered: int = 0
    connect_s: list[float] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)  # fleet's reason of each unreachable or failed host
    all_answered: anyio.Event = field(default_factory=anyio.Event)
    max_lag_s: float = 0.0
    admission: dict[str, Any] | None = None  # fleet's own record, where it keeps one (`fleet_admission`)

    def connect_started(self) -> None:
        self.connecting += 1
        self.peak_connecting = max(self.peak_connecting, self.connecting)

    def connect_ended(self, seconds: float, connected: bool) -> None:
        self.connecting -= 1
        self.connect_s.append(seconds)
        if connected:
            self.held += 1
            self.peak_held = max(self.peak_held, self.held)

    def answer(self) -> None:
        """One more host has its answer (a command's, or unreachable): the last one lets held sessions close."""
        self.answered += 1
        if self.answered == self.hosts:
            self.all_answered.set()


async def _command(host: Host, transport: Transport, tally: Tally) -> None:
    try:
        result = await transport.run(["true"], timeout=host.command_timeout)
        if result.exit_status != 0:
            tally.failed[host.name] = f"true exited {result.exit_status}: {result.stderr.strip()[:200]}"
            tally.reasons["exit_status"] += 1
    except TransportError as exc:
        tally.failed[host.name] = str(exc)
        tally.reasons[exc.reason.value] += 1


async def _one_host(host: Host, tally: Tally, limiter: anyio.CapacityLimiter, hold: bool) -> None:
    async with limiter:
        tally.connect_started()
        started = time.monotonic()
        try:
            transport = await connect(host)
        except TransportError as exc:
            tally.connect_ended(time.monotonic() - started, connected=False)
            tally.unreachable[host.name] = str(exc)
            tally.reasons[exc.reason.value] += 1
            tally.answer()
            return
        tally.connect_ended(time.monotonic() - started, connected=True)
        try:
            await _command(host, transport, tally)
            tally.answer()
            if hold:
                await tally.all_answered.wait()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                await transport.close()
            tally.held -= 1


async def _watch_lag(tally: Tally) -> None:
    """The event loop's worst lateness: how much later than asked a short sleep wakes up."""
    while True:
        asked = time.monotonic() + LAG_TICK_S
        await anyio.sleep(LAG_TICK_S)
        tally.max_lag_s = max(tally.max_lag_s, time.monotonic() - asked)


def fleet_admission() -> dict[str, Any] | None:
    """fleet's own record of this event loop's handshakes (width, in flight and waiting, their peaks, the CPU a
    handshake measured), where fleet admits handshakes (`fleet.transport.ssh.admission`); else None."""
    try:
        module = importlib.import_module("fleet.transport.ssh.admission")
    except ImportError:
        return None
    return dict(dataclasses.asdict(module.admission().stats))


async def storm(hosts: list[Host], concurrency: int | None, hold: bool) -> Tally:
    tally = Tally(len(hosts))
    limiter = anyio.CapacityLimiter(max(1, concurrency or len(hosts)))  # as fleet.engine.graph sizes it
    async with anyio.create_task_group() as outer:
        outer.start_soon(_watch_lag, tally)
        async with anyio.create_task_group() as group:
            for host in hosts:
                group.start_soon(_one_host, host, tally, limiter, hold)
        outer.cancel_scope.cancel()
    tally.admission = fleet_admission()
    return tally


class FdPeak(Sampler):
    """The peak count of this process's open file descriptors (/proc/self/fd)."""

    def __init__(self) -> None:
        super().__init__(every_s=0.05)
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, count_fds())


def count_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def vm_kb(field_name: str) -> int:
    """A field of /proc/self/status in kB (VmHWM: peak RSS; VmRSS: RSS now)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": round(statistics.median(ordered), 3), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1], 3)}


def measured(run: Callable[[], Tally]) -> tuple[Tally, dict[str, Any]]:
    """Run the storm; what it cost this process: CPU, wall, peak RSS, peak file descriptors."""
    rss_before_kb, fds_before = vm_kb("VmRSS"), count_fds()
    cpu, wall = time.process_time(), time.monotonic()
    fds = FdPeak()
    with fds:
        tally = run()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return tally, {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "rss_before_mb": round(rss_before_kb / 1024, 1),
                   "peak_rss_mb": round(vm_kb("VmHWM") / 1024, 1),
                   "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                   "fds_before": fds_before, "peak_fds": fds.peak}


def storm_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="connectstorm.py _storm")
    p.add_argument("inventory", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--hold", action="store_true")
    args = p.parse_args(argv)
    hosts = list(select(load_inventory(args.inventory), groups=["all"]))
    raise_fd_limit(len(hosts))
    startup_cpu = time.process_time()
    tally, cost = measured(lambda: anyio.run(storm, hosts, args.concurrency, args.hold))
    result = {
        "hosts": len(hosts), "hold": args.hold, "concurrency": args.concurrency,
        "bounds": {"connect_timeout": hosts[0].connect_timeout, "command_timeout": hosts[0].command_timeout},
        "unreachable": len(tally.unreachable), "failed": len(tally.failed),
        "errors": sorted({*tally.unreachable.values(), *tally.failed.values()})[:5],
        "peak_connecting": tally.peak_connecting, "peak_held": tally.peak_held,
        "reasons": dict(tally.reasons), "fleet_admission": tally.admission, "connect_s": quantiles(tally.connect_s),
        "max_loop_lag_s": round(tally.max_lag_s, 3), "startup_cpu_s": round(startup_cpu, 3),
        "soft_nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0], **cost,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0
