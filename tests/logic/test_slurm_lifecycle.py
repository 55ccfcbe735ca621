"""The Slurm lifecycle's rules at their edges, over a scripted Slurm (`scripted_slurm`): an update whose reply is
lost is read back, never assumed; the report's state_after is what Slurm shows; a resumed node's transient
NOT_RESPONDING is waited out; a drain left by a run that is over is taken over. The same rules run against the
real slurmctld in test_slurm_sim.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
import structlog
from support.scripted_slurm import ScriptedSlurm

from fleet.engine.walk import HostRun, Mode
from fleet.inventory.host import Host
from fleet.model.report import HostReport, HostStatus, Reason
from fleet.slurm import lifecycle as lifecycles
from fleet.slurm.lifecycle import RELEASE_COMMANDS, SETTLE_READ_S, SlurmLifecycle, finish_s, release_s
from fleet.slurm.policy import failed_reason
from fleet.slurm.tries import UPDATE_TRIES
from fleet.transport.base import client_deadline

RUN = "20261203T070000Z-abc123"
OWN = f"fleet: run {RUN}"
EARLIER = "20261202T070000Z-def456"


def lifecycle(slurm: ScriptedSlurm, over: tuple[str, ...] = (), timeout: float | None = None) -> SlurmLifecycle:
    return SlurmLifecycle(slurm.client(timeout), RUN, Mode.RESET, drain_wait_s=0, poll_s=0.01,
                          run_over=lambda run_id: run_id in over)


def log() -> Any:
    return structlog.wrap_logger(structlog.ReturnLogger())


async def admit(life: SlurmLifecycle, run: HostRun) -> None:
    """As the task graph does: the record the lifecycle returns is the host's."""
    run.scheduler = (await life.admit([run])).get(run.host.name)


async def release(life: SlurmLifecycle, run: HostRun, report: HostReport) -> None:
    run.scheduler = await life.release(run, report, log()) or run.scheduler


async def through(life: SlurmLifecycle, name: str, status: HostStatus | None = HostStatus.CLEAN,
                  error: str | None = None) -> HostRun:
    """Admit, wait and release one host as the task graph does: `status` None means the host never started
    (the lifecycle itself refused it)."""
    run = HostRun(host=Host(name=name, address="127.0.0.1"))
    await admit(life, run)
    ready = await life.ready(run, log())
    run.scheduler = ready.record
    if ready.outcome is not None:
        run.finish(*ready.outcome)
    elif status is not None:
        run.started = time.monotonic()
        run.finish(status, error, None if status is HostStatus.CLEAN else Reason.MEMORY_HELD)
    report = run.report()
    await release(life, run, report)
    return run


def after(run: HostRun) -> tuple[str | None, str | None, str | None]:
    assert run.scheduler is not None
    return run.scheduler.state_after, run.scheduler.reason_after, run.scheduler.error


# --- a drain whose reply was lost ---------------------------------------------------------------------


async def test_a_drain_applied_but_unanswered_goes_on_and_is_resumed() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.lose_replies = 1
    run = await through(lifecycle(slurm), "sim1")
    assert run.status is HostStatus.CLEAN
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]
    assert after(run) == ("IDLE", None, None)


async def test_a_drain_refused_once_is_sent_again_and_the_host_goes_on() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.refuse = 1
    run = await through(lifecycle(slurm), "sim1")
    assert run.status is HostStatus.CLEAN
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]


async def test_a_drain_refused_at_every_try_fails_the_host_untouched_and_says_what_slurm_shows() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.refuse = UPDATE_TRIES
    run = await through(lifecycle(slurm), "sim1")
    assert run.status is HostStatus.FAILED and run.reason is Reason.SLURM and run.started is None
    assert "cannot drain the node" in (run.error or "")
    assert slurm.updates == []
    assert after(run)[:2] == ("IDLE", None)


async def test_slurm_unreadable_at_admission_is_read_again_before_the_host_fails() -> None:
    """One slurmctld hiccup as a wave is admitted: read again, never a failed wave (nor --max-fail spent)."""
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.unreadable = UPDATE_TRIES - 1
    assert (await through(lifecycle(slurm), "sim1")).status is HostStatus.CLEAN
    slurm.unreadable = UPDATE_TRIES
    run = await through(lifecycle(slurm), "sim1")
    assert run.status is HostStatus.FAILED and "cannot read the node" in (run.error or "")


async def test_a_drain_unconfirmed_because_slurm_went_unreadable_is_given_back_at_the_release() -> None:
    """The update's reply is lost and every read back fails too: the host is not reset; its release reads the
    node again, finds this run's drain, and resumes it (never touched)."""
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.lose_replies, slurm.unreadable_after_update = 1, UPDATE_TRIES
    run = await through(lifecycle(slurm), "sim1")
    assert run.status is HostStatus.FAILED and run.started is None
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]  # never sent twice
    assert after(run) == ("IDLE", None, None)


