"""Every way a host fails has its stable reason code: the decisions that set them (pure), the table in
docs/report-and-history.md, and the paths the other suites do not reach."""

from __future__ import annotations

import re

import pytest
from support.paths import REPO

from fleet.engine.walk import host_outcome
from fleet.model.report import Finding, Level, Reason, StepName, StepResult, StepStatus
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset.kill import kill_verdict
from fleet.reset.protection import Holder
from fleet.reset.settle import Allowance
from fleet.reset.verify import verify_verdict

README = REPO / "docs" / "report-and-history.md"  # its reasons table
KILLED = [Holder(pid=4000, user="root", name="python3", exe=b"/usr/bin/python3.11", devices=(), unit="sglang.service",
                 start=9000)]


def test_every_reason_is_in_the_readmes_table_and_nothing_else_is() -> None:
    documented = set(re.findall(r"^\| `([a-z_]+)` \| .* \| (?:failed|skipped|unreachable)", README.read_text(),
                                re.MULTILINE))
    assert documented == {r.value for r in Reason}


@pytest.mark.parametrize(
    ("after_kill", "back", "denied", "reason"),
    [
        (frozenset({4000}), [], frozenset({4000}), Reason.KILL_FAILED),  # refused
        (frozenset({4000}), [], frozenset(), Reason.KILL_FAILED),  # survived SIGKILL
        (frozenset(),
         [Holder(pid=4100, user="root", name="python3", exe=None, devices=("/dev/nvidia0",), unit="sglang.service")],
         frozenset(), Reason.RESPAWNED),
        (frozenset(),
         [Holder(pid=4200, user="bob", name="perl", exe=b"/usr/bin/perl", devices=("/dev/nvidia0",), unit="x.service")],
         frozenset(), Reason.HOLDERS_LEFT),  # someone else's new process
    ],
)
def test_kill_verdicts_carry_their_reason(after_kill: frozenset[int], back: list[Holder], denied: frozenset[int],
                                          reason: Reason) -> None:
    verdict = kill_verdict(after_kill, KILLED, back, denied=denied)
    assert verdict is not None and verdict[0] is reason


ROWS = (GpuRow(index=0, memory_used_mib=0, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=0, uuid="GPU-b"))


@pytest.mark.parametrize(
    ("rows", "apps", "holders", "findings", "reason"),
    [
        ((GpuRow(index=0, memory_used_mib=1523, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=0, uuid="GPU-b")), (),
         (), None, Reason.MEMORY_HELD),
        (ROWS, (ComputeApp(gpu_uuid="GPU-a", pid=7, process_name="/usr/bin/python3", used_mib=0),), (), None,
         Reason.HOLDERS_LEFT),
        (ROWS, (), (Holder(pid=8, user="root", name="python3", exe=None, devices=("/dev/nvidia0",)),), None,
         Reason.HOLDERS_LEFT),
        (ROWS[:1], (), (), None, Reason.GPU_MISSING),
        ((), (), (), None, Reason.GPU_MISSING),
        (ROWS, (), (), {"": (Finding("xid", Level.FAIL, "Xid 79"),)}, Reason.HEALTH),
    ],
)
def test_verify_verdicts_carry_their_reason(rows: tuple[GpuRow, ...], apps: tuple[ComputeApp, ...],
                                            holders: tuple[Holder, ...],
                                            findings: dict[str, tuple[Finding, ...]] | None, reason: Reason) -> None:
    verdict = verify_verdict(rows, apps, 2 if rows else None, Allowance(16), holders, findings)
    assert verdict is not None and verdict[0] is reason


def test_a_warning_is_no_reason_to_fail() -> None:
    assert verify_verdict(ROWS, (), 2, Allowance(16), (), {"": (Finding("ecc", Level.WARN, "x"),)}) is None


def test_the_host_takes_verifys_reason_a_reboots_or_the_first_failures() -> None:
    drain = StepResult(name=StepName.DRAIN, status=StepStatus.FAILED, duration_s=1.0, detail="x",
                       error="systemctl stop refused", reason=Reason.DRAIN_FAILED)
    verify = StepResult(name=StepName.VERIFY, status=StepStatus.FAILED, duration_s=1.0, detail="y",
                        error="gpu 0 holds 9 MiB", reason=Reason.MEMORY_HELD)
    reboot = StepResult(name=StepName.SETTLE, status=StepStatus.FAILED, duration_s=1.0, detail="z",
                        error="needs_reboot: gpu 0", reason=Reason.NEEDS_REBOOT)
    assert host_outcome([drain, verify])[2] is Reason.MEMORY_HELD
    assert host_outcome([drain])[1:] == ("drain: systemctl stop refused", Reason.DRAIN_FAILED)
    assert host_outcome([drain, reboot, verify])[2] is Reason.NEEDS_REBOOT
    timeout = StepResult(name=StepName.SETTLE, status=StepStatus.TIMEOUT, duration_s=1.0, detail="w",
                         error="nvidia-smi did not answer")
    assert host_outcome([timeout])[2] is Reason.COMMAND_TIMEOUT
    unexplained = StepResult(name=StepName.SETTLE, status=StepStatus.FAILED, duration_s=1.0, detail="v",
                             error="nvidia-smi exited 9")
    assert host_outcome([unexplained])[2] is Reason.PROBE_FAILED
    assert host_outcome([StepResult(name=StepName.VERIFY, status=StepStatus.OK)]) == (
        host_outcome([])[0], None, None)


@pytest.mark.parametrize("reason", [Reason.MEMORY_LEAKED, Reason.MEMORY_HELD_BY_JOB])
def test_settle_saying_whose_the_memory_is_beats_verifys_memory_held_but_not_a_health_failure(reason: Reason) -> None:
    """A leaked context or a job's memory is the host's error (a refused --gpu-reset's holders with it), not
    verify's plainer `gpu 3 holds 4096 MiB` of that same memory; verify finding something else still wins."""
    settled = StepResult(name=StepName.SETTLE, status=StepStatus.TIMEOUT, duration_s=60.0, detail="x",
                         error="gpu 3 holds 4096 MiB with ...", reason=reason)
    held = StepResult(name=StepName.VERIFY, status=StepStatus.FAILED, duration_s=1.0, detail="y",
                      error="gpu 3 holds 4096 MiB", reason=Reason.MEMORY_HELD)
    sick = StepResult(name=StepName.VERIFY, status=StepStatus.FAILED, duration_s=1.0, detail="y", error="gpu 5: Xid 79",
                      reason=Reason.HEALTH)
    assert host_outcome([settled, held])[1:] == ("settle: gpu 3 holds 4096 MiB with ...", reason)
    assert host_outcome([settled, sick])[1:] == ("gpu 5: Xid 79", Reason.HEALTH)
    assert host_outcome([settled])[2] is reason
