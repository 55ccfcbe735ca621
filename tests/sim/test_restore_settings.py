"""`--restore-settings` end to end over in-process simulated nodes: a restore that takes, one the
driver refuses, one that needs a GPU reset, and the dry run's list; the simulated nvidia-smi answers each command as
the real one does (tests/fixtures/nvidia-smi/settings_*.txt) and every later query reads what it set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.sim_fleet import busy, fast_vars, last_log, make_fleet, reset, step

from fleet.model.report import HostReport, HostStatus, Level, Reason, StepName

__all__ = ["make_fleet"]  # the fixture, used by name


def settings_findings(host: HostReport) -> dict[int, list[tuple[Level, str]]]:
    return {g.index: [(f.level, f.detail) for f in g.health if f.check == "gpu_settings"] for g in host.gpus
            if any(f.check == "gpu_settings" for f in g.health)}


def restores(tmp_path: Path, host: str) -> list[tuple[int, str, int | None]]:
    return [(e["gpu"], e["command"], e.get("exit_status")) for e in last_log(tmp_path, host)
            if e.get("event") == "settings_restore"]


async def test_a_restore_that_takes(make_fleet: Any, tmp_path: Path) -> None:
    """A locked clock on gpu 2 and a lowered power limit on gpu 5: found (warn) by a plain reset, restored by
    --restore-settings (each command its own event, run after the kill), and verify's read shows them gone."""
    spec = busy("gpu-r01", locked_clock_gpus=(2,), power_limits=((5, 450.0),))
    sim = await make_fleet([spec], fast_vars(["gpu-r01"]))
    plain = (await reset(sim, tmp_path)).hosts["gpu-r01"]
    assert plain.status is HostStatus.CLEAN, plain.error
    assert settings_findings(plain) == {
        2: [(Level.WARN, "locked or application clocks in force (clock event reason Applications Clocks Setting)")],
        5: [(Level.WARN, "power limit 450 W, default 700 W")]}
    assert restores(tmp_path, "gpu-r01") == []
    restored = (await reset(sim, tmp_path, restore_settings=True)).hosts["gpu-r01"]
    assert restored.status is HostStatus.CLEAN, restored.error
    assert settings_findings(restored) == {}
    assert restores(tmp_path, "gpu-r01") == [(2, "nvidia-smi -i 2 -rgc", 0), (2, "nvidia-smi -i 2 -rmc", 0),
                                             (2, "nvidia-smi -i 2 -rac", 0), (5, "nvidia-smi -i 5 -pl 700", 0)]
    assert "settings: 4 nvidia-smi changes took" in step(restored, StepName.SETTLE).detail
    events = [e.get("event") for e in last_log(tmp_path, "gpu-r01")]
    assert events.index("settings_restore") > max(i for i, e in enumerate(events) if e == "step_end" and
                                                   last_log(tmp_path, "gpu-r01")[i]["step"] == "kill")
    again = (await reset(sim, tmp_path, restore_settings=True)).hosts["gpu-r01"]
    assert again.status is HostStatus.CLEAN and restores(tmp_path, "gpu-r01") == []  # nothing left to change


async def test_a_restore_the_driver_refuses_is_a_finding_naming_the_gpu(make_fleet: Any, tmp_path: Path) -> None:
    """`-pl` refused (Insufficient Permissions, exit 4): the still-lowered limit and the refusal, on gpu 5; with
    `health_fail: [gpu_settings]` the host fails with reason gpu_settings."""
    spec = busy("gpu-r02", power_limits=((5, 450.0),), power_limit_refused=True)
    sim = await make_fleet([spec], fast_vars(["gpu-r02"], health_fail=["gpu_settings"]))
    host = (await reset(sim, tmp_path, restore_settings=True)).hosts["gpu-r02"]
    assert host.status is HostStatus.FAILED and host.reason is Reason.GPU_SETTINGS
    assert host.error == "gpu 5: power limit 450 W, default 700 W (+1 more)"
    refusal = ("nvidia-smi -i 5 -pl 700 exited 4: Failed to set power management limit for GPU 00000000:BB:00.0: "
               "Insufficient Permissions (restoring power limit 450 W, default 700 W)")
    assert settings_findings(host) == {5: [(Level.FAIL, "power limit 450 W, default 700 W"), (Level.FAIL, refusal)]}
    assert restores(tmp_path, "gpu-r02") == [(5, "nvidia-smi -i 5 -pl 700", 4)]


