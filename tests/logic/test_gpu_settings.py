"""The GPU settings a last user may leave behind, read in the reads verify already makes: golden
reads of real captures (tests/fixtures/nvidia-smi, SOURCES.md), the older drivers' key names, what a driver no
longer says, and the simulated nvidia-smi answering the same facts both ways."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

from support import scripted_node
from support.paths import FIXTURES
from support.sim_fleet import busy, fast_vars, reset
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test

from fleet.model import gpu_facts
from fleet.model.codec import Fields, gpu_document, gpu_from
from fleet.model.gpu_facts import GpuHealth, GpuSettings
from fleet.model.report import GpuReport, HostStatus
from fleet.node.probes import health
from fleet.sim.node import NodeSpec, SimNode

__all__ = ["make_fleet"]  # the fixture, shared with test_reset_sim

SMI = FIXTURES / "nvidia-smi"

# The 590.48.01 H200's -q (idle): application clocks are "Requested functionality has been deprecated" there,
# an NVML error string: not said, never a guess.
H200_590 = GpuSettings(name="NVIDIA H200", vbios="96.00.A5.00.03", driver="590.48.01", persistence=True,
                       compute_mode="Default", mig=False, mig_pending=False, ecc=True, ecc_pending=True,
                       power_limit_w=700.0, enforced_power_limit_w=700.0, default_power_limit_w=700.0,
                       app_clocks_setting=False)


def fixture(name: str) -> str:
    return (SMI / name).read_bytes().decode()


def settings(gpus: tuple[GpuHealth, ...]) -> list[GpuSettings]:
    return [GpuSettings.of(g) for g in gpus]


def test_every_setting_is_a_row_of_the_table_and_a_field_of_the_record() -> None:
    assert [f.name for f in gpu_facts.SETTINGS] == [f.name for f in dataclasses.fields(GpuSettings)]
    assert set(gpu_facts.SETTINGS) <= set(gpu_facts.FIELDS)
    assert all(f.check is None or f is gpu_facts.PERSISTENCE for f in gpu_facts.SETTINGS)  # no policy yet


def test_h200_driver_590_q() -> None:
    assert settings(health.parse_all_health(fixture("h200_drv590.48.01_1gpu_q_idle.txt"))) == [H200_590]


def test_eight_h100_driver_535_q_has_application_clocks() -> None:
    found = settings(health.parse_all_health(fixture("8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt")))
    h100 = dataclasses.replace(H200_590, name="NVIDIA H100 80GB HBM3", vbios="96.00.74.00.01", driver="535.183.01",
                               app_clock_graphics_mhz=1980, app_clock_memory_mhz=2619,
                               default_app_clock_graphics_mhz=1980, default_app_clock_memory_mhz=2619)
    assert found == [h100] * 8


def test_a100_driver_460_q_older_key_names() -> None:
    """`Power Limit` / `Enforced Power Limit` under `Power Readings`, `Clocks Throttle Reasons`, `Ecc Mode`."""
    found = settings(health.parse_health(fixture(
        "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt")))
    a100 = GpuSettings(name="A100-SXM4-40GB", vbios="92.00.36.00.04", driver="460.32.03", persistence=False,
                       compute_mode="Default", mig=False, mig_pending=False, ecc=True, ecc_pending=True,
                       power_limit_w=400.0, enforced_power_limit_w=400.0, default_power_limit_w=400.0,
                       app_clocks_setting=False, app_clock_graphics_mhz=1095, app_clock_memory_mhz=1215,
                       default_app_clock_graphics_mhz=1095, default_app_clock_memory_mhz=1215)
    assert found == [a100, a100]


def test_h100_driver_590_query_gpu() -> None:
    """The same settings from --query-gpu (nounits), as verify reads them on a clean host."""
    (gpu,) = health.parse_facts(scripted_node.healthy_facts("00000000:18:00.0")) or ()
    assert GpuSettings.of(gpu) == dataclasses.replace(H200_590, name="NVIDIA H100 80GB HBM3", vbios="96.00.A5.00.01")


def test_a_changed_setting_reads_as_changed() -> None:
    """What a previous user leaves: a lowered power limit, application clocks in force, exclusive compute, MIG on
    at the next reset (values written into the real 535 capture's lines)."""
    text = fixture("8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt")
    for old, new in [("Requested Power Limit             : 700.00 W", "Requested Power Limit             : 450.00 W"),
                     ("Current Power Limit               : 700.00 W", "Current Power Limit               : 450.00 W"),
                     ("Applications Clocks Setting       : Not Active", "Applications Clocks Setting       : Active"),
                     ("Compute Mode                          : Default",
                      "Compute Mode                          : Exclusive_Process")]:
        assert old in text, old
        text = text.replace(old, new, 1)
    first = GpuSettings.of(health.parse_all_health(text)[0])
    assert (first.power_limit_w, first.enforced_power_limit_w, first.default_power_limit_w) == (450.0, 450.0, 700.0)
    assert (first.app_clocks_setting, first.compute_mode) == (True, "Exclusive_Process")


def sh(node: SimNode, command: str) -> str:
    return subprocess.run(["/bin/sh", "-c", command], env=node.env(), cwd=node.root, capture_output=True,
                          text=True, timeout=30, check=True).stdout


def test_the_simulated_nvidia_smi_says_the_same_settings_both_ways(tmp_path: Path) -> None:
    """The node's driver and model, MIG where the spec sets it, and the rows' healthy values, in --query-gpu and
    -q alike."""
    node = SimNode(tmp_path / "gpu-s01", NodeSpec(name="gpu-s01", gpus=2, mig_gpus=(1,), driver_version="575.57.08"))
    node.setup()
    try:
        facts = health.parse_facts(sh(node, " ".join(health.facts_argv("nvidia-smi")))) or ()
        whole = health.parse_all_health(sh(node, "nvidia-smi -q"))
    finally:
        node.stop()
    assert settings(facts) == settings(whole)
    plain, mig = settings(whole)
    assert (plain.driver, plain.name, plain.mig, mig.mig, mig.mig_pending) == (
        "575.57.08", "NVIDIA H100 80GB HBM3", False, True, True)
    # Before 590 the application clocks are values (the 535 and 580 captures), the H100's 1980 and 2619 MHz.
    assert (plain.app_clock_graphics_mhz, plain.app_clock_memory_mhz, plain.power_limit_w) == (1980, 2619, 700.0)


def test_the_json_report_carries_a_gpus_settings_both_ways() -> None:
    """`gpus[].settings` where verify read them (null where it did not; a document without the key reads as
    null), read back as the same record (the --via srun relay reads a node's report so)."""
    read = GpuReport(index=0, memory_used_mib=0, settings=H200_590)
    document = json.loads(json.dumps(gpu_document(read)))
    assert document["settings"]["power_limit_w"] == 700.0 and document["settings"]["driver"] == "590.48.01"
    assert gpu_from(Fields(document)) == read
    assert gpu_document(GpuReport(index=0, memory_used_mib=0))["settings"] is None
    older = {k: v for k, v in gpu_document(GpuReport(index=0, memory_used_mib=0)).items() if k != "settings"}
    assert gpu_from(Fields(older)) == GpuReport(index=0, memory_used_mib=0)


async def test_a_reset_records_each_gpus_settings(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-s01", driver_version="575.57.08", mig_gpus=(3,))], fast_vars(["gpu-s01"]))
    host = (await reset(sim, tmp_path)).hosts["gpu-s01"]
    assert host.status is HostStatus.CLEAN, host.error
    said = [g.settings for g in host.gpus]
    assert all(s is not None and s.driver == "575.57.08" and s.power_limit_w == 700.0 for s in said)
    assert [i for i, s in enumerate(said) if s is not None and s.mig] == [3]
