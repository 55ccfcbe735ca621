"""Slurm's output, parsed, and what fleet decides from it: pure, no Slurm needed (the captures are real)."""

from __future__ import annotations

import pytest
from support.paths import FIXTURES, REPO

from fleet.model.report import HostStatus
from fleet.slurm import policy
from fleet.slurm.control import SLURM_COMMAND_TIMEOUT_S
from fleet.slurm.lifecycle import finish_s, release_s
from fleet.slurm.policy import Admission, Release
from fleet.slurm.records import SlurmNode, SlurmParseError, parse_jobs, parse_node_list, parse_nodes, split_reason
from fleet.slurm.srun import cleanup_s
from fleet.slurm.waiting import POLL_S

FIXTURES = FIXTURES / "slurm"
RUN = "20261203T070000Z-abc123"


def test_show_node_capture_parses_state_and_reason() -> None:
    nodes = parse_nodes((FIXTURES / "show_node.txt").read_text())
    assert list(nodes) == ["sim1", "sim2", "sim3", "sim4"]
    assert nodes["sim1"] == SlurmNode(name="sim1", state="IDLE")
    assert nodes["sim2"].state == "ALLOCATED+DRAIN" and nodes["sim2"].busy and nodes["sim2"].draining_or_drained
    assert nodes["sim3"].reason == "bad DIMM = slot 3" and nodes["sim3"].reason_by == "root"
    assert not nodes["sim3"].busy and not nodes["sim3"].in_service
    assert nodes["sim4"].in_service


def test_free_text_keys_are_not_split_into_fields() -> None:
    text = ("NodeName=n1 State=IDLE\n   OS=Linux State=DOWN x\n"
            "   Reason=State=DOWN looks odd [bob@2026-01-01T00:00:00]\n")
    node = parse_nodes(text)["n1"]
    assert node.state == "IDLE" and node.reason == "State=DOWN looks odd" and node.reason_by == "bob"


def test_a_record_without_state_is_an_error_not_an_idle_node() -> None:
    with pytest.raises(SlurmParseError):
        parse_nodes("NodeName=n1 Arch=x86_64\n")


@pytest.mark.parametrize(
    ("state", "base", "flags", "busy", "in_service"),
    [
        ("IDLE", "IDLE", set(), False, True),
        ("MIXED+DRAIN", "MIXED", {"DRAIN"}, True, False),
        ("IDLE+DRAIN+COMPLETING", "IDLE", {"DRAIN", "COMPLETING"}, True, False),
        ("DOWN*", "DOWN", {"NOT_RESPONDING"}, False, False),
        ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", {"DRAIN", "NOT_RESPONDING"}, False, False),
        ("ALLOCATED", "ALLOCATED", set(), True, True),
        ("FUTURE", "FUTURE", set(), False, False),
        ("IDLE+FAIL", "IDLE", {"FAIL"}, False, False),  # an admin's FAIL
        ("MIXED+FAIL", "MIXED", {"FAIL"}, True, False),  # FAILING: a job still runs
        ("IDLE+MAINTENANCE+RESERVED", "IDLE", {"MAINTENANCE", "RESERVED"}, False, False),
        ("IDLE+RESERVED", "IDLE", {"RESERVED"}, False, True),  # a reservation's jobs still run there
        ("IDLE+REBOOT_REQUESTED", "IDLE", {"REBOOT_REQUESTED"}, False, False),
        ("IDLE+POWERED_DOWN", "IDLE", {"POWERED_DOWN"}, False, False),
    ],
)
def test_state_strings(state: str, base: str, flags: set[str], busy: bool, in_service: bool) -> None:
    node = SlurmNode(name="n", state=state)
    assert (node.base, set(node.flags), node.busy, node.in_service) == (base, flags, busy, in_service)


def test_reason_stamp_is_split_off() -> None:
    assert split_reason("fleet: run X: memory held [root@2026-12-03T06:59:22]") == ("fleet: run X: memory held", "root")
    assert split_reason("no stamp") == ("no stamp", None)
    assert split_reason("none") == (None, None)
    assert split_reason(None) == (None, None)


def test_squeue_lines_map_jobs_to_nodes_through_hostlists() -> None:
    jobs = parse_jobs((FIXTURES / "squeue.txt").read_text(), ["sim1", "sim2", "sim3", "sim4"])
    assert jobs == {"sim1": (), "sim2": ("3",), "sim3": ("7",), "sim4": ("7",)}


def test_squeue_line_of_another_shape_is_an_error() -> None:
    with pytest.raises(SlurmParseError):
        parse_jobs("3\n", ["sim1"])