async def test_a_restore_the_driver_refuses_fails_the_host_whatever_its_policy(make_fleet: Any, tmp_path: Path) -> None:
    """The default policy only warns of a lowered power limit, and this host ignores gpu_settings altogether: a
    restore that was asked for and did not take still fails it (a gate before a benchmark never passes a GPU left
    at 450 W)."""
    spec = busy("gpu-r04", power_limits=((5, 450.0),), power_limit_refused=True)
    sim = await make_fleet([spec], fast_vars(["gpu-r04"], health_ignore=["gpu_settings"]))
    host = (await reset(sim, tmp_path, restore_settings=True)).hosts["gpu-r04"]
    assert host.status is HostStatus.FAILED and host.reason is Reason.GPU_SETTINGS, host.error
    assert host.error == ("gpu 5: nvidia-smi -i 5 -pl 700 exited 4: Failed to set power management limit for GPU "
                          "00000000:BB:00.0: Insufficient Permissions (restoring power limit 450 W, default 700 W)")


async def test_mig_needs_a_gpu_reset_said_without_one_done_with_it(make_fleet: Any, tmp_path: Path) -> None:
    """MIG on gpu 1 (the profile: off) is held back, said, without --gpu-reset; with it, `-mig 0` then `-r -i 1`,
    and verify reads MIG off (and the GPU's idle MIG reservation gone)."""
    spec = busy("gpu-r03", mig_gpus=(1,), protected_daemon=False)  # no persistence daemon holding the GPUs open
    sim = await make_fleet([spec], fast_vars(["gpu-r03"]))
    held = (await reset(sim, tmp_path, restore_settings=True)).hosts["gpu-r03"]
    assert held.status is HostStatus.CLEAN, held.error
    assert "held back: gpu 1: MIG mode on, profile off: takes a GPU reset (--gpu-reset)" in \
        step(held, StepName.SETTLE).detail
    assert settings_findings(held) == {1: [(Level.WARN, "MIG mode on, profile off")]}
    assert all(command.endswith("-pm 1") for _, command, _ in restores(tmp_path, "gpu-r03"))
    done = (await reset(sim, tmp_path, restore_settings=True, gpu_reset=True)).hosts["gpu-r03"]
    assert done.status is HostStatus.CLEAN, done.error
    assert restores(tmp_path, "gpu-r03") == [(1, "nvidia-smi -i 1 -mig 0", 0), (1, "nvidia-smi -i 1 -r", 0)]
    assert settings_findings(done) == {} and done.gpus[1].memory_used_mib == 0


async def test_a_dry_run_lists_what_it_would_change_and_changes_nothing(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-r04", power_limits=((5, 450.0),))], fast_vars(["gpu-r04"]))
    planned = (await reset(sim, tmp_path, command="plan", restore_settings=True)).hosts["gpu-r04"]
    assert planned.status is HostStatus.PLANNED and planned.plan is not None
    assert planned.plan.would_restore == ("gpu 5: nvidia-smi -i 5 -pl 700 (power limit 450 W, default 700 W)",)
    assert "--restore-settings would run gpu 5: nvidia-smi -i 5 -pl 700" in step(planned, StepName.SETTLE).detail
    assert restores(tmp_path, "gpu-r04") == []
    after = (await reset(sim, tmp_path, command="check")).hosts["gpu-r04"]
    assert settings_findings(after) == {5: [(Level.WARN, "power limit 450 W, default 700 W")]}
