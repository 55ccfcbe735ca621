"""Connection admission (fleet.transport.ssh.admission): the width arithmetic on its edges, and the limiter holding
to it."""

from __future__ import annotations

import anyio
import pytest

from fleet.transport.ssh.admission import (
    ADMISSION_MAX,
    ADMISSION_MIN,
    ADMISSION_START,
    HANDSHAKE_CPU_DEFAULT_S,
    Admission,
    admission,
    admission_width,
    handshake_cost,
    next_width,
    well_under,
)


def test_the_width_is_what_fits_in_a_share_of_connect_timeout() -> None:
    """The measured figures: 1.74 ms a handshake, 10 s: 2,873 in flight finish in 5 s of one loop, not 17 s."""
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


# next_width(width, latency_s, timed_out, target_s, fresh, ceiling): target 3 s (0.3 of a 10 s connect_timeout).
def test_a_handshake_well_under_the_target_widens_by_one_so_a_round_of_them_doubles() -> None:
    width = 32.0
    for _ in range(32):  # one round: as many fast endings as were in flight
        width = next_width(width, 0.5, False, 3.0, True, ADMISSION_MAX)
    assert width == 64


def test_after_the_first_halving_a_round_of_fast_handshakes_widens_by_one() -> None:
    width = 64.0
    for _ in range(64):
        width = next_width(width, 0.5, False, 3.0, True, ADMISSION_MAX, slow_start=False)
    assert 64.9 < width < 65.1


@pytest.mark.parametrize(("latency", "timed_out", "under"), [
    (1.4, False, True), (1.5, False, False), (2.9, False, False), (0.1, True, False)])
def test_only_a_handshake_in_under_half_the_target_is_well_under_it(latency: float, timed_out: bool,
                                                                    under: bool) -> None:
    """The first handshake that is not ends the slow start (before any halving: the doubling stops as the
    handshakes slow down, not only once one is late)."""
    assert well_under(latency, timed_out, 3.0) is under


def test_a_handshake_near_the_target_holds_the_width() -> None:
    assert next_width(200, 2.0, False, 3.0, True, ADMISSION_MAX) == 200


@pytest.mark.parametrize(("latency", "timed_out"), [(3.5, False), (0.1, True)])
def test_a_late_or_timed_out_handshake_halves_it_once_a_round(latency: float, timed_out: bool) -> None:
    assert next_width(400, latency, timed_out, 3.0, True, ADMISSION_MAX) == 200
    assert next_width(400, latency, timed_out, 3.0, False, ADMISSION_MAX) == 400  # admitted before the last halving
    assert next_width(20, latency, timed_out, 3.0, True, ADMISSION_MAX) == ADMISSION_MIN  # never under the floor


def test_the_cpu_width_is_the_ceiling() -> None:
    assert next_width(100, 0.1, False, 3.0, True, 100) == 100
    assert next_width(300, 2.0, False, 3.0, True, 100) == 100  # a ceiling lowered since: the width follows


async def test_timed_out_handshakes_never_make_handshakes_look_cheaper() -> None:
    """Handshakes that time out at once did no work: no share of the CPU measured is theirs, and each halves the
    width of its round (the first of each round, the others were admitted before its halving)."""
    limiter = Admission()
    for _ in range(40):
        with pytest.raises(TimeoutError):
            async with limiter.handshake(10.0):
                raise TimeoutError
    stats = limiter.stats
    assert stats.cpu_per_handshake_s == HANDSHAKE_CPU_DEFAULT_S
    assert (stats.timed_out, stats.handshakes, stats.width) == (40, 40, ADMISSION_MIN)
    assert stats.width_path == [ADMISSION_START]  # never grew: a start, then only halvings


async def test_a_cancelled_handshake_neither_steers_the_width_nor_looks_cheap() -> None:
    limiter = Admission()
    with anyio.CancelScope() as scope:
        for _ in range(40):
            async with limiter.handshake(10.0):
                scope.cancel()
                await anyio.sleep(1)
    stats = limiter.stats
    assert (stats.handshakes, stats.width, stats.cpu_per_handshake_s) == (1, ADMISSION_START, HANDSHAKE_CPU_DEFAULT_S)


async def test_fast_handshakes_widen_it_and_the_path_records_the_turns() -> None:
    limiter = Admission()
    for _ in range(10):
        async with limiter.handshake(10.0):
            pass
    assert limiter.stats.width == ADMISSION_START + 10
    with pytest.raises(TimeoutError):
        async with limiter.handshake(10.0):
            raise TimeoutError
    assert limiter.stats.width_path == [ADMISSION_START, ADMISSION_START + 10]  # the start, the peak
    for _ in range(22):  # after a halving: 1/width more a fast handshake, so one more a round (and a bit)
        async with limiter.handshake(10.0):
            pass
    assert limiter.stats.width == 22
    assert limiter.stats.width_path == [ADMISSION_START, ADMISSION_START + 10, 21]  # and the trough


async def test_one_admission_a_loop_starting_at_the_default_cost() -> None:
    assert admission() is admission()
    fresh = Admission()
    assert fresh.stats.cpu_per_handshake_s == HANDSHAKE_CPU_DEFAULT_S
    assert fresh.stats.ceiling == admission_width(10.0, HANDSHAKE_CPU_DEFAULT_S)
    assert fresh.stats.width == ADMISSION_START < fresh.stats.ceiling  # slow start: small, then doubled


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
