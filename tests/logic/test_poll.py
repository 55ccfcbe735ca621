"""The one wait (fleet.node.poll.poll_until): it looks until what it sees is what it waits for, pauses between
looks, gives up when its pauses or its window are over, and never gives up without a look after its last wake-up,
however late that wake-up came. The clock here is driven by the test (the window's `now()`), never asserted on."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import anyio
import pytest

from fleet.node import poll
from fleet.node.budget import BudgetSpent, TimeBudget
from fleet.node.poll import POLL_CAP_S, Polled, backoff, poll_until

# A pause short enough that a test of several looks takes no time to speak of.
PAUSE_S = 0.001


@dataclass
class DrivenClock:
    """An attention clock the test drives: `now()` is the seconds passed minus the seconds the loop was late."""

    passed: float = 0.0
    late: float = 0.0

    def now(self) -> float:
        return self.passed - self.late

    def stall(self, seconds: float, *, left_out: bool) -> None:
        """The loop held `seconds`; an attention clock leaves them out, a wall clock counts them."""
        self.passed += seconds
        if left_out:
            self.late += seconds


@dataclass
class Node:
    """A fake observation: what the node shows at each look (the last one ever after), counted."""

    shows: list[int]
    looks: list[int] = field(default_factory=list)
    looked: anyio.Event = field(default_factory=anyio.Event)

    async def look(self) -> int:
        seen = self.shows[min(len(self.looks), len(self.shows) - 1)]
        self.looks.append(seen)
        self.looked.set()
        return seen


def zero(seen: int) -> bool:
    return seen == 0


def pauses(count: int) -> itertools.repeat[float]:
    return itertools.repeat(PAUSE_S, count)


async def test_what_it_waits_for_at_the_first_look_ends_the_wait_at_once() -> None:
    node = Node([0])
    assert await poll_until(node.look, zero, pauses(5)) == Polled(0, 1, met=True)


async def test_it_looks_until_it_sees_what_it_waits_for() -> None:
    node = Node([3, 2, 0, 5])
    assert await poll_until(node.look, zero, pauses(10)) == Polled(0, 3, met=True)
    assert node.looks == [3, 2, 0]


async def test_when_the_pauses_run_out_it_gives_up_with_the_last_thing_seen() -> None:
    """A number of tries is a number of pauses: two pauses, three looks."""
    node = Node([3, 2, 1, 0])
    assert await poll_until(node.look, zero, pauses(2)) == Polled(1, 3, met=False)


async def test_something_already_seen_is_decided_on_before_any_look() -> None:
    node = Node([0])
    assert await poll_until(node.look, zero, pauses(5), first=0) == Polled(0, 0, met=True)
    assert node.looks == []
    assert await poll_until(node.look, zero, pauses(5), first=4) == Polled(0, 1, met=True)


async def test_a_window_already_over_gives_up_without_pausing_again() -> None:
    clock = DrivenClock()
    window = TimeBudget(window=1.0, clock=clock)
    clock.stall(1.0, left_out=False)
    node = Node([4, 0])
    assert await poll_until(node.look, zero, pauses(5), within=window) == Polled(4, 1, met=False)


async def test_a_window_that_ended_while_the_loop_was_held_is_looked_at_once_more() -> None:
    """The late wake-up: the window ends (on a clock that counts the stall) while the wait sleeps; it looks once
    more after it wakes, and what the node shows then decides."""
    clock = DrivenClock()
    window = TimeBudget(window=1.0, clock=clock)
    node = Node([4, 0])
    async with anyio.create_task_group() as group:
        group.start_soon(stall_after_first_look, node, clock, False)
        polled = await poll_until(node.look, zero, backoff(), within=window)
    assert polled == Polled(0, 2, met=True)
    assert window.window_left < 0


async def test_after_a_late_wake_up_with_nothing_changed_it_gives_up_on_that_look() -> None:
    clock = DrivenClock()
    window = TimeBudget(window=1.0, clock=clock)
    node = Node([4])
    async with anyio.create_task_group() as group:
        group.start_soon(stall_after_first_look, node, clock, False)
        polled = await poll_until(node.look, zero, backoff(), within=window)
    assert polled == Polled(4, 2, met=False)


async def test_on_the_attention_clock_a_stall_spends_none_of_the_window() -> None:
    """The same stall, left out of the clock: the window is still open, and the wait goes on until it is met."""
    clock = DrivenClock()
    window = TimeBudget(window=1.0, clock=clock)
    node = Node([4, 3, 0])
    async with anyio.create_task_group() as group:
        group.start_soon(stall_after_first_look, node, clock, True)
        polled = await poll_until(node.look, zero, pauses(10), within=window)
    assert polled == Polled(0, 3, met=True)
    assert window.window_left > poll.POLL_MARGIN_S


async def test_the_event_loop_held_past_the_window_during_a_look_is_not_the_nodes_time() -> None:
    """On the running loop's own attention clock: the first look holds the loop twice the window; the wait goes
    on and sees the node change."""
    window = TimeBudget(window=1.0)
    node = Node([4, 0])

    async def held_look() -> int:
        if not node.looks:
            hold_the_loop(2.0)
        return await node.look()

    assert await poll_until(held_look, zero, backoff(), within=window) == Polled(0, 2, met=True)


async def test_what_a_look_raises_ends_the_wait() -> None:
    async def refused() -> int:
        raise BudgetSpent("step budget of 1 s spent")

    with pytest.raises(BudgetSpent):
        await poll_until(refused, zero, pauses(5))


def test_the_backoff_grows_by_half_from_a_tenth_of_a_second_and_stays_at_its_cap_for_good() -> None:
    waits = list(itertools.islice(backoff(), 500))
    assert waits[:3] == pytest.approx([0.1, 0.15, 0.225])
    assert all(later >= earlier for earlier, later in itertools.pairwise(waits))
    assert max(waits) == waits[-1] == POLL_CAP_S


def hold_the_loop(seconds: float) -> None:
    """Hold the event loop on purpose (a GC pause, a burst of handshakes)."""
    time.sleep(seconds)


async def stall_after_first_look(node: Node, clock: DrivenClock, left_out: bool) -> None:
    """Once the wait has looked and gone to sleep, hold the loop 5 s (on the driven clock)."""
    await node.looked.wait()
    clock.stall(5.0, left_out=left_out)
