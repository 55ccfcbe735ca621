"""Slow is not silent: the keepalive Pinger and the event loop's own lateness (fleet.transport.liveness).

The connection here is a stand-in for asyncssh's global request (answer now, or never); the same Pinger over
the real OpenSSH sshd, frozen and thawed, is in test_ssh_faults.py.
"""

from __future__ import annotations

import time

import anyio
import pytest
from support.waits import eventually

from fleet.transport import attention, liveness
from fleet.transport.liveness import Pinger, silence_s


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


async def test_an_answering_session_is_never_silent_and_is_asked_again_while_the_wait_lasts() -> None:
    server = Server(answering=True)
    with Pinger(server, silence=0.5) as pinger, anyio.fail_after(30):
        while server.requests < 2:
            await anyio.sleep(0.1)
            assert not pinger.silent()
    assert pinger.answered >= 1


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
        await anyio.sleep(attention.LAG_TICK_S / 2)
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
