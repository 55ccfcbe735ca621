"""A run's options and its state as it goes: `RunOptions` (what the CLI's run options set), `SchedulerOptions`,
the run's `Deadline` and `RunState` (why it was cut short, why no new host starts)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import anyio

from fleet.engine.walk import Mode
from fleet.engine.waves import Amount
from fleet.model.report import Reason


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """`--scheduler NAME` (or the inventory's `scheduler:`): which workload manager (`fleet.engine.schedulers`),
    how long a node's jobs may take to end (`--drain-wait`), and whether the scheduler itself runs the reset on its
    nodes (`fan_out`: `--via`, Slurm's `srun`) instead of SSH fan-out."""

    name: str
    drain_wait_s: float = 600.0
    fan_out: bool = False


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a run goes: what it does to each host, and the bounds the CLI's run options set."""

    mode: Mode = Mode.RESET
    concurrency: int | None = None
    batch: Amount | None = None
    max_fail: Amount | None = None
    canary: int = 0
    deadline_s: float | None = None
    stop_units: bool = False  # stop the unit of a holder that respawns (not in services, not protected)
    gpu_reset: bool = False  # reset GPUs whose memory does not come back (`fleet.reset.remedy`)
    restore_settings: bool = False  # give the GPUs their `gpu_settings` back after the kill (`fleet.reset.restore`)
    scheduler: SchedulerOptions | None = None  # None: no workload manager is asked
    uniform: bool = False  # fail the hosts whose GPU settings differ from the run's others (`fleet.model.uniformity`)


@dataclass
class Deadline:
    """The run's `--deadline`: when it passes (anyio clock, set at start) and whether it cut the run short."""

    seconds: float | None = None
    at: float | None = None
    hit: bool = False

    def start(self) -> float:
        """Start counting; the seconds the run may take (infinite without a deadline)."""
        if self.seconds is None:
            return math.inf
        self.at = anyio.current_time() + self.seconds
        return self.seconds

    @property
    def passed(self) -> bool:
        return self.hit or (self.at is not None and anyio.current_time() >= self.at)

    def __str__(self) -> str:
        return f"run deadline of {self.seconds:g} s reached"


@dataclass(kw_only=True)
class RunState:
    deadline: Deadline = field(default_factory=Deadline)
    interrupted: bool = False
    by: str | None = None  # the signal that interrupted the run (`SIGINT`, `SIGTERM`, `SIGHUP`)
    stopped: str | None = None  # why no new host starts: the failure budget or the canary
    started: float | None = None  # when the run started (monotonic clock): each host's start is said from it

    def cut_short(self) -> str:
        """What ends unfinished hosts: the run deadline once it has passed, else an interrupt."""
        if self.deadline.passed and not self.interrupted:
            return str(self.deadline)
        return "interrupted"

    def why_cut(self) -> str | None:
        """What cut the run short, once something has (`interrupted by SIGINT`, `run deadline of 600 s reached`);
        None while nothing has."""
        if self.interrupted:
            return f"interrupted by {self.by}" if self.by else "interrupted"
        return str(self.deadline) if self.deadline.passed else None

    def cut_reason(self) -> Reason:
        return Reason.DEADLINE if self.cut_short() != "interrupted" else Reason.INTERRUPTED