# --- a release whose update failed ------------------------------------------------------------------------


async def released(slurm: ScriptedSlurm, *, status: HostStatus = HostStatus.CLEAN, error: str | None = None,
                   lose_replies: int = 0, refuse: int = 0) -> HostRun:
    """sim1 admitted (drained) and reset to `status`; then its release, with the faults given from there on."""
    life = lifecycle(slurm)
    run = HostRun(host=Host(name="sim1", address="127.0.0.1"))
    await admit(life, run)
    assert (await life.ready(run, log())).outcome is None
    run.started = time.monotonic()
    run.finish(status, error, None if status is HostStatus.CLEAN else Reason.MEMORY_HELD)
    slurm.lose_replies, slurm.refuse = lose_replies, refuse
    await release(life, run, run.report())
    return run


async def test_a_resume_applied_but_unanswered_is_read_back_not_retried_and_reported_as_slurm_shows() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    run = await released(slurm, lose_replies=1)
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]  # once: the read back saw it
    assert after(run) == ("IDLE", None, None)


async def test_a_resume_refused_is_tried_again_from_a_fresh_read() -> None:
    assert after(await released(ScriptedSlurm({"sim1": "IDLE"}), refuse=2)) == ("IDLE", None, None)


async def test_a_resume_refused_every_time_reports_the_drain_slurm_still_shows_and_the_error() -> None:
    state, reason, error = after(await released(ScriptedSlurm({"sim1": "IDLE"}), refuse=10))
    assert (state, reason) == ("IDLE+DRAIN", OWN)  # never what fleet meant to set
    assert error is not None and "Unable to contact slurm controller" in error


async def test_keep_drained_applied_but_unanswered_is_not_written_twice() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    run = await released(slurm, status=HostStatus.FAILED, error="GPU 0 still holds 1523 MiB", lose_replies=1)
    assert [u[1] for u in slurm.updates] == ["DRAIN", "DRAIN"]
    assert after(run) == ("IDLE+DRAIN", f"{OWN}: GPU 0 still holds 1523 MiB", None)


async def test_state_after_a_resume_waits_out_not_responding() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.not_responding_reads = 3
    run = await through(lifecycle(slurm), "sim1")
    assert after(run) == ("IDLE", None, None)


# --- a drain left by a run that is over ---------------------------------------------------------------------


@pytest.mark.parametrize(("over", "taken_over"), [((EARLIER,), True), ((), False)])
async def test_a_bare_fleet_reason_is_taken_over_only_when_its_run_is_over(over: tuple[str, ...],
                                                                           taken_over: bool) -> None:
    slurm = ScriptedSlurm({"sim1": ("IDLE+DRAIN", f"fleet: run {EARLIER}")})
    run = await through(lifecycle(slurm, over), "sim1")
    assert run.scheduler is not None
    if taken_over:
        assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]
        assert after(run) == ("IDLE", None, None)
        assert run.scheduler.taken_over == EARLIER  # the report names the run whose drain this one took over
    else:  # a run still in flight (or one fleet cannot see): its drain is left alone
        assert slurm.updates == []
        assert after(run)[:2] == ("IDLE+DRAIN", f"fleet: run {EARLIER}")
        assert run.scheduler.taken_over is None


@pytest.mark.parametrize(("before", "mode", "taken_over"), [
    (("IDLE+DRAIN", f"fleet: run {EARLIER}: gpu 0 holds 1523 MiB"), Mode.RESET, EARLIER),  # a failed run's drain
    ("IDLE", Mode.RESET, None),  # in service: drained by this run, nothing taken over
    (("IDLE+DRAIN", "bad DIMM"), Mode.RESET, None),  # an admin's: left as it is
    (("IDLE+DRAIN", f"fleet: run {EARLIER}: gpu 0 holds 1523 MiB"), Mode.PLAN, None),  # a dry run takes nothing
])
async def test_the_record_names_the_run_whose_drain_was_taken_over(before: str | tuple[str, str], mode: Mode,
                                                                   taken_over: str | None) -> None:
    slurm = ScriptedSlurm({"sim1": before})
    life = SlurmLifecycle(slurm.client(), RUN, mode, drain_wait_s=0, poll_s=0.01)
    run = HostRun(host=Host(name="sim1", address="127.0.0.1"))
    await admit(life, run)
    assert run.scheduler is not None and run.scheduler.taken_over == taken_over


# --- every row of docs/slurm.md's lifecycle table, over the scripted Slurm --------------------------------------

