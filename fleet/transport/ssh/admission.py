"""Connection admission: never more SSH handshakes in flight than this event loop can finish within connect_timeout.

Every handshake costs the one event loop CPU (key exchange, host key check, authentication: about 1.7 ms each on
loopback, AES-GCM and ed25519). 10,000 hosts started at once are 17 s of one loop against a 10 s connect_timeout:
each waits for all the others, and all of them are late. So a handshake waits for admission first (that wait is the
controller's, never counted against the host), and its connect_timeout starts once it is admitted.

The width (handshakes in flight at most) is `admission_width`: the handshakes whose CPU fits in ADMISSION_SHARE of
the smallest connect_timeout asked for, at the CPU a handshake costs on this loop, measured as the run goes
(`handshake_cost`: the loop thread's CPU time while handshakes were in flight, a share of it for each that ended),
from HANDSHAKE_CPU_DEFAULT_S until the first measurement. The arithmetic is plain functions; `Admission` is the
limiter, one an event loop (`admission()`), its `stats` what a benchmark reads.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from fleet.transport.attention import loop_clock

# Share of connect_timeout that the CPU of every handshake in flight may take of the loop: the rest is for the hosts
# already connected (their commands, their logs) and for a machine slower than the one measured.
ADMISSION_SHARE = 0.5
# Handshakes in flight at least (a few never crowd a loop) and at most (file descriptors, the servers' backlog).
ADMISSION_MIN = 16
ADMISSION_MAX = 4096
# CPU seconds of this loop a handshake is taken to cost until one is measured: 1.74 ms measured on loopback (the
# issue's figure at 10,000 hosts), rounded up to leave room for a slower controller.
HANDSHAKE_CPU_DEFAULT_S = 0.003
# Weight of a new measurement against the estimate so far.
COST_WEIGHT = 0.5
# Handshakes ended between two measurements (a measurement is also taken whenever none is left in flight).
SAMPLE_EVERY = 32


def admission_width(connect_timeout: float, cpu_per_handshake: float, share: float = ADMISSION_SHARE) -> int:
    """How many handshakes may be in flight at once: as many as finish, one after the other on one loop, within
    `share` of connect_timeout; at least ADMISSION_MIN, at most ADMISSION_MAX."""
    if cpu_per_handshake <= 0:
        return ADMISSION_MAX
    fits = int(connect_timeout * share / cpu_per_handshake)
    return max(ADMISSION_MIN, min(ADMISSION_MAX, fits))


def handshake_cost(estimate: float, cpu_s: float, ended: int, weight: float = COST_WEIGHT) -> float:
    """The CPU a handshake costs, after a measurement: `cpu_s` of the loop's CPU while `ended` handshakes ended
    (everything the loop did meanwhile counts: an over-estimate admits fewer, never too many)."""
    if ended <= 0:
        return estimate
    return estimate + weight * (cpu_s / ended - estimate)


@dataclass
class AdmissionStats:
    """What admission did on this loop so far (for a benchmark, and the host's log when it waited)."""

    width: int
    cpu_per_handshake_s: float = HANDSHAKE_CPU_DEFAULT_S
    in_flight: int = 0
    peak_in_flight: int = 0
    waiting: int = 0
    peak_waiting: int = 0
    handshakes: int = 0  # ended, connected or not


@dataclass(frozen=True)
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
        self.stats = AdmissionStats(admission_width(10.0, HANDSHAKE_CPU_DEFAULT_S))
        self._limiter = anyio.CapacityLimiter(self.stats.width)
        self._cpu_from = 0.0  # the loop thread's CPU time when the measurement began
        self._ended = 0  # handshakes ended since then

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
        try:
            self._begin()
            yield Admitted(queued, clock.now() - asked, stats.in_flight, stats.width)
        finally:
            self._end()
            self._limiter.release_on_behalf_of(token)

    def _begin(self) -> None:
        stats = self.stats
        if stats.in_flight == 0:
            self._cpu_from, self._ended = time.thread_time(), 0
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)

    def _end(self) -> None:
        stats = self.stats
        stats.in_flight -= 1
        stats.handshakes += 1
        self._ended += 1
        if self._ended >= SAMPLE_EVERY or stats.in_flight == 0:
            now = time.thread_time()
            stats.cpu_per_handshake_s = handshake_cost(stats.cpu_per_handshake_s, now - self._cpu_from, self._ended)
            self._cpu_from, self._ended = now, 0
            self._resize()

    def _resize(self) -> None:
        timeout = self._timeout if self._timeout != float("inf") else 10.0
        self.stats.width = admission_width(timeout, self.stats.cpu_per_handshake_s)
        self._limiter.total_tokens = self.stats.width


_ADMISSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Admission] = weakref.WeakKeyDictionary()


def admission() -> Admission:
    """The running loop's Admission (one a loop, made on first use)."""
    loop = asyncio.get_running_loop()
    found = _ADMISSIONS.get(loop)
    if found is None:
        found = _ADMISSIONS[loop] = Admission()
    return found
