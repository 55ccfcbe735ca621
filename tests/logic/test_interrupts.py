"""SIGINT/SIGTERM/SIGHUP over a run (`fleet.engine.interrupts`): the first cuts, the second tells, the third abandons; a
hang-up counts once. The signal path itself runs through the real CLI in test_slurm_faults.py and test_hangup.py;
here the counting and the scopes."""

from __future__ import annotations

import signal

import anyio

from fleet.engine.interrupts import HANGUP_LINE, HungUp, Interrupts, handled, hangups_unwind
from fleet.engine.options import RunState
from fleet.model.report import RunReport
from fleet.report import render as reporting


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


async def test_a_hang_up_cuts_as_ctrl_c_says_so_once_and_the_run_exits_129() -> None:
    """SIGHUP: one line on stderr, the run cut; the hang-up relayed again (shell, kernel) changes nothing."""
    said: list[str] = []
    interrupts = Interrupts(said.append)
    work = interrupts.finishing(lambda: "releasing 2 Slurm nodes", 45, "them drained")
    run, state = anyio.CancelScope(), RunState()
    interrupts.cuts(run, state)
    for _ in range(3):
        interrupts.received(signal.SIGHUP)
    assert run.cancel_called and state.interrupted and interrupts.by is signal.SIGHUP
    assert said == [HANGUP_LINE] and not work.abandoned
    interrupts.received(signal.SIGINT)  # the operator's own signals count: this is the first of three
    assert said[-1] == "fleet: still releasing 2 Slurm nodes (up to 45 s); twice more to abandon them drained"
    assert state.by == "SIGHUP"  # the report's `interrupted_by`, as the run makes it
    report = RunReport(run_id="r", command="reset", started_at="t", duration_s=1.0, hosts={}, interrupted_by=state.by)
    assert reporting.exit_code(report) == 129


def test_the_first_signal_names_the_exit_status() -> None:
    interrupts = Interrupts(lambda line: None)
    interrupts.received(signal.SIGTERM)
    interrupts.received(signal.SIGHUP)
    assert interrupts.by is signal.SIGTERM and interrupts.count == 1 and interrupts.hung_up


def test_a_hang_up_never_counts_towards_abandoning() -> None:
    """Ctrl-C, Ctrl-C, then the terminal closes: the hang-up is said, and nothing is abandoned; only a third SIGINT
    or SIGTERM abandons, however the signals came."""
    for order in ([signal.SIGINT, signal.SIGINT, signal.SIGHUP], [signal.SIGHUP, signal.SIGINT, signal.SIGTERM]):
        said: list[str] = []
        interrupts = Interrupts(said.append)
        work = interrupts.finishing(lambda: "releasing 3 Slurm nodes", 45, "them drained")
        for signum in order:
            interrupts.received(signum)
        assert not work.abandoned and HANGUP_LINE in said, (order, said)
        interrupts.received(signal.SIGTERM)
        assert work.abandoned, order
        assert said[-1] == "fleet: stopped releasing 3 Slurm nodes: left them drained; writing the report"


def test_sighup_is_handled_unless_fleet_started_with_it_ignored() -> None:
    """`nohup fleet ...` asked to outlive the terminal: fleet leaves SIGHUP ignored."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert handled() == (signal.SIGINT, signal.SIGTERM)
        with hangups_unwind():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert handled() == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, before)


def test_outside_a_run_a_hang_up_unwinds_as_ctrl_c_and_the_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGHUP)
    unwound = False
    with hangups_unwind():
        try:
            signal.raise_signal(signal.SIGHUP)  # to this test's own process; its handler runs before this returns
        except HungUp:
            unwound = True
    assert unwound and signal.getsignal(signal.SIGHUP) == before


async def test_watch_puts_back_the_handlers_it_found() -> None:
    """asyncio's removal leaves SIG_DFL; `watch` restores what was there (the CLI's hang-up unwinding)."""
    with hangups_unwind():
        found = signal.getsignal(signal.SIGHUP)
        async with anyio.create_task_group() as group:
            await group.start(Interrupts(lambda line: None).watch)
            assert signal.getsignal(signal.SIGHUP) != found
            group.cancel_scope.cancel()
        assert signal.getsignal(signal.SIGHUP) == found