EARLIER_FAILED = f"fleet: run {EARLIER}: gpu 0 holds 1523 MiB"
IN_SERVICE, ADOPTED, ADMINS = "IDLE", ("IDLE+DRAIN", EARLIER_FAILED), ("IDLE+DRAIN", "bad DIMM")


@pytest.mark.parametrize(("before", "status", "expected"), [
    # in service: drained for the run; clean -> resumed, failed -> kept drained with the error, untouched -> back
    (IN_SERVICE, HostStatus.CLEAN, ("IDLE", None)),
    (IN_SERVICE, HostStatus.FAILED, ("IDLE+DRAIN", f"{OWN}: gpu 0 holds 4096 MiB")),
    (IN_SERVICE, None, ("IDLE", None)),
    # drained by an earlier fleet run that failed it: taken over; untouched -> drained again with its reason
    (ADOPTED, HostStatus.CLEAN, ("IDLE", None)),
    (ADOPTED, HostStatus.FAILED, ("IDLE+DRAIN", f"{OWN}: gpu 0 holds 4096 MiB")),
    (ADOPTED, None, ("IDLE+DRAIN", EARLIER_FAILED)),
    # drained for any other reason: never changed
    (ADMINS, HostStatus.CLEAN, ("IDLE+DRAIN", "bad DIMM")),
    (ADMINS, HostStatus.FAILED, ("IDLE+DRAIN", "bad DIMM")),
    (ADMINS, None, ("IDLE+DRAIN", "bad DIMM")),
])
async def test_each_row_of_the_lifecycle_table(before: str | tuple[str, str], status: HostStatus | None,
                                               expected: tuple[str, str | None]) -> None:
    """`None`: the host never touched (here: it never started, as a host whose jobs outlived --drain-wait)."""
    slurm = ScriptedSlurm({"sim1": before})
    run = await through(lifecycle(slurm), "sim1", status, "gpu 0 holds 4096 MiB")
    assert after(run)[:2] == expected  # the report says what Slurm shows
    assert (slurm.nodes["sim1"].state, slurm.nodes["sim1"].reason) == expected


# --- the release's bound --------------------------------------------------------------------------------


async def reset_clean(slurm: ScriptedSlurm) -> tuple[SlurmLifecycle, HostRun]:
    """sim1 admitted (drained), waited for, and ended clean; not released yet (its Slurm commands bounded at 0.2 s)."""
    life = lifecycle(slurm, timeout=0.2)
    run = HostRun(host=Host(name="sim1", address="127.0.0.1"))
    await admit(life, run)
    run.scheduler = (await life.ready(run, log())).record
    run.started = time.monotonic()
    run.finish(HostStatus.CLEAN)
    return life, run


@pytest.mark.parametrize(("command_s", "pause_s"), [(30.0, 2.0), (5.0, 0.01), (0.2, 0.5)])
def test_the_release_bound_holds_every_try_at_its_longest(command_s: float, pause_s: float) -> None:
    """Every try's read and update at their client deadline, the pauses between, and the last read after a resume:
    a release whose commands all hang to their bound still ends inside it."""
    tries = UPDATE_TRIES * RELEASE_COMMANDS * client_deadline(command_s) + (UPDATE_TRIES - 1) * pause_s
    assert release_s(command_s, pause_s) == tries + SETTLE_READ_S + client_deadline(command_s)
    assert finish_s(command_s) == 3 * client_deadline(command_s)


async def test_a_read_that_hangs_twice_is_read_a_third_time_and_the_node_resumed() -> None:
    """`scontrol show node` hangs past its bound at the release, twice: the third try reads, resumes, and the node
    is never left with the bare reason of a run in flight."""
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    life, run = await reset_clean(slurm)
    slurm.hanging = 2
    await release(life, run, run.report())
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "RESUME", None)]
    assert after(run) == ("IDLE", None, None)


async def test_a_release_past_its_bound_leaves_fleets_release_not_finished_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound spent while a read hangs: the node, still drained with the run's bare reason, gets `release not
    finished` (a reason the next run takes over), read back, and the record says so."""
    monkeypatch.setattr(lifecycles, "release_s", lambda command_s, pause_s: 0.1)  # under one hang
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    life, run = await reset_clean(slurm)
    slurm.hanging = 1
    await release(life, run, run.report())
    reason = failed_reason(RUN, "release not finished within 0.1 s")
    assert slurm.updates == [("sim1", "DRAIN", OWN), ("sim1", "DRAIN", reason)]
    state, reason_after, error = after(run)
    assert (state, reason_after) == ("IDLE+DRAIN", reason)
    assert error == f"slurm: releasing sim1: release not finished within 0.1 s; left IDLE+DRAIN ({reason}, by root)"
