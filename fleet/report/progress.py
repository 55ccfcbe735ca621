"""The run as it goes, on stderr: a live view on a terminal, a status line every 30 s without one.

Never on stdout: `--json` keeps stdout one document. The view reads the hosts' progress (`HostRun`:
status, current step, start) a few times a second; nothing in the task graph waits for it.

    terminal   a rich Live view: hosts per step and per outcome, elapsed time, an ETA, the slowest hosts
    otherwise  one line every FLEET_STATUS_INTERVAL seconds (30 by default), so a cron log shows a long
               run is alive: `fleet: 120/500 done (110 clean, 10 failed); in flight: kill 300, settle 80;
               45 s elapsed, about 30 s left; slowest gpu-b07 (settle, 41 s)`
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import anyio
from rich.live import Live
from rich.table import Table

from fleet import terminal
from fleet.inventory.nodesets import fold
from fleet.model.report import HostStatus, StepName
from fleet.report.tables import Quiet

STATUS_INTERVAL_VAR = "FLEET_STATUS_INTERVAL"
DEFAULT_STATUS_INTERVAL_S = 30.0
LIVE_REFRESH_S = 0.25
SLOWEST = 3
# A host that waits longer than this for the node's reset lock (another run holds it) is named on the progress line.
LOCK_SAID_S = 3.0


class Progressing(Protocol):
    """What the view reads of a host (`fleet.engine.walk.HostRun` is one)."""

    @property
    def status(self) -> HostStatus | None: ...
    @property
    def current(self) -> StepName | None: ...
    @property
    def started(self) -> float | None: ...
    @property
    def ended(self) -> float | None: ...
    @property
    def worst_s(self) -> float | None: ...  # the longest to its verdict when one thing goes wrong where it is now
    @property
    def locking(self) -> float | None: ...  # since when it waits for the node's reset lock (None: not waiting)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The run at one moment: counts, the slowest hosts in flight, elapsed, an estimate of what is left."""

    total: int
    done: Counter[str]
    in_flight: Counter[str]  # step -> hosts in it ("connect" before the first step)
    waiting: int  # not started yet
    elapsed_s: float
    eta_s: float | None
    slowest: tuple[tuple[str, str, float], ...]  # (host, step, seconds in flight)
    locked_out: tuple[tuple[str, float], ...] = ()  # (host, seconds) waiting past LOCK_SAID_S for another run's lock

    @property
    def finished(self) -> int:
        return sum(self.done.values())


def snapshot(hosts: Mapping[str, Progressing], started: float, now: float) -> Snapshot:
    """Where every host is (pure: the clock is passed in)."""
    done: Counter[str] = Counter()
    in_flight: Counter[str] = Counter()
    flying: list[tuple[str, str, float]] = []
    worst: list[float | None] = []  # each flying host's worst_s
    durations = []
    waiting = 0
    locked_out: list[tuple[str, float]] = []
    for name, host in hosts.items():
        if host.status is not None:
            done[host.status.value] += 1
            if host.started is not None and host.ended is not None:
                durations.append(host.ended - host.started)
        elif host.started is None:
            waiting += 1
        else:
            locking = host.locking
            step = host.current.value if host.current else "lock" if locking is not None else "connect"
            in_flight[step] += 1
            flying.append((name, step, now - host.started))
            worst.append(host.worst_s)
            if locking is not None and now - locking > LOCK_SAID_S:
                locked_out.append((name, now - locking))
    slowest = tuple(sorted(flying, key=lambda f: -f[2])[:SLOWEST])
    eta = _eta(durations, [f[2] for f in flying], worst, waiting)
    return Snapshot(total=len(hosts), done=done, in_flight=in_flight, waiting=waiting, elapsed_s=now - started,
                    eta_s=eta, slowest=slowest, locked_out=tuple(locked_out))


def lock_line(snap: Snapshot) -> str | None:
    """`waiting for another run's reset lock: gpu-b[01-02] (up to 7 s)`: the hosts a lock held elsewhere keeps
    waiting (None: none); the lock's holder is named if the wait runs out (`locked by run ...`)."""
    if not snap.locked_out:
        return None
    longest = max(seconds for _, seconds in snap.locked_out)
    return (f"waiting for another run's reset lock: {fold([name for name, _ in snap.locked_out])}"
            f" ({'up to ' if len(snap.locked_out) > 1 else ''}{longest:.0f} s)")