def test_partition_listing_keeps_order_and_drops_repeats() -> None:
    assert parse_node_list("sim1\nsim2\nsim1\nsim[3-4]\n") == ("sim1", "sim2", "sim3", "sim4")


# --- before: drain, adopt or leave -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (SlurmNode(name="n", state="IDLE"), Admission.DRAIN),
        (SlurmNode(name="n", state="MIXED"), Admission.DRAIN),
        (SlurmNode(name="n", state="IDLE+DRAIN", reason="bad DIMM", reason_by="root"), Admission.LEAVE),
        (SlurmNode(name="n", state="DOWN*", reason="Not responding", reason_by="slurm"), Admission.LEAVE),
        (SlurmNode(name="n", state="IDLE+DRAIN", reason="fleet: run OLD: memory_held on GPU 0"), Admission.ADOPT),
        (SlurmNode(name="n", state="IDLE+DRAIN", reason="fleet: run OTHER"), Admission.LEAVE),  # a fleet run in flight
        (SlurmNode(name="n", state="DOWN+DRAIN", reason="fleet: run OLD: x"), Admission.LEAVE),
        (SlurmNode(name="n", state="IDLE+FAIL", reason="bad DIMM", reason_by="root"), Admission.LEAVE),
        (SlurmNode(name="n", state="MIXED+FAIL", reason="bad DIMM", reason_by="root"), Admission.LEAVE),
        (SlurmNode(name="n", state="IDLE+MAINTENANCE+RESERVED"), Admission.LEAVE),
        (SlurmNode(name="n", state="IDLE+REBOOT_REQUESTED", reason="new kernel", reason_by="root"), Admission.LEAVE),
        (SlurmNode(name="n", state="IDLE+DRAIN+FAIL", reason="fleet: run OLD: x", reason_by="root"),
         Admission.LEAVE),  # an admin's FAIL on it
        (SlurmNode(name="n", state="IDLE+RESERVED"), Admission.DRAIN),
    ],
)
def test_admission(node: SlurmNode, expected: Admission) -> None:
    assert policy.admission(node) is expected


def test_a_node_out_of_service_by_someone_else_is_skipped_naming_its_state_and_reason() -> None:
    admin = SlurmNode(name="gpu-b07", state="IDLE+FAIL", reason="bad DIMM", reason_by="root")
    assert policy.skipped(admin) == (
        "slurm: gpu-b07 is IDLE+FAIL (bad DIMM, by root): out of service by someone else: not reset, its state and"
        " reason left as they are (reset it without --slurm once it is yours)")
    in_flight = SlurmNode(name="gpu-b07", state="IDLE+DRAIN", reason="fleet: run OTHER", reason_by="root")
    assert "drained by fleet run OTHER, which may still be in flight" in policy.skipped(in_flight)


# --- after: resume, restore, keep drained, leave -----------------------------------------------------

OURS = SlurmNode(name="n", state="IDLE+DRAIN", reason=policy.own_reason(RUN), reason_by="root")


def test_clean_node_is_resumed() -> None:
    action = policy.release(Admission.DRAIN, SlurmNode(name="n", state="IDLE"), OURS, RUN, HostStatus.CLEAN, None)
    assert action.what is Release.RESUME


def test_failed_node_stays_drained_with_the_error() -> None:
    action = policy.release(Admission.DRAIN, SlurmNode(name="n", state="IDLE"), OURS, RUN, HostStatus.FAILED,
                            "GPU 0 still holds 1523 MiB\nafter 60 s")
    assert action.what is Release.KEEP_DRAINED
    assert action.reason == f"fleet: run {RUN}: GPU 0 still holds 1523 MiB after 60 s"


@pytest.mark.parametrize("status", [HostStatus.SKIPPED, HostStatus.UNREACHABLE])
def test_untouched_node_goes_back_as_it_was(status: HostStatus) -> None:
    assert policy.release(Admission.DRAIN, SlurmNode(name="n", state="MIXED"), OURS, RUN, status,
                          "x").what is Release.RESUME
    earlier = SlurmNode(name="n", state="IDLE+DRAIN", reason="fleet: run OLD: memory held")
    action = policy.release(Admission.ADOPT, earlier, OURS, RUN, status, "x")
    assert action.what is Release.RESTORE and action.reason == "fleet: run OLD: memory held"


def test_someone_elses_node_is_never_resumed_nor_rewritten() -> None:
    admin = SlurmNode(name="n", state="IDLE+DRAIN", reason="bad DIMM", reason_by="root")
    for status in HostStatus:
        assert policy.release(Admission.LEAVE, admin, admin, RUN, status, "x").what is Release.LEAVE


