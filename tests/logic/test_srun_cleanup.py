"""`--via srun`'s admission and cleanup at their edges, over a scripted Slurm (`scripted_slurm`): lost replies,
refusals, unreadable reads. A failed node ends drained with fleet's reason, seen by a read back, before the
reservation is removed; the reservation stays, naming the nodes, only when a drain was never seen after the tries;
a create whose reply was lost is found by its name. The same rules against the real slurmctld: test_slurm_faults.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from support.scripted_slurm import ScriptedSlurm

from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.walk import HostRun
from fleet.inventory.host import Host
from fleet.model.report import HostStatus, Reason, SchedulerRecord
from fleet.runlog.folder import RunLogs
from fleet.slurm.cleanup import Drained, Ended, drain_failed
from fleet.slurm.control import SlurmError
from fleet.slurm.reservation import Reservation
from fleet.slurm.srun import SrunRun
from fleet.slurm.tries import UPDATE_TRIES, retry

RUN = "20261203T070000Z-abc123"
NAME = f"fleet-{RUN}"
ERROR = "gpu 0 holds 4096 MiB"
FAILED = f"fleet: run {RUN}: {ERROR}"
PAUSE_S = 0.01


def logs_for(*names: str) -> dict[str, Any]:
    return {name: structlog.wrap_logger(structlog.ReturnLogger()) for name in names}


async def drained(slurm: ScriptedSlurm, *ended: Ended) -> Drained:
    return await drain_failed(slurm.client(), RUN, ended, logs_for(*(e.name for e in ended)), PAUSE_S)


def failed(name: str = "sim1") -> Ended:
    return Ended(name=name, status=HostStatus.FAILED, error=ERROR, touched=True)


# --- the tries themselves -------------------------------------------------------------------------------------


async def test_tries_stop_at_the_first_success_and_raise_the_last_error_after_the_bound() -> None:
    told: list[int] = []

    async def flaky(number: int) -> int:
        if number < 3:
            raise SlurmError(f"try {number}")
        return number

    assert await retry(flaky, pause_s=0, failed=lambda n, e: told.append(n)) == 3 and told == [1, 2]
    with pytest.raises(SlurmError, match="try 2"):
        await retry(flaky, pause_s=0, tries=2)


# --- drains: whatever the base state, read back, tried again ---------------------------------------------------


@pytest.mark.parametrize("state", ["DOWN*+MAINT+RESERVED", "DOWN+MAINT+RESERVED", "IDLE*+MAINT+RESERVED",
                                   "IDLE+FAIL"])
async def test_a_failed_node_down_not_responding_or_failing_is_drained_with_fleets_reason(state: str) -> None:
    slurm = ScriptedSlurm({"sim1": state})
    result = await drained(slurm, failed())
    assert result.unconfirmed == [] and result.error is None
    assert slurm.updates == [("sim1", "DRAIN", FAILED)]
    assert slurm.nodes["sim1"].state.endswith("+DRAIN") and slurm.nodes["sim1"].reason == FAILED


async def test_a_drain_whose_reply_was_lost_is_seen_and_not_sent_twice() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE+MAINT+RESERVED"})
    slurm.lose_replies = 1
    assert (await drained(slurm, failed())).unconfirmed == []
    assert slurm.updates == [("sim1", "DRAIN", FAILED)]


@pytest.mark.parametrize("fault", ["refuse", "unreadable", "unreadable_after_update"])
async def test_a_transient_fault_is_tried_again_from_a_fresh_read(fault: str) -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE+MAINT+RESERVED"})
    setattr(slurm, fault, UPDATE_TRIES - 1)
    assert (await drained(slurm, failed())).unconfirmed == []
    assert slurm.updates == [("sim1", "DRAIN", FAILED)]


@pytest.mark.parametrize(("fault", "sent"), [("refuse", 0), ("unreadable", 0), ("unreadable_after_update", 1)])
async def test_a_drain_never_seen_after_the_tries_is_unconfirmed_with_the_last_error(fault: str, sent: int) -> None:
    """Refused every time, Slurm unreadable every time, or the drain sent and never read back."""
    slurm = ScriptedSlurm({"sim1": "DOWN+MAINT+RESERVED", "sim2": "IDLE+MAINT+RESERVED"})
    setattr(slurm, fault, 10)
    result = await drained(slurm, failed("sim1"), Ended(name="sim2", status=HostStatus.CLEAN, error=None, touched=True))
    assert result.unconfirmed == ["sim1"] and result.error is not None
    assert len(slurm.updates) == sent


async def test_a_node_drained_by_someone_else_keeps_their_reason_and_a_clean_one_is_not_even_read() -> None:
    slurm = ScriptedSlurm({"sim1": ("IDLE+DRAIN+MAINT+RESERVED", "bad DIMM"), "sim2": "IDLE+MAINT+RESERVED"})
    result = await drained(slurm, failed("sim1"), Ended(name="sim2", status=HostStatus.CLEAN, error=None, touched=True),
                           Ended(name="sim3", status=HostStatus.FAILED, error="no report", touched=False))
    assert result.unconfirmed == [] and slurm.updates == [] and slurm.nodes["sim1"].reason == "bad DIMM"
    assert set(result.seen or {}) == {"sim1"}


# --- the reservation: found after a lost reply, removed after one ----------------------------------------------


def reservation(slurm: ScriptedSlurm) -> Reservation:
    return Reservation(slurm.client(), NAME, PAUSE_S)


@pytest.mark.parametrize("fault", ["lose_replies", "refuse", "unreadable"])
async def test_a_create_whose_reply_was_lost_or_refused_once_ends_with_one_reservation_used(fault: str) -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.lose_replies = 1
    setattr(slurm, fault, getattr(slurm, fault) + 1)  # unreadable: the look by name after the lost reply fails
    rsv = reservation(slurm)
    await rsv.create(["sim1"], 17)
    assert slurm.created == [NAME] and slurm.reservations == {NAME} and rsv.held


async def test_a_create_that_never_took_fails_and_what_it_may_have_left_is_still_removed() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    slurm.refuse = UPDATE_TRIES
    rsv = reservation(slurm)
    with pytest.raises(SlurmError, match="Unable to contact"):
        await rsv.create(["sim1"], 17)
    assert rsv.held and slurm.created == []  # Slurm may have it, as far as fleet can tell
    assert await rsv.remove() is None and not rsv.held  # `Requested reservation is invalid`, read back: none


async def test_a_removal_whose_reply_was_lost_is_read_back_as_done() -> None:
    slurm = ScriptedSlurm({"sim1": "IDLE"})
    rsv = reservation(slurm)
    await rsv.create(["sim1"], 17)
    slurm.lose_replies = 1
    assert await rsv.remove() is None and not rsv.held and slurm.deleted == [NAME]


# --- the whole cleanup, as the run body calls it ---------------------------------------------------------------


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[RunLogs]:
    run_logs = RunLogs(tmp_path, RUN)
    run_logs.create()
    yield run_logs
    run_logs.close()


async def stepped(slurm: ScriptedSlurm, logs: RunLogs, outcomes: dict[str, HostStatus]) -> SrunRun:
    """A run whose step took `outcomes`' nodes (none sent a report: each may have been touched), in its
    reservation."""
    runs = [HostRun(host=Host(name=n, address="127.0.0.1"),
                    scheduler=SchedulerRecord(node=n, by="slurm", state_before="IDLE")) for n in outcomes]
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", fan_out=True))
    srun = SrunRun(slurm.client(), runs, options, logs, poll_s=PAUSE_S)
    await srun.maintenance.create(list(outcomes), 17)
    srun.stepped = list(outcomes)
    for run, status in zip(runs, outcomes.values(), strict=True):
        run.finish(status, None if status is HostStatus.CLEAN else ERROR, None if status is HostStatus.CLEAN
                   else Reason.MEMORY_HELD)
    return srun


def error_of(srun: SrunRun, name: str) -> str:
    record = srun.runs[name].scheduler
    return (record.error if record else None) or ""


async def test_a_failed_node_slurm_shows_down_is_drained_before_the_reservation_goes(logs: RunLogs) -> None:
    slurm = ScriptedSlurm({"sim1": "DOWN*+MAINT+RESERVED", "sim2": "IDLE+MAINT+RESERVED"})
    srun = await stepped(slurm, logs, {"sim1": HostStatus.FAILED, "sim2": HostStatus.CLEAN})
    slurm.lose_replies = 1  # the drain's reply
    await srun._cleanup()
    await srun._read_after()
    assert slurm.writes == [f"create {NAME}", "update sim1 DRAIN", f"delete {NAME}"]
    record = srun.runs["sim1"].scheduler
    assert record is not None and record.reason_after == FAILED and (record.state_after or "").endswith("+DRAIN")
    assert error_of(srun, "sim1") == error_of(srun, "sim2") == ""


async def test_a_drain_never_seen_keeps_the_reservation_and_names_the_node_on_every_node(logs: RunLogs) -> None:
    slurm = ScriptedSlurm({"sim1": "DOWN+MAINT+RESERVED", "sim2": "IDLE+MAINT+RESERVED"})
    srun = await stepped(slurm, logs, {"sim1": HostStatus.FAILED, "sim2": HostStatus.CLEAN})
    slurm.refuse = UPDATE_TRIES
    await srun._cleanup()
    assert slurm.deleted == [] and srun.maintenance.held
    for name in ("sim1", "sim2"):
        error = error_of(srun, name)
        assert f"reservation {NAME} kept until its Duration ends: sim1 not seen drained (" in error, error
        assert "Unable to contact slurm controller" in error
        assert error.endswith(f"; once drained: scontrol delete ReservationName={NAME}")


async def test_admission_reads_again_and_uses_a_reservation_whose_create_reply_was_lost(logs: RunLogs) -> None:
    """One slurmctld hiccup at the read, a lost reply at the create: every node still takes part."""
    slurm = ScriptedSlurm({"sim1": "IDLE", "sim2": "IDLE"})
    runs = [HostRun(host=Host(name=n, address="127.0.0.1")) for n in ("sim1", "sim2")]
    options = RunOptions(scheduler=SchedulerOptions(name="slurm", drain_wait_s=0.0, fan_out=True))
    srun = SrunRun(slurm.client(), runs, options, logs, poll_s=PAUSE_S)
    slurm.unreadable, slurm.lose_replies = UPDATE_TRIES - 1, 1
    with anyio.fail_after(10):
        ready = await srun._reserve_and_wait(await srun._read())
    assert ready == ["sim1", "sim2"] and slurm.created == [NAME] and srun.maintenance.held
    assert all(run.status is None for run in runs)


async def test_a_reservation_slurm_still_shows_after_every_removal_is_named_on_every_node(
    logs: RunLogs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleet.slurm.reservation.DELETE_RETRY_S", 0.0)
    slurm = ScriptedSlurm({"sim1": "IDLE+MAINT+RESERVED"})
    srun = await stepped(slurm, logs, {"sim1": HostStatus.CLEAN})
    slurm.refuse = 1000
    await srun._cleanup()
    assert slurm.reservations == {NAME} and srun.maintenance.held
    assert error_of(srun, "sim1").startswith(f"slurm: reservation {NAME} kept until its Duration ends: not removed: ")
    assert error_of(srun, "sim1").endswith(f"; to remove it: scontrol delete ReservationName={NAME}")


async def test_the_steps_job_is_cancelled_by_its_id_and_seen_gone_before_the_drains(logs: RunLogs) -> None:
    """srun is gone (SIGKILLed before any frame) but its job lives on: cancelled by its id, once, and read back until
    Slurm shows none; then the nodes, none of which sent a report, are drained before the reservation goes."""
    slurm = ScriptedSlurm({"sim1": "IDLE+MAINT+RESERVED", "sim2": "IDLE+MAINT+RESERVED"})
    slurm.named[NAME] = ["4711"]
    srun = await stepped(slurm, logs, {"sim1": HostStatus.FAILED, "sim2": HostStatus.FAILED})
    await srun._cleanup()
    assert slurm.cancelled == ["4711"] and slurm.named[NAME] == []
    assert slurm.writes == [f"create {NAME}", "update sim[1-2] DRAIN", f"delete {NAME}"]
