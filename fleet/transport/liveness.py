"""Is a session still there? Decided from the session itself, never from how long one wait took.

A slow node is not a dead one: an sshd starved of CPU by a runaway job, a node under memory pressure, or
a controller whose event loop is late with 10,000 connections all make a channel open or an exit status
arrive late. So a wait on a session (a channel open, a command's end, the lock's first line) that lasts
PROBE_AFTER_S starts asking the session itself: an SSH keepalive request (`keepalive@openssh.com`, which
every server answers, if only with "unknown request"), again every PROBE_EVERY_S while the wait lasts.
The session is *silent* when one request goes unanswered for `silence_s` seconds of the controller's
attention (`fleet.transport.attention`): the seconds its own event loop was late do not count, so the
controller's lateness never reads as the node's silence.

Nothing here runs for a command that ends within PROBE_AFTER_S: no request, no timer beyond the wait's own.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from fleet.transport.attention import loop_clock

# Seconds a wait on a session lasts before fleet asks the session whether it is still there.
PROBE_AFTER_S = 2.0
# Seconds between two keepalive requests while a wait lasts (a new one once the last is answered).
PROBE_EVERY_S = 2.0
# Least seconds of the controller's attention a keepalive request may go unanswered before the session is
# silent (at most connect_timeout more: the host's own word on how long its server may take to answer).
SILENCE_MIN_S = 10.0


def silence_s(connect_timeout: float) -> float:
    """Seconds of attention an unanswered keepalive request is given: connect_timeout, at least SILENCE_MIN_S."""
    return max(SILENCE_MIN_S, connect_timeout)


class Pingable(Protocol):
    """What a Pinger needs of a connection: a global request that waits for its reply."""

    async def _make_global_request(self, request: bytes, *args: bytes) -> object: ...


class Pinger:
    """Keepalive requests on one connection while one wait lasts; `silent()` says whether it stopped answering.

    asyncssh sends keepalives only on a timer it re-arms for every packet (a fifth of the controller's CPU at
    512 hosts), so fleet asks through the same request asyncssh's keepalive sends (`_make_global_request`,
    asyncssh 2.x), and only while a wait is slow. A connection that closes answers every request (with a
    failure): the wait then ends with the connection's own error.
    """

    def __init__(self, conn: Pingable, silence: float) -> None:
        self._conn = conn
        self._silence = silence
        self._clock = loop_clock()
        self._ping: asyncio.Future[object] | None = None  # the request in flight
        self._sent_at = 0.0  # on the attention clock
        self.answered = 0  # requests answered during this wait

    def __enter__(self) -> Pinger:
        self._send()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._ping is not None and not self._ping.done():
            self._ping.cancel()

    def silent(self) -> bool:
        """Whether the request in flight is unanswered past the silence bound; sends the next one when due."""
        now = self._clock.now()
        if self._ping is not None and self._ping.done() and self._replied(self._ping):
            self._ping = None
            self.answered += 1
        if self._ping is None:
            if now - self._sent_at >= PROBE_EVERY_S:
                self._send()
            return False
        return now - self._sent_at >= self._silence

    @staticmethod
    def _replied(ping: asyncio.Future[object]) -> bool:
        """Whether a finished request got a reply (a refusal counts; a closed connection refuses every one).
        One that raised proved nothing: it stays unanswered and its silence clock runs on."""
        return not ping.cancelled() and ping.exception() is None

    def _send(self) -> None:
        self._sent_at = self._clock.now()
        self._ping = asyncio.ensure_future(self._conn._make_global_request(b"keepalive@openssh.com"))