def test_a_reason_changed_during_the_run_is_left_alone() -> None:
    idle = SlurmNode(name="n", state="IDLE")
    changed = SlurmNode(name="n", state="IDLE+DRAIN", reason="admin: keep out", reason_by="root")
    for status in (HostStatus.CLEAN, HostStatus.FAILED):
        assert policy.release(Admission.DRAIN, idle, changed, RUN, status, "x").what is Release.LEAVE
    assert policy.release(Admission.DRAIN, idle, None, RUN, HostStatus.CLEAN, None).what is Release.LEAVE


@pytest.mark.parametrize("now",
                         [SlurmNode(name="n", state="IDLE"), SlurmNode(name="n", state="UNKNOWN"),
                          SlurmNode(name="n", state="DOWN*")])
def test_a_failed_node_whose_drain_is_gone_is_drained_again(now: SlurmNode) -> None:
    """slurmctld restarted without the drain (UNKNOWN, no reason), or someone resumed the node: a node fleet failed
    goes out of service again with fleet's reason; one fleet proved clean, or never touched, is left as it is."""
    idle = SlurmNode(name="n", state="IDLE")
    action = policy.release(Admission.DRAIN, idle, now, RUN, HostStatus.FAILED, "memory leaked")
    assert action.what is Release.KEEP_DRAINED and action.reason == f"fleet: run {RUN}: memory leaked"
    assert policy.release(Admission.DRAIN, idle, now, RUN, HostStatus.CLEAN, None).what is Release.LEAVE
    assert policy.release(Admission.DRAIN, idle, now, RUN, HostStatus.SKIPPED, "x").what is Release.LEAVE


def test_a_reason_someone_else_set_is_kept_and_fleets_follows_it() -> None:
    """An admin's DOWN `bad DIMM` on a node fleet failed: drained, `bad DIMM` first (theirs to resume)."""
    down = SlurmNode(name="n", state="DOWN+MAINTENANCE+RESERVED", reason="bad DIMM", reason_by="root")
    action = policy.after_step(down, RUN, HostStatus.FAILED, "no report", touched=True)
    assert action.what is Release.KEEP_DRAINED and action.reason == f"bad DIMM; fleet: run {RUN}: no report"
    assert policy.fleet_run_of(action.reason) is None
    assert policy.admission(SlurmNode(name="n", state="DOWN+DRAIN", reason=action.reason)) is Admission.LEAVE
    long = policy.drain_reason(SlurmNode(name="n", state="DOWN", reason="x" * 300), RUN, "y")
    assert len(long) == policy.REASON_LIMIT and long.startswith("x" * 100)
    ours = SlurmNode(name="n", state="DOWN", reason=f"fleet: run {RUN}: earlier")
    assert policy.drain_reason(ours, RUN, "now") == f"fleet: run {RUN}: now"


def test_failed_reason_is_one_bounded_line() -> None:
    reason = policy.failed_reason(RUN, "x" * 1000)
    assert len(reason) == policy.REASON_LIMIT and reason.endswith("...") and "\n" not in reason
    assert policy.fleet_run_of(reason) == (RUN, reason.split(": ", 2)[2])


def test_plan_lines_say_what_would_happen() -> None:
    assert "would drain, wait up to 600 s for jobs 3, 4, reset" in policy.plan_line(SlurmNode(name="n", state="MIXED"),
                                                                                   ("3", "4"), 600)
    leave = policy.plan_line(SlurmNode(name="n", state="IDLE+DRAIN", reason="bad DIMM", reason_by="root"), (), 600)
    assert leave == ("slurm IDLE+DRAIN (bad DIMM, by root): out of service by someone else: would skip it, its state"
                     " and reason left as they are")
    assert "IDLE+FAIL (bad DIMM, by root)" in policy.plan_line(SlurmNode(name="n", state="IDLE+FAIL", reason="bad DIMM",
                                                                         reason_by="root"), (), 1)


def test_the_bounds_docs_slurm_states_are_the_codes() -> None:
    """docs/slurm.md's figures for the release's and the cleanup's bounds, at the defaults, are what the functions
    give."""
    text = (REPO / "docs" / "slurm.md").read_text()
    release, finish = release_s(SLURM_COMMAND_TIMEOUT_S, POLL_S), finish_s(SLURM_COMMAND_TIMEOUT_S)
    assert "released. Only past that bound" in text and f"{release:g} s at the defaults" in text
    assert f"release not finished within {release:g} s" in text and f"{finish:g} s at most" in text
    assert f"(up to {release + finish:g} s); again to abandon them drained" in text
    assert f"{cleanup_s(SLURM_COMMAND_TIMEOUT_S, POLL_S):g} s at the defaults, each Slurm command at its bound" in text
