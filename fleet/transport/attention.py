"""The controller's attention: seconds its event loop was able to run, the seconds it was late left out.

A late controller is never a node's failure. One event loop drives every host; a GC pause, a burst of 10,000
handshakes or a blocking call holds all of them at once, and a bound measured on the wall clock would then fail
hosts that did nothing wrong. So every bound fleet puts on a node from the controller's side (connecting, logging
in, a step's budget, a session's silence) is measured on this clock: the loop's own time minus how late the loop
has run (`LoopLag`). A late controller only makes a run slower.

    `clock()`          the running loop's `AttentionClock` (else a plain monotonic one, outside a loop)
    `fail_after(s)`    like anyio.fail_after, but s seconds of attention: re-armed after a late wake-up
    `move_on_at(t)`    like anyio.CancelScope(deadline=t), t on the attention clock
    `AttentionClock.call_at(t, fn)`  fn once the clock reads t (the primitive any lag-aware wait is built on)

The lag is sampled by one timer a loop (every LAG_TICK_S, from the first time the clock is asked for, for the
life of the loop), and the clock stands still from the moment that tick is due until the loop runs it: the
controller's attention is at most LAG_TICK_S a turn of the loop. A reading taken during a stall, or just after it
before the tick has run, already leaves the stall out; so does one taken while the loop is busy, not blocked (a
turn of 10,000 hosts' work on a starved machine lasts seconds, and each host reads the clock in it): a host waiting
for its turn is the controller's lateness too, never time the node had.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import anyio

# Seconds between the lateness samples of the event loop.
LAG_TICK_S = 0.25


class LoopLag:
    """How late this event loop has run: the sum of each tick's lateness (`total` only grows).

    Ticks every LAG_TICK_S once started. `attended(now)` is loop time `now` less the lateness, standing still from
    the moment the next tick is due until the loop runs it (however often it is read meanwhile).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Held weakly, and its tick's handle not kept: the loop holds this (its tick), not the other way round,
        # so a loop that is done with is freed with its clock (one a loop, kept in _CLOCKS while the loop lives).
        self._loop: asyncio.AbstractEventLoop = weakref.proxy(loop)
        self._due = math.inf
        self._started = False
        self.total = 0.0

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._arm(self._loop.time())

    def attended(self, now: float) -> float:
        """Loop time `now` less the lateness: up to the due tick, no further, until the loop has run it."""
        return min(now, self._due) - self.total

    def _arm(self, now: float) -> None:
        self._due = now + LAG_TICK_S
        self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self.total += max(0.0, now - self._due)
        self._arm(now)


class Clock(Protocol):
    """What a budget reads: seconds that only grow."""

    def now(self) -> float: ...


class MonotonicClock:
    """The clock outside an event loop: nothing can be late there."""

    def now(self) -> float:
        return time.monotonic()


class AttentionClock:
    """The loop's time minus its lateness (see the module docstring); one a loop, from `clock()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop: asyncio.AbstractEventLoop = weakref.proxy(loop)  # held weakly, as LoopLag holds it
        self.lag = LoopLag(loop)
        self.lag.start()

    def now(self) -> float:
        return self.lag.attended(self._loop.time())

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call callback once this clock reads `when`: a wake-up that came late (the loop was held) looks at the
        clock again and waits for the attention still owed."""
        return Timer(self, when, callback)

    def loop_time_at(self, when: float) -> float:
        """The loop time at which this clock would read `when`, if the loop is not late from now on."""
        return self._loop.time() + (when - self.now())


class Timer:
    """A callback due at an attention time; `cancel()` before it fires and it never does."""

    def __init__(self, clock: AttentionClock, when: float, callback: Callable[[], object]) -> None:
        self._clock, self._when, self._callback = clock, when, callback
        self.fired = False
        self._handle = clock._loop.call_at(clock.loop_time_at(when), self._wake)

    def cancel(self) -> None:
        self._handle.cancel()

    def _wake(self) -> None:
        owed = self._when - self._clock.now()
        if owed > 0:  # woke late or early: the loop was held meanwhile, and that time was not the host's
            self._handle = self._clock._loop.call_later(owed, self._wake)
            return
        self.fired = True
        self._callback()


_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AttentionClock] = weakref.WeakKeyDictionary()
_MONOTONIC = MonotonicClock()


def loop_clock() -> AttentionClock:
    """The running loop's AttentionClock (one a loop, made on first use)."""
    loop = asyncio.get_running_loop()
    found = _CLOCKS.get(loop)
    if found is None:
        found = _CLOCKS[loop] = AttentionClock(loop)
    return found


def clock() -> Clock:
    """The running loop's AttentionClock; outside an event loop, the monotonic clock."""
    try:
        return loop_clock()
    except RuntimeError:  # no running event loop
        return _MONOTONIC


@contextmanager
def move_on_at(when: float) -> Iterator[anyio.CancelScope]:
    """Like anyio.CancelScope(deadline=...): the body is cancelled once this loop's attention clock reads `when`
    (`cancelled_caught` says so); it goes on past a deadline that passed while the loop was held."""
    attention = loop_clock()
    with anyio.CancelScope() as scope:
        timer = attention.call_at(when, scope.cancel)
        try:
            yield scope
        finally:
            timer.cancel()


@contextmanager
def fail_after(seconds: float) -> Iterator[anyio.CancelScope]:
    """Like anyio.fail_after: TimeoutError once the body has had `seconds` of the controller's attention."""
    with move_on_at(loop_clock().now() + seconds) as scope:
        yield scope
    if scope.cancelled_caught:
        raise TimeoutError
