"""Waves, canary, failure budget and deadline arithmetic, on the edge cases."""

from __future__ import annotations

import pytest

from fleet.engine.waves import Amount, FailureBudget, parse_amount, parse_duration, split_waves, tolerated, wave_size
from fleet.model.errors import UsageError

HOSTS = [f"h{i:02d}" for i in range(10)]


@pytest.mark.parametrize(
    ("text", "amount"),
    [("3", Amount(3)), ("0%", Amount(0, True)), ("100%", Amount(100, True)), ("25%", Amount(25, True))],
)
def test_parse_amount(text: str, amount: Amount) -> None:
    assert parse_amount(text, "--batch") == amount


@pytest.mark.parametrize("text", ["", "-1", "1.5", "101%", "abc", "%", "5 %"])
def test_parse_amount_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_amount(text, "--max-fail")


def test_batch_zero_is_refused_but_max_fail_zero_is_fine() -> None:
    with pytest.raises(UsageError, match="at least one host"):
        parse_amount("0", "--batch")
    assert parse_amount("0", "--max-fail") == Amount(0)


@pytest.mark.parametrize(
    ("batch", "sizes"),
    [
        (None, [10]),
        (Amount(3), [3, 3, 3, 1]),            # a last partial wave
        (Amount(50), [10]),                   # N larger than the fleet
        (Amount(0, True), [1] * 10),          # 0% rounds down to 0, and a wave has at least one host
        (Amount(100, True), [10]),
        (Amount(25, True), [2, 2, 2, 2, 2]),  # 25% of 10 = 2.5, rounded down
    ],
)
def test_waves(batch: Amount | None, sizes: list[int]) -> None:
    waves = split_waves(HOSTS, batch)
    assert [len(w) for w in waves] == sizes
    assert [h for w in waves for h in w] == HOSTS


def test_canary_goes_first_then_batches_of_the_rest() -> None:
    assert [len(w) for w in split_waves(HOSTS, Amount(4), canary=1)] == [1, 4, 4, 1]
    assert [len(w) for w in split_waves(HOSTS, None, canary=2)] == [2, 8]
    assert [len(w) for w in split_waves(HOSTS, None, canary=20)] == [10]


def test_wave_size_of_an_empty_fleet() -> None:
    assert wave_size(None, 0) == 1
    assert split_waves([], Amount(3)) == []


@pytest.mark.parametrize(
    ("max_fail", "total", "limit"),
    [(None, 10, None), (Amount(0), 10, 0), (Amount(2), 10, 2), (Amount(0, True), 10, 0),
     (Amount(100, True), 10, 10), (Amount(25, True), 10, 2), (Amount(15, True), 3, 0)],
)
def test_tolerated(max_fail: Amount | None, total: int, limit: int | None) -> None:
    assert tolerated(max_fail, total) == limit


def test_budget_must_be_exceeded_not_equalled() -> None:
    budget = FailureBudget(limit=2)
    budget.note_failure()
    budget.note_failure()
    assert not budget.spent
    budget.note_failure()
    assert budget.spent
    assert budget.reason() == "failure budget spent: 3 hosts failed or unreachable, 2 tolerated"
    assert not FailureBudget(limit=None, failures=99).spent


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400),
                                               ("1h", 3600), ("2m30s", 150), ("0.5s", 0.5)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "abc", "10x", "m", "-5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text)
