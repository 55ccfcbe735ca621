"""Connection admission: never more SSH handshakes in flight than the controller and the servers can finish well
within connect_timeout.

Every handshake costs the one event loop CPU (key exchange, host key check, authentication: about 1.7 ms each on
loopback, AES-GCM and ed25519), and it costs the server more (sshd forks and does the same work: 21-26 ms of CPU a
connection measured in the connect storm). 2,000 hosts started at once are more than the servers finish in a 10 s
connect_timeout: each waits for all the others, and all of them are late. So a handshake waits for admission first
(that wait is the controller's, never counted against the host), and its connect_timeout starts once it is admitted.

The width (handshakes in flight at most) follows the handshakes' measured latency: attention seconds from admission
to the handshake's end (`fleet.transport.attention`). By Little's law the handshakes in flight are the rate they
finish at times their latency, so the width at which a handshake takes `LATENCY_SHARE` of connect_timeout (the
target) is the most the servers can take without a handshake coming near its bound. fleet finds it as TCP finds a
window (`next_width`): it starts at ADMISSION_START; each handshake that ends in under half the target widens it by
one while all of them have (the width doubles each round: slow start), by 1/width once one has not (one more a
round: the width stays near the servers' pace instead of doubling past it); one that ends past the target, or
times out, halves it (once a round: only a handshake admitted since the last halving halves it again).

The CPU width stays a ceiling (`admission_width`): the handshakes whose CPU fits in ADMISSION_SHARE of the smallest
connect_timeout asked for, at the CPU a handshake costs on this loop, measured as the run goes (`handshake_cost`:
the loop thread's CPU time while handshakes were in flight, a share of it for each that ended; a handshake that
timed out did no work, so it is no share: it never makes a handshake look cheaper), from HANDSHAKE_CPU_DEFAULT_S
until the first measurement. The arithmetic is plain functions; `Admission` is the limiter, one an event loop
(`admission()`), its `stats` what a benchmark reads.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from fleet.transport.attention import loop_clock

# Share of connect_timeout that the CPU of every handshake in flight may take of the loop: the rest is for the hosts
# already connected (their commands, their logs) and for a machine slower than the one measured.
ADMISSION_SHARE = 0.5
# Handshakes in flight at least (a few never crowd a loop) and at most (file descriptors, the servers' backlog).
ADMISSION_MIN = 16
ADMISSION_MAX = 4096
# CPU seconds of this loop a handshake is taken to cost until one is measured: 1.74 ms measured on loopback
# (benchmarks/percommand.py), rounded up to leave room for a slower controller.
HANDSHAKE_CPU_DEFAULT_S = 0.003
# Weight of a new measurement against the estimate so far.
COST_WEIGHT = 0.5
# Handshakes ended between two measurements (a measurement is also taken whenever none is left in flight).
SAMPLE_EVERY = 32
# Share of connect_timeout a handshake may take, from admission to its end (the latency target): the rest is room
# for a server or a controller slower for a while, before anything comes near the bound.
LATENCY_SHARE = 0.3
# Width at the start (slow start doubles it from there); a halving never goes under ADMISSION_MIN.
ADMISSION_START = 32
# Turns of the width kept in `AdmissionStats.width_path` (a benchmark's record).
PATH_KEPT = 64


def admission_width(connect_timeout: float, cpu_per_handshake: float, share: float = ADMISSION_SHARE) -> int:
    """How many handshakes may be in flight at once: as many as finish, one after the other on one loop, within
    `share` of connect_timeout; at least ADMISSION_MIN, at most ADMISSION_MAX."""
    if cpu_per_handshake <= 0:
        return ADMISSION_MAX
    fits = int(connect_timeout * share / cpu_per_handshake)
    return max(ADMISSION_MIN, min(ADMISSION_MAX, fits))


def well_under(latency_s: float, timed_out: bool, target_s: float) -> bool:
    """Whether a handshake ended well under the target (in under half of it): the width may grow; the first one
    that does not ends the slow start."""
    return not timed_out and latency_s < target_s / 2


def next_width(width: float, latency_s: float, timed_out: bool, target_s: float, fresh: bool, ceiling: int,
               slow_start: bool = True) -> float:
    """The width after one handshake ended `latency_s` after its admission: half (never under ADMISSION_MIN) when
    it timed out or passed the target and was admitted since the last halving (`fresh`); more when it ended in
    under half the target: one in `slow_start` (a round of such endings doubles the width), else 1/width (a round
    of them adds one); else the same. Never over `ceiling` (the CPU width)."""
    if timed_out or latency_s > target_s:
        width = max(ADMISSION_MIN, width // 2) if fresh else width
    elif well_under(latency_s, timed_out, target_s):
        width += 1 if slow_start else 1 / width
    return max(min(ADMISSION_MIN, ceiling), min(width, ceiling))


def handshake_cost(estimate: float, cpu_s: float, ended: int, weight: float = COST_WEIGHT) -> float:
    """The CPU a handshake costs, after a measurement: `cpu_s` of the loop's CPU while `ended` handshakes ended
    (everything the loop did meanwhile counts: an over-estimate admits fewer, never too many)."""
    if ended <= 0:
        return estimate
    return estimate + weight * (cpu_s / ended - estimate)


@dataclass(kw_only=True)
class AdmissionStats:
    """What admission did on this loop so far (for a benchmark, and the host's log when it waited)."""

    width: int  # in force now: the latency's width under the CPU's ceiling
    ceiling: int = ADMISSION_MAX  # the CPU width
    cpu_per_handshake_s: float = HANDSHAKE_CPU_DEFAULT_S
    peak_width: int = 0
    halvings: int = 0
    timed_out: int = 0  # handshakes that timed out once admitted
    worst_latency_s: float = 0.0  # the longest from admission to a handshake's end
    width_path: list[int] = field(default_factory=list)  # the width at each turn: start, each peak, each halving
    in_flight: int = 0
    peak_in_flight: int = 0
    waiting: int = 0
    peak_waiting: int = 0
    handshakes: int = 0  # ended, connected or not


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """One handshake's admission: whether it had to wait (the loop was at its width), for how long (attention
    seconds), and the handshakes in flight with it once it got in."""

    queued: bool
    waited_s: float
    in_flight: int
    width: int


class Admission:
    """The handshake limiter of one event loop: `async with admission.handshake(connect_timeout) as admitted:`."""

    def __init__(self) -> None:
        self._timeout = float("inf")  # the smallest connect_timeout asked for so far
        ceiling = admission_width(10.0, HANDSHAKE_CPU_DEFAULT_S)
        self._latency_width: float = ADMISSION_START
        self.stats = AdmissionStats(width=min(ADMISSION_START, ceiling), ceiling=ceiling, width_path=[ADMISSION_START])
        self._limiter = anyio.CapacityLimiter(self.stats.width)
        self._cpu_from = 0.0  # the loop thread's CPU time when the measurement began
        self._ended = 0  # handshakes ended (not timed out) since then
        self._round = 0  # halvings so far: a handshake admitted before the last one halves no more
        self._growing = True  # whether the width grew since its last turn (for width_path)
        self._slow_start = True  # until the first handshake that is not well under the target

    @asynccontextmanager
    async def handshake(self, connect_timeout: float) -> AsyncIterator[Admitted]:
        """Wait for room (the controller's wait, not the host's), then hold it for one handshake."""
        if connect_timeout < self._timeout:
            self._timeout = connect_timeout
            self._resize()
        clock, token, stats = loop_clock(), object(), self.stats
        asked, queued = clock.now(), self._limiter.available_tokens < 1 or stats.waiting > 0
        stats.waiting += queued
        stats.peak_waiting = max(stats.peak_waiting, stats.waiting)
        try:
            await self._limiter.acquire_on_behalf_of(token)
        finally:
            stats.waiting -= queued
        timed_out, cut_short, began, round_ = False, False, clock.now(), self._round
        try:
            self._begin()
            yield Admitted(queued=queued, waited_s=began - asked, in_flight=stats.in_flight, width=stats.width)
        except TimeoutError:
            timed_out = True
            raise
        except BaseException as exc:
            cut_short = not isinstance(exc, Exception)  # cancelled: says nothing of the servers' pace
            raise
        finally:
            self._end(clock.now() - began, timed_out, round_ == self._round, cut_short)
            self._limiter.release_on_behalf_of(token)

    def _begin(self) -> None:
        stats = self.stats
        if stats.in_flight == 0:
            self._cpu_from, self._ended = time.thread_time(), 0
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)

    def _end(self, latency_s: float, timed_out: bool, fresh: bool, cut_short: bool = False) -> None:
        stats = self.stats
        stats.in_flight -= 1
        stats.handshakes += 1
        stats.timed_out += timed_out
        stats.worst_latency_s = max(stats.worst_latency_s, latency_s)
        # A handshake that timed out or was cancelled may have done no work: it is no share of the CPU measured.
        self._ended += not (timed_out or cut_short)
        if not cut_short:
            self._steer(latency_s, timed_out, fresh)
        if self._ended >= SAMPLE_EVERY or stats.in_flight == 0:
            now = time.thread_time()
            stats.cpu_per_handshake_s = handshake_cost(stats.cpu_per_handshake_s, now - self._cpu_from, self._ended)
            if self._ended:
                self._cpu_from, self._ended = now, 0
        self._resize()

    def _steer(self, latency_s: float, timed_out: bool, fresh: bool) -> None:
        """The latency's width after one handshake ended (`next_width`), its turns kept in the stats."""
        stats, before = self.stats, self._latency_width
        target = self._target() * LATENCY_SHARE
        self._latency_width = next_width(before, latency_s, timed_out, target, fresh, stats.ceiling,
                                         slow_start=self._slow_start)
        self._slow_start = self._slow_start and well_under(latency_s, timed_out, target)
        if self._latency_width < before and (timed_out or latency_s > target):
            self._round += 1
            stats.halvings += 1
            self._turn(int(before), growing=False)
        elif int(self._latency_width) > int(before) and not self._growing:
            self._turn(int(before), growing=True)

    def _turn(self, width: int, growing: bool) -> None:
        path = self.stats.width_path
        if self._growing != growing and path[-1] != width and len(path) < PATH_KEPT:
            path.append(width)
        self._growing = growing

    def _target(self) -> float:
        return self._timeout if self._timeout != float("inf") else 10.0

    def _resize(self) -> None:
        stats = self.stats
        stats.ceiling = admission_width(self._target(), stats.cpu_per_handshake_s)
        self._latency_width = min(self._latency_width, stats.ceiling)
        stats.width = int(self._latency_width)
        stats.peak_width = max(stats.peak_width, stats.width)
        self._limiter.total_tokens = stats.width


_ADMISSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Admission] = weakref.WeakKeyDictionary()


def admission() -> Admission:
    """The running loop's Admission (one a loop, made on first use)."""
    loop = asyncio.get_running_loop()
    found = _ADMISSIONS.get(loop)
    if found is None:
        found = _ADMISSIONS[loop] = Admission()
    return found
