"""The settle step's pure part: when each GPU first went, and stayed, under the threshold."""

from __future__ import annotations

from fleet.inventory.host import Host
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset.settle import Allowance, kept_usage, note_settled, unsettled_error


def test_note_settled_tracks_first_time_under_and_forgets_a_relapse() -> None:
    settled: dict[int, float] = {}
    note_settled([GpuRow(0, 0), GpuRow(1, 900)], Allowance(16), 0.5, settled)
    assert settled == {0: 0.5}
    note_settled([GpuRow(0, 30000), GpuRow(1, 0)], Allowance(16), 1.0, settled)
    assert settled == {1: 1.0}


def test_a_mig_gpu_settles_under_the_mig_threshold_and_a_plain_gpu_does_not() -> None:
    settled: dict[int, float] = {}
    note_settled([GpuRow(0, 55, "GPU-a", mig=True), GpuRow(1, 55, "GPU-b")], Allowance(16, 256), 0.5, settled)
    assert settled == {0: 0.5}


def test_kept_processes_memory_does_not_keep_a_gpu_from_settling() -> None:
    allowance = Allowance(16, kept_mib={"GPU-a": 300})
    settled: dict[int, float] = {}
    note_settled([GpuRow(0, 310, "GPU-a"), GpuRow(1, 310, "GPU-b")], allowance, 2.0, settled)
    assert settled == {0: 2.0}
    assert unsettled_error([GpuRow(0, 310, "GPU-a"), GpuRow(1, 310, "GPU-b")], allowance, 60) == (
        "gpu 1 holds 310 MiB after 60 s (threshold 16 MiB)")
    assert unsettled_error([GpuRow(0, 400, "GPU-a")], allowance, 60) == (
        "gpu 0 holds 400 MiB (300 MiB of it by kept processes) after 60 s (threshold 16 MiB)")


def test_the_allowance_of_a_host_and_of_kept_apps() -> None:
    apps = [ComputeApp("GPU-a", 77, "nvidia-cuda-mps-server", 300), ComputeApp("GPU-a", 78, "x", None),
            ComputeApp("GPU-b", 79, "y", 20), ComputeApp(None, 80, "z", 999)]
    assert kept_usage(apps) == {"GPU-a": 300, "GPU-b": 20}
    allowance = Allowance.of(Host("h", "h", memory_threshold_mib=8), apps)
    assert allowance == Allowance(8, 256, {"GPU-a": 300, "GPU-b": 20})
    assert (allowance.limit(GpuRow(0, 0, mig=True)), allowance.limit(GpuRow(0, 0))) == (256, 8)
    assert Allowance(300, 256).limit(GpuRow(0, 0, mig=True)) == 300  # never less than the plain threshold
    assert Allowance(16).problem(GpuRow(3, None)) == "gpu 3 memory.used is not a number ([N/A])"