def _eta(durations: Sequence[float], elapsed: Sequence[float], worst: Sequence[float | None],
         waiting: int) -> float | None:
    """Seconds left, from the hosts done so far: an in-flight host finishes at the typical host's duration; one
    already past it is waiting out what went wrong, and finishes by the longest one way of going wrong takes where
    it is (`worst`, `fleet.reset.verdict_time`), plus the typical duration for the rest of its way; the waiting
    hosts take one typical duration more each wave. None (nothing said) until a host has finished, and when a host
    is past even that (more than one thing went wrong): "about 0 s left" would be wrong exactly then."""
    if not durations:
        return None
    typical = statistics.median(durations)
    lefts = []
    for taken, longest in zip(elapsed, worst, strict=True):
        left = typical - taken
        if left < 1.0:
            left = longest + typical - taken if longest is not None else 0.0
        if left < 1.0:
            return None
        lefts.append(left)
    left = max(lefts, default=0.0)
    if waiting:  # the waves still to start, as many at once as are in flight now
        left += typical * -(-waiting // max(1, len(elapsed)))
    return left


def status_line(snap: Snapshot) -> str:
    """One line for a log: done, in flight by step, elapsed, left, the slowest host."""
    done = ", ".join(f"{n} {s}" for s, n in sorted(snap.done.items()))
    parts = [f"fleet: {snap.finished}/{snap.total} done" + (f" ({done})" if done else "")]
    if snap.in_flight:
        parts.append("in flight: " + ", ".join(f"{step} {n}" for step, n in _steps_in_order(snap.in_flight)))
    if snap.waiting:
        parts.append(f"{snap.waiting} waiting")
    timing = f"{snap.elapsed_s:.0f} s elapsed"
    if snap.eta_s is not None and snap.finished < snap.total:
        timing += f", about {snap.eta_s:.0f} s left"
    parts.append(timing)
    if snap.slowest:
        host, step, seconds = snap.slowest[0]
        parts.append(f"slowest {host} ({step}, {seconds:.0f} s)")
    locked = lock_line(snap)
    if locked is not None:
        parts.append(locked)
    return "; ".join(parts)


def _steps_in_order(counts: Counter[str]) -> list[tuple[str, int]]:
    order = ["connect", "lock", *(s.value for s in StepName)]
    return sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))


def table(snap: Snapshot) -> Table:
    """The live view: one row of counts per step and per outcome, then the slowest hosts."""
    grid = Table(box=None, title=f"fleet: {snap.finished}/{snap.total} hosts done, {snap.elapsed_s:.0f} s"
                 + (f", about {snap.eta_s:.0f} s left" if snap.eta_s is not None and snap.finished < snap.total
                    else ""), title_justify="left")
    steps = ["waiting", "connect", *(["lock"] if snap.in_flight.get("lock") else []), *(s.value for s in StepName)]
    outcomes = [s.value for s in HostStatus]
    for column in [*steps, *outcomes]:
        grid.add_column(column, justify="right")
    counts = {"waiting": snap.waiting, **snap.in_flight, **snap.done}
    grid.add_row(*(str(counts.get(c, 0)) for c in [*steps, *outcomes]))
    captions = ["slowest: " + ", ".join(f"{h} ({s}, {t:.0f} s)" for h, s, t in snap.slowest)] if snap.slowest else []
    locked = lock_line(snap)
    captions += [locked] if locked is not None else []
    if captions:
        grid.caption = "\n".join(captions)
        grid.caption_justify = "left"
    return grid


def status_interval(env: dict[str, str] | None = None) -> float:
    value = (env if env is not None else os.environ).get(STATUS_INTERVAL_VAR, "")
    try:
        return max(0.5, float(value)) if value.strip() else DEFAULT_STATUS_INTERVAL_S
    except ValueError:
        return DEFAULT_STATUS_INTERVAL_S


async def watch(hosts: Mapping[str, Progressing], *, stream: IO[str] | None = None,
                live: bool | None = None) -> None:
    """Show the run until cancelled (the task graph cancels it when the run ends)."""
    out = stream or sys.stderr
    started = time.monotonic()
    if live if live is not None else out.isatty():
        try:
            await _live(hosts, out, started)
        except OSError:  # the terminal hung up (EIO): nothing more to show, and never the run's failure
            terminal.lost(out)
        await anyio.sleep_forever()
    interval = status_interval()
    while True:
        await anyio.sleep(interval)
        terminal.write(out, status_line(snapshot(hosts, started, time.monotonic())) + "\n")


async def _live(hosts: Mapping[str, Progressing], out: IO[str], started: float) -> None:
    console = Quiet(file=out, stderr=out is sys.stderr)
    with Live(table(snapshot(hosts, started, started)), console=console, transient=True,
              refresh_per_second=int(1 / LIVE_REFRESH_S)) as view:
        while True:
            await anyio.sleep(LIVE_REFRESH_S)
            view.update(table(snapshot(hosts, started, time.monotonic())))
