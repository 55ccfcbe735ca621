"""SIGINT/SIGTERM over a run (`fleet.interrupts`): the first cuts, the second tells, the third abandons. The signal
path itself runs through the real CLI in test_slurm_faults.py; here the counting and the scopes, with no signal."""

from __future__ import annotations

import anyio

from fleet.graph import RunState
from fleet.interrupts import Interrupts


async def test_the_first_cuts_the_run_the_second_tells_the_third_abandons() -> None:
    said: list[str] = []
    interrupts = Interrupts(said.append)
    left = ["sim1", "sim2"]
    work = interrupts.finishing(lambda: f"releasing {len(left)} Slurm nodes" if left else None, 45, "them drained")
    run, state = anyio.CancelScope(), RunState()
    interrupts.cuts(run, state)
    interrupts.received()
    assert run.cancel_called and state.interrupted and said == []
    interrupts.received()
    assert said == ["fleet: still releasing 2 Slurm nodes (up to 45 s); again to abandon them drained"]
    assert not work.abandoned
    interrupts.received()
    assert work.abandoned
    assert said[-1] == "fleet: stopped releasing 2 Slurm nodes: left them drained; writing the report"


def test_with_nothing_left_to_finish_a_later_signal_abandons_nothing() -> None:
    said: list[str] = []
    interrupts = Interrupts(said.append)
    work = interrupts.finishing(lambda: None, 45, "them drained")
    for _ in range(3):
        interrupts.received()
    assert not work.abandoned
    assert said == ["fleet: already interrupted: ending in-flight commands, then writing the report"] * 2


async def test_a_signal_before_the_run_began_cuts_it_at_once() -> None:
    interrupts = Interrupts(lambda line: None)
    interrupts.received()
    run, state = anyio.CancelScope(), RunState()
    interrupts.cuts(run, state)
    assert run.cancel_called and state.interrupted


async def test_abandon_cancels_a_shielded_scope_and_any_opened_after() -> None:
    interrupts = Interrupts(lambda line: None)
    work = interrupts.finishing(lambda: "releasing 1 Slurm node", 45, "it drained")
    reached = []

    async def release() -> None:
        with work.shielded() as scope:
            await anyio.sleep(30)
        reached.append(scope.cancelled_caught)

    async with anyio.create_task_group() as group:
        group.start_soon(release)
        await anyio.sleep(0.05)
        group.cancel_scope.cancel()  # the run's cancel does not reach a shielded release
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.05)
            assert reached == []
            work.abandon()
            await anyio.sleep(0.05)
    assert reached == [True]
    with work.shielded() as later:
        await anyio.sleep(30)
    assert later.cancelled_caught
