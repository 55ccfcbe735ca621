"""Slow is not silent: the keepalive Pinger and the event loop's own lateness (fleet.transport.liveness).

The connection here is a stand-in for asyncssh's global request (answer now, or never); the same Pinger over
the real OpenSSH sshd, frozen and thawed, is in test_ssh_faults.py.
"""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
from test_transport import eventually

from fleet.transport import liveness
from fleet.transport.liveness import LoopLag, Pinger, loop_lag, silence_s


def block_the_loop(seconds: float) -> None:
    """Hold the event loop on purpose (a GC pause, 10,000 connections' worth of work)."""
    time.sleep(seconds)


class Server:
    """Answers keepalive requests at once, or never (until told to)."""

    def __init__(self, answering: bool) -> None:
        self.answering = anyio.Event()
        if answering:
            self.answering.set()
        self.requests = 0

    async def _make_global_request(self, request: bytes, *args: bytes) -> object:
        assert request == b"keepalive@openssh.com"
        self.requests += 1
        await self.answering.wait()
        return None


async def test_a_blocked_loop_is_measured_as_lag_only_while_watched() -> None:
    """A loop blocked for 0.6 s while watched adds about that much; blocked while nobody watches, nothing."""
    lag = loop_lag()
    assert loop_lag() is lag
    before = lag.total
    block_the_loop(0.3)  # nobody watches: no tick is due
    await anyio.sleep(0.3)
    assert lag.total == before
    with lag:
        await anyio.sleep(liveness.LAG_TICK_S / 2)
        block_the_loop(0.6)
        await anyio.sleep(liveness.LAG_TICK_S * 2)
    assert lag.total - before >= 0.4


async def test_lag_stops_ticking_when_the_last_watcher_leaves() -> None:
    lag = LoopLag(asyncio.get_running_loop())
    with lag, lag:
        pass
    assert lag._handle is None


async def test_an_answering_session_is_never_silent_and_is_asked_again_while_the_wait_lasts() -> None:
    server = Server(answering=True)
    with Pinger(server, silence=0.5) as pinger:
        for _ in range(3):
            await anyio.sleep(liveness.PROBE_EVERY_S / 2 + 0.05)
            assert not pinger.silent()
    assert pinger.answered >= 1
    assert server.requests >= 2


async def test_an_unanswered_request_is_silence_after_the_bound() -> None:
    server = Server(answering=False)
    with Pinger(server, silence=1.0) as pinger:
        assert not pinger.silent()
        assert await eventually(pinger.silent, 10)  # the condition, not a wall-clock guess
    assert pinger.answered == 0 and server.requests == 1


async def test_the_controllers_own_lateness_is_not_the_sessions_silence() -> None:
    """The loop blocked past the silence bound (10,000 connections, a GC pause): the request was never read
    back because the controller was late, not the node; only attention given counts."""
    server = Server(answering=False)
    with Pinger(server, silence=1.0) as pinger:
        await anyio.sleep(liveness.LAG_TICK_S / 2)
        block_the_loop(2.0)
        await anyio.sleep(0.05)
        assert not pinger.silent()
        assert await eventually(pinger.silent, 10)  # the condition, not a wall-clock guess


async def test_a_late_answer_clears_the_silence_clock() -> None:
    server = Server(answering=False)
    with Pinger(server, silence=0.5) as pinger:
        await anyio.sleep(0.3)
        server.answering.set()
        await anyio.sleep(0.05)
        assert not pinger.silent()
        await anyio.sleep(0.4)
        assert not pinger.silent()
        assert pinger.answered == 1


@pytest.mark.parametrize(("connect_timeout", "expected"), [(2.0, liveness.SILENCE_MIN_S), (30.0, 30.0)])
def test_the_silence_bound_is_the_hosts_connect_timeout_at_least_the_floor(connect_timeout: float,
                                                                         expected: float) -> None:
    assert silence_s(connect_timeout) == expected


async def test_a_request_that_raised_is_no_answer() -> None:
    """A request that failed on the client's side (no reply read at all) never proves the session alive."""

    class Broken:
        async def _make_global_request(self, request: bytes, *args: bytes) -> object:
            raise RuntimeError("no transport")

    with Pinger(Broken(), silence=1.0) as pinger:
        await anyio.sleep(0.05)
        assert not pinger.silent()
        assert await eventually(pinger.silent, 10)  # the condition, not a wall-clock guess
    assert pinger.answered == 0
