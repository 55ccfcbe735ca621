"""Connection admission (fleet.transport.ssh.admission): the width arithmetic on its edges, and the limiter holding
to it."""

from __future__ import annotations

import anyio
import pytest

from fleet.transport.ssh.admission import (
    ADMISSION_MAX,
    ADMISSION_MIN,
    HANDSHAKE_CPU_DEFAULT_S,
    Admission,
    admission,
    admission_width,
    handshake_cost,
)


def test_the_width_is_what_fits_in_a_share_of_connect_timeout() -> None:
    """The issue's figures: 1.74 ms a handshake, 10 s: 2,873 in flight finish in 5 s of one loop, not 17 s."""
    assert admission_width(10.0, 0.00174) == 2873
    assert admission_width(10.0, 0.00174) * 0.00174 <= 10.0 / 2


@pytest.mark.parametrize(("timeout", "cost", "width"), [
    (10.0, 0.0, ADMISSION_MAX),  # nothing measured costs nothing: the cap
    (10.0, 1e-6, ADMISSION_MAX),
    (0.1, 0.01, ADMISSION_MIN),  # a few never crowd a loop
    (300.0, 0.003, ADMISSION_MAX),
])
def test_the_width_is_bounded_both_ways(timeout: float, cost: float, width: int) -> None:
    assert admission_width(timeout, cost) == width


def test_a_slower_handshake_or_a_shorter_timeout_admits_fewer() -> None:
    assert admission_width(10.0, 0.004) < admission_width(10.0, 0.002)
    assert admission_width(5.0, 0.002) < admission_width(10.0, 0.002)


def test_the_cost_moves_toward_each_measurement() -> None:
    assert handshake_cost(0.003, 0.020, 10) == pytest.approx(0.0025)  # 2 ms measured: half way from 3 ms
    assert handshake_cost(0.003, 0.040, 10, weight=1.0) == pytest.approx(0.004)
    assert handshake_cost(0.003, 1.0, 0) == 0.003  # nothing ended: nothing learned


async def test_one_admission_a_loop_starting_at_the_default_cost() -> None:
    assert admission() is admission()
    fresh = Admission()
    assert fresh.stats.cpu_per_handshake_s == HANDSHAKE_CPU_DEFAULT_S
    assert fresh.stats.width == admission_width(10.0, HANDSHAKE_CPU_DEFAULT_S)


async def test_never_more_in_flight_than_the_width_and_the_rest_wait_their_turn() -> None:
    """A connect_timeout so short that the width is its floor: 40 handshakes asked at once, 16 in flight, 24 wait
    (and say so); each gets in when one ends, and the cost is measured from them."""
    limiter, ended = Admission(), anyio.Event()
    admitted: list[bool] = []

    async def one() -> None:
        async with limiter.handshake(0.001) as got:
            admitted.append(got.queued)
            assert got.in_flight <= got.width == ADMISSION_MIN
            await ended.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(one)
        with anyio.fail_after(10):
            while limiter.stats.waiting < 40 - ADMISSION_MIN:  # noqa: ASYNC110 - the limiter has no event to await
                await anyio.sleep(0.01)
        assert (limiter.stats.in_flight, len(admitted)) == (ADMISSION_MIN, ADMISSION_MIN)
        ended.set()
    stats = limiter.stats
    assert (stats.in_flight, stats.waiting, stats.handshakes) == (0, 0, 40)
    assert (stats.peak_in_flight, stats.peak_waiting) == (ADMISSION_MIN, 40 - ADMISSION_MIN)
    assert admitted.count(True) == 40 - ADMISSION_MIN
    assert stats.cpu_per_handshake_s != HANDSHAKE_CPU_DEFAULT_S
