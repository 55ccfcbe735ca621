"""Blast-radius arithmetic, pure: rolling waves, the canary, the failure budget, the run deadline.

Ansible's rules where they exist: a percentage of the fleet is rounded down and a
wave has at least one host; the failure budget must be exceeded, not equalled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from fleet.model.errors import UsageError

T = TypeVar("T")

_AMOUNT = re.compile(r"^(\d+)(%?)$")
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


@dataclass(frozen=True)
class Amount:
    """`N` hosts or `P%` of the targets."""

    value: int
    percent: bool = False

    def of(self, total: int) -> int:
        """How many hosts this is out of total (a percentage rounds down)."""
        return math.floor(total * self.value / 100) if self.percent else self.value

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_amount(text: str, option: str) -> Amount:
    match = _AMOUNT.match(text.strip())
    if not match:
        raise UsageError(f"{option} takes a number of hosts or a percentage (N or P%), not {text!r}")
    value, percent = int(match.group(1)), bool(match.group(2))
    if percent and value > 100:
        raise UsageError(f"{option} {text}: a percentage is at most 100%")
    if not percent and value == 0 and option == "--batch":
        raise UsageError("--batch 0: a wave has at least one host (use a percentage or leave --batch out)")
    return Amount(value, percent)


def parse_duration(text: str, option: str = "--deadline", *, zero: bool = False) -> float:
    """`90`, `90s`, `10m`, `1h30m` -> seconds (`zero`: 0 is allowed too)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or not match or not any(g is not None for g in match.groups()):
        raise UsageError(f"{option} takes a duration such as 90s, 10m or 1h30m, not {text!r}")
    hours, minutes, seconds = match.groups()
    total = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)
    if total <= 0 and not (zero and total == 0):
        raise UsageError(f"{option} {text}: must be longer than zero")
    return total


def wave_size(batch: Amount | None, total: int) -> int:
    """Hosts per wave: all without --batch; never fewer than one."""
    if batch is None:
        return max(total, 1)
    return max(1, min(batch.of(total), total))


def split_waves(items: Sequence[T], batch: Amount | None, canary: int = 0) -> list[list[T]]:
    """The canary wave (if any), then waves of `batch` over the rest; the last wave may be partial."""
    items = list(items)
    waves: list[list[T]] = []
    if canary > 0:
        waves.append(items[:canary])
        items = items[canary:]
    size = wave_size(batch, len(items))
    waves.extend(items[i : i + size] for i in range(0, len(items), size))
    return [w for w in waves if w]


def tolerated(max_fail: Amount | None, total: int) -> int | None:
    """How many failed or unreachable hosts the run tolerates; None means no limit."""
    return None if max_fail is None else max_fail.of(total)


@dataclass
class FailureBudget:
    """Counts hosts that ended failed or unreachable; spent once the count exceeds what is tolerated."""

    limit: int | None
    failures: int = 0

    def note_failure(self) -> None:
        self.failures += 1

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.failures > self.limit

    def reason(self) -> str:
        return f"failure budget spent: {self.failures} hosts failed or unreachable, {self.limit} tolerated"
