"""The bounds of remote commands: derived from command_timeout, never a constant, and named when they end one."""

from __future__ import annotations

from typing import Any

import pytest
from support.scripted_run import make_host

from fleet.node import bounds
from fleet.node.bounds import Bound
from fleet.node.budget import BudgetSpent, TimeBudget
from fleet.node.probe import Probe
from fleet.node.probes import health, kernel_log, smi
from fleet.reset import leaks, lock, verdict_time


@pytest.mark.parametrize("command_timeout", [1.0, 10.0, 120.0])
def test_nvidia_smis_bound_is_a_multiple_of_command_timeout(command_timeout: float) -> None:
    host = make_host(command_timeout=command_timeout)
    assert bounds.command_bound(host) == Bound(command_timeout, "command_timeout")
    assert bounds.smi_bound(host) == Bound(3 * command_timeout, "nvidia-smi's bound: 3 x command_timeout")
    assert bounds.of(host, driver=True) == bounds.smi_bound(host)
    assert bounds.of(host, driver=False) == bounds.command_bound(host)


def test_at_the_default_command_timeout_nvidia_smi_gets_30_s() -> None:
    """30 s: an 8-GPU node without persistence mode (1-3 s a GPU; 30 s measured) answers within it."""
    assert bounds.smi_bound(make_host(command_timeout=10.0)).seconds == 30.0


def test_every_nvidia_smi_read_asks_the_driver_and_nothing_else_does() -> None:
    driver: list[Probe[Any]] = [smi.gpu_query("nvidia-smi", smi.SETTLE_FIELDS), smi.compute_apps("nvidia-smi"),
              health.facts("nvidia-smi"), health.remaps("nvidia-smi"), health.health("nvidia-smi"),
              leaks.board("nvidia-smi")]
    assert all(p.driver and p.argv[0] == "nvidia-smi" for p in driver)
    assert not kernel_log.read().driver


def test_a_budget_that_ends_sooner_names_itself() -> None:
    bound = Bound(30.0, "nvidia-smi's bound: 3 x command_timeout")
    assert bounds.within(bound, None) == bound
    assert bounds.within(bound, TimeBudget(window=0.0, slack=100.0), "settle") == bound
    clipped = bounds.within(bound, TimeBudget(window=0.0, slack=4.0), "settle")
    assert 0 < clipped.seconds <= 4.0
    assert clipped.name == "what was left of settle's 4 s budget"
    assert str(Bound(12.0, "command_timeout")) == "12 s (command_timeout)"
    with pytest.raises(BudgetSpent):
        bounds.within(bound, TimeBudget(window=0.0, slack=0.0))


def test_room_for_commands_counts_nvidia_smi_at_its_own_bound() -> None:
    host = make_host(command_timeout=10.0)
    assert bounds.commands_s(host, smi=2, other=3) == 2 * 30 + 3 * 10


def test_the_hang_lines_name_the_bound() -> None:
    assert smi.SMI_HANG.format(s="30", bound=bounds.SMI) == (
        "nvidia-smi did not answer within 30 s (nvidia-smi's bound: 3 x command_timeout): driver may be wedged; "
        "reset its GPUs (--gpu-reset) or reboot the node")
    assert kernel_log.HANG.format(s="10", bound=bounds.COMMAND) == (
        "journalctl did not answer within 10 s (command_timeout)")


def test_the_lock_outlives_a_reset_whose_every_command_takes_its_bound() -> None:
    host = make_host(services=("sglang.service",), drain_timeout=30.0, kill_grace=5.0, settle_timeout=60.0,
                     command_timeout=10.0)
    by_hand = ((2 * 10 + 2 * 30)  # the baselines: the kernel log, two nvidia-smi reads, the apps' jobs
               + (30 + 10) + (10 + 10)  # drain's wait and escalation, a poll past each
               + (5 + 5 + 8 * 10)  # kill: SIGTERM's grace, SIGKILL's wait, its commands
               + (60 + 2 * 30) + 2 * (3 * 30 + 5 * 10)  # settle's wait, a poll past it, two looks at held memory
               + (5 * 30 + 10 * 10))  # verify's nvidia-smi reads and other commands
    held = verdict_time.held_s(host)
    assert held == by_hand
    assert lock.hold_bound_s(10, held) > 10 + 2 * held
