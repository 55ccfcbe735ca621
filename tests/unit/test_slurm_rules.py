"""Slurm's output, parsed, and what fleet decides from it: pure, no Slurm needed (the captures are real)."""

from __future__ import annotations

import pytest
from support.paths import FIXTURES

from fleet.model.report import HostStatus
from fleet.slurm import policy
from fleet.slurm.policy import Admission, Release
from fleet.slurm.records import SlurmNode, SlurmParseError, parse_jobs, parse_node_list, parse_nodes, split_reason

FIXTURES = FIXTURES / "slurm"
RUN = "20261203T070000Z-abc123"


def test_show_node_capture_parses_state_and_reason() -> None:
    nodes = parse_nodes((FIXTURES / "show_node.txt").read_text())
    assert list(nodes) == ["sim1", "sim2", "sim3", "sim4"]
    assert nodes["sim1"] == SlurmNode("sim1", "IDLE")
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
    ],
)
def test_state_strings(state: str, base: str, flags: set[str], busy: bool, in_service: bool) -> None:
    node = SlurmNode("n", state)
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
        (SlurmNode("n", "IDLE"), Admission.DRAIN),
        (SlurmNode("n", "MIXED"), Admission.DRAIN),
        (SlurmNode("n", "IDLE+DRAIN", "bad DIMM", "root"), Admission.LEAVE),
        (SlurmNode("n", "DOWN*", "Not responding", "slurm"), Admission.LEAVE),
        (SlurmNode("n", "IDLE+DRAIN", "fleet: run OLD: memory_held on GPU 0"), Admission.ADOPT),
        (SlurmNode("n", "IDLE+DRAIN", "fleet: run OTHER"), Admission.LEAVE),  # a fleet run in flight
        (SlurmNode("n", "DOWN+DRAIN", "fleet: run OLD: x"), Admission.LEAVE),
    ],
)
def test_admission(node: SlurmNode, expected: Admission) -> None:
    assert policy.admission(node) is expected


# --- after: resume, restore, keep drained, leave -----------------------------------------------------

OURS = SlurmNode("n", "IDLE+DRAIN", policy.own_reason(RUN), "root")


def test_clean_node_is_resumed() -> None:
    action = policy.release(Admission.DRAIN, SlurmNode("n", "IDLE"), OURS, RUN, HostStatus.CLEAN, None)
    assert action.what is Release.RESUME


def test_failed_node_stays_drained_with_the_error() -> None:
    action = policy.release(Admission.DRAIN, SlurmNode("n", "IDLE"), OURS, RUN, HostStatus.FAILED,
                            "GPU 0 still holds 1523 MiB\nafter 60 s")
    assert action.what is Release.KEEP_DRAINED
    assert action.reason == f"fleet: run {RUN}: GPU 0 still holds 1523 MiB after 60 s"


@pytest.mark.parametrize("status", [HostStatus.SKIPPED, HostStatus.UNREACHABLE])
def test_untouched_node_goes_back_as_it_was(status: HostStatus) -> None:
    assert policy.release(Admission.DRAIN, SlurmNode("n", "MIXED"), OURS, RUN, status, "x").what is Release.RESUME
    earlier = SlurmNode("n", "IDLE+DRAIN", "fleet: run OLD: memory held")
    action = policy.release(Admission.ADOPT, earlier, OURS, RUN, status, "x")
    assert action.what is Release.RESTORE and action.reason == "fleet: run OLD: memory held"


def test_someone_elses_node_is_never_resumed_nor_rewritten() -> None:
    admin = SlurmNode("n", "IDLE+DRAIN", "bad DIMM", "root")
    for status in HostStatus:
        assert policy.release(Admission.LEAVE, admin, admin, RUN, status, "x").what is Release.LEAVE


def test_a_reason_changed_during_the_run_is_left_alone() -> None:
    idle = SlurmNode("n", "IDLE")
    changed = SlurmNode("n", "IDLE+DRAIN", "admin: keep out", "root")
    assert policy.release(Admission.DRAIN, idle, changed, RUN, HostStatus.CLEAN, None).what is Release.LEAVE
    resumed = SlurmNode("n", "IDLE")
    assert policy.release(Admission.DRAIN, idle, resumed, RUN, HostStatus.FAILED, "x").what is Release.LEAVE
    assert policy.release(Admission.DRAIN, idle, None, RUN, HostStatus.CLEAN, None).what is Release.LEAVE


def test_failed_reason_is_one_bounded_line() -> None:
    reason = policy.failed_reason(RUN, "x" * 1000)
    assert len(reason) == policy.REASON_LIMIT and reason.endswith("...") and "\n" not in reason
    assert policy.fleet_run_of(reason) == (RUN, reason.split(": ", 2)[2])


def test_plan_lines_say_what_would_happen() -> None:
    assert "would drain, wait up to 600 s for jobs 3, 4, reset" in policy.plan_line(SlurmNode("n", "MIXED"),
                                                                                   ("3", "4"), 600)
    leave = policy.plan_line(SlurmNode("n", "IDLE+DRAIN", "bad DIMM", "root"), (), 600)
    assert "bad DIMM" in leave and "never resume" in leave
