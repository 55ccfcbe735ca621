"""The health gate and the GPU reset, through simulated nodes over SSH: verify means fit to benchmark.

Each finding that fails fails its host with a clear error; warnings do not; `check` reports the same facts
read-only; `--gpu-reset` clears a leaked context where no process holds the GPU and refuses, naming who,
where one does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.sim_fleet import ALL, busy, fast_vars, fleet_cli, make_fleet, reset, step

from fleet.model.report import HostStatus, Level, Reason, StepName, StepStatus
from fleet.sim.node import WorkerSpec

__all__ = ["make_fleet"]  # the fixture, shared with test_reset_sim


def findings(host: Any) -> dict[int, list[tuple[str, str]]]:
    return {g.index: [(f.check, f.level.value) for f in g.health] for g in host.gpus if g.health}


@pytest.mark.parametrize(
    ("spec", "check", "error"),
    [
        ({"ecc_error_gpus": (2,)}, "ecc_uncorrected", "gpu 2: "),
        ({"remap_pending_gpus": (4,)}, "remap_pending", "gpu 4: "),
        ({"remap_failed_gpus": (5,)}, "remap_failed", "gpu 5: "),
        ({"narrow_pcie_gpus": (6,)}, "pcie_width", "gpu 6: "),
        ({"fabric": "In Progress/N/A"}, "fabric", "gpu 0: "),
        ({"xids": ((3, 79, "pid=1234, name=python3, GPU has fallen off the bus."),)}, "xid", "gpu 3: Xid 79"),
    ],
)
async def test_each_failing_finding_fails_its_host_with_a_clear_error(
    make_fleet: Any, tmp_path: Path, spec: dict[str, Any], check: str, error: str
) -> None:
    sim = await make_fleet([busy("gpu-s01", **spec), busy("gpu-s02")], fast_vars(["gpu-s01", "gpu-s02"]))
    report = await reset(sim, tmp_path)
    sick, healthy = report.hosts["gpu-s01"], report.hosts["gpu-s02"]
    assert sick.status is HostStatus.FAILED
    assert sick.error is not None and sick.error.startswith(error), sick.error
    assert sick.reason is Reason.HEALTH
    assert any(c == check and level == "fail" for found in findings(sick).values() for c, level in found)
    assert step(sick, StepName.VERIFY).status is StepStatus.FAILED
    assert healthy.status is HostStatus.CLEAN, healthy.error
    assert findings(healthy) == {}


@pytest.mark.parametrize(
    ("field", "check"),
    [
        ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected"),
        ("ecc.errors.corrected.volatile.total", "ecc_corrected"),  # a warn check: unread still fails
        ("retired_pages.pending", "retired_pending"),
        ("remapped_rows.pending", "remap_pending"),  # read from -q -d ROW_REMAPPER
        ("fabric.status", "fabric"),
    ],
)
async def test_a_health_field_nvidia_smi_could_not_read_fails_its_host_naming_gpu_and_field(
    make_fleet: Any, tmp_path: Path, field: str, check: str
) -> None:
    """Unread is not absent: `[Unknown Error]` in a health field is a fact never observed, never a clean GPU."""
    names = ["gpu-u01", "gpu-u02"]
    sim = await make_fleet([busy("gpu-u01", unread_fields=((3, field),)), busy("gpu-u02", unread_fields=((3, field),))],
                           {"gpu-u01": fast_vars(names)["gpu-u01"],
                            "gpu-u02": {**fast_vars(names)["gpu-u02"], "health_ignore": [check]}})
    report = await reset(sim, tmp_path)
    sick, ignored = report.hosts["gpu-u01"], report.hosts["gpu-u02"]
    assert sick.status is HostStatus.FAILED
    assert sick.reason is Reason.HEALTH
    printed = "Unknown Error" if check == "remap_pending" else "[Unknown Error]"  # -q prints it bare
    named = "Remapped Rows / Pending" if check == "remap_pending" else field
    assert sick.error == (f"gpu 3: {named} not observed (nvidia-smi printed {printed}): set health_ignore: "
                          f"[{check}] to skip the check")
    assert findings(sick) == {3: [(check, "fail")]}
    assert ignored.status is HostStatus.CLEAN, ignored.error  # health_ignore skips the check
    assert findings(ignored) == {}


async def test_warnings_are_reported_and_do_not_fail_the_host(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-w01", ecc_corrected_gpus=(1,), protected_daemon=False,
                                 xids=((0, 13, "Graphics SM Warp Exception on (GPC 0, TPC 1)"),))],
                           fast_vars(["gpu-w01"]))
    report = await reset(sim, tmp_path)
    host = report.hosts["gpu-w01"]
    assert host.status is HostStatus.CLEAN, host.error
    found = findings(host)
    assert ("ecc_corrected", "warn") in found[1]
    assert all(("persistence", "warn") in found[i] for i in ALL)
    assert ("xid", "warn") in found[0]  # logged before the reset began, not a code that needs action
    assert "(warn)" in step(host, StepName.VERIFY).detail


async def test_the_policy_is_per_host(make_fleet: Any, tmp_path: Path) -> None:
    """`health_warn` downgrades a failing check to a warning; `health_ignore` does not judge it at all."""
    names = ["gpu-p01", "gpu-p02"]
    sim = await make_fleet([busy(n, narrow_pcie_gpus=(0,)) for n in names],
                           {"gpu-p01": {**fast_vars(names)["gpu-p01"], "health_warn": ["pcie_width"]},
                            "gpu-p02": {**fast_vars(names)["gpu-p02"], "health_ignore": ["pcie_width"]}})
    report = await reset(sim, tmp_path)
    assert report.hosts["gpu-p01"].status is HostStatus.CLEAN
    assert findings(report.hosts["gpu-p01"])[0] == [("pcie_width", Level.WARN.value)]
    assert report.hosts["gpu-p02"].status is HostStatus.CLEAN
    assert findings(report.hosts["gpu-p02"]) == {}


async def test_check_reports_the_same_health_facts_read_only(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-c01", remap_pending_gpus=(4,))], fast_vars(["gpu-c01"]))
    code, out, err = await fleet_cli("check", "-i", str(sim.inventory_path), "gpu-c01", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    assert code == 1, err
    host = json.loads(out)["hosts"]["gpu-c01"]
    assert host["gpus"][4]["health"] == [
        {"check": "remap_pending", "level": "fail", "detail": host["gpus"][4]["health"][0]["detail"]}]
    assert sim.nodes["gpu-c01"].unit_state("sglang.service") == "active"  # read-only: nothing stopped


LEAK = {"settle_timeout": 2}


async def test_a_leaked_context_stays_without_gpu_reset(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-l01", leaked_mib=((3, 2048),))],
                           {"gpu-l01": {**fast_vars(["gpu-l01"])["gpu-l01"], **LEAK}})
    report = await reset(sim, tmp_path)
    host = report.hosts["gpu-l01"]
    assert host.status is HostStatus.FAILED
    assert step(host, StepName.SETTLE).status is StepStatus.TIMEOUT
    assert host.reason is Reason.MEMORY_LEAKED  # not a slow release: no process holds it, and the line says so
    assert host.error == ("settle: gpu 3 holds 2048 MiB with no process holding it after 2 s: a leaked context;"
                          " --gpu-reset can reset it")
    assert sim.nodes["gpu-l01"].gpu_resets() == []


async def test_gpu_reset_clears_a_leaked_context_where_no_process_holds_the_gpu(
    make_fleet: Any, tmp_path: Path
) -> None:
    """A node without NVSwitch (PCIe GPUs): only the GPU left holding memory is reset."""
    sim = await make_fleet([busy("gpu-l02", leaked_mib=((3, 2048),), fabric="N/A")],
                           {"gpu-l02": {**fast_vars(["gpu-l02"])["gpu-l02"], **LEAK}})
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-l02", "--gpu-reset", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    host = json.loads(out)["hosts"]["gpu-l02"]
    assert code == 0, (host, err)
    settle = next(s for s in host["steps"] if s["name"] == "settle")
    assert settle["detail"].startswith("reset gpu 3 with nvidia-smi -r; 8 GPUs at or under")
    assert sim.nodes["gpu-l02"].gpu_resets() == [3]
    assert sim.nodes["gpu-l02"].gpu_memory() == [0] * 8


async def test_gpu_reset_on_an_nvswitch_baseboard_resets_every_gpu_together(make_fleet: Any, tmp_path: Path) -> None:
    """HGX/DGX (a fabric on every GPU): the baseboard's GPUs are reset as one, `nvidia-smi -r` without -i."""
    sim = await make_fleet([busy("gpu-l04", leaked_mib=((3, 2048),))],
                           {"gpu-l04": {**fast_vars(["gpu-l04"])["gpu-l04"], **LEAK}})
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-l04", "--gpu-reset", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    host = json.loads(out)["hosts"]["gpu-l04"]
    assert code == 0, (host, err)
    settle = next(s for s in host["steps"] if s["name"] == "settle")
    assert settle["detail"].startswith("reset all GPUs (NVSwitch baseboard) with nvidia-smi -r")
    assert sorted(sim.nodes["gpu-l04"].gpu_resets()) == list(ALL)


async def test_gpu_reset_refuses_and_says_who_while_a_process_holds_the_gpu(make_fleet: Any, tmp_path: Path) -> None:
    """The MPS server (kept on purpose) holds GPU 3's device: the reset is refused, naming it; nothing is reset."""
    mps = WorkerSpec(gpus=(3,), mib=0, name="nvidia-cuda-mps-server")
    sim = await make_fleet([busy("gpu-l03", leaked_mib=((3, 2048),), workers=(mps,))],
                           {"gpu-l03": {**fast_vars(["gpu-l03"])["gpu-l03"], **LEAK}})
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-l03", "--gpu-reset", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    host = json.loads(out)["hosts"]["gpu-l03"]
    assert code == 1, err
    settle = next(s for s in host["steps"] if s["name"] == "settle")
    assert "gpu reset refused: pid " in settle["detail"] and "nvidia-cuda-mps-server" in settle["detail"]
    assert "; gpu reset refused: pid " in host["error"] and "nvidia-cuda-mps-server" in host["error"]  # the host's line
    assert host["reason"] == "memory_leaked"
    assert sim.nodes["gpu-l03"].gpu_resets() == []
