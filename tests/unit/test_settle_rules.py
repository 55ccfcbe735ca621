"""The settle step's pure part: when each GPU first went, and stayed, under the threshold."""

from __future__ import annotations

from fleet.inventory.host import Host
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset.settle import Allowance, kept_usage, note_settled, unsettled_error


def test_note_settled_tracks_first_time_under_and_forgets_a_relapse() -> None:
    settled: dict[int, float] = {}
    note_settled([GpuRow(index=0, memory_used_mib=0), GpuRow(index=1, memory_used_mib=900)], Allowance(16), 0.5,
                 settled)
    assert settled == {0: 0.5}
    note_settled([GpuRow(index=0, memory_used_mib=30000), GpuRow(index=1, memory_used_mib=0)], Allowance(16), 1.0,
                 settled)
    assert settled == {1: 1.0}


def test_a_mig_gpu_settles_under_the_mig_threshold_and_a_plain_gpu_does_not() -> None:
    settled: dict[int, float] = {}
    note_settled([GpuRow(index=0, memory_used_mib=55, uuid="GPU-a", mig=True),
                  GpuRow(index=1, memory_used_mib=55, uuid="GPU-b")], Allowance(16, 256), 0.5, settled)
    assert settled == {0: 0.5}


def test_kept_processes_memory_does_not_keep_a_gpu_from_settling() -> None:
    allowance = Allowance(16, kept_mib={"GPU-a": 300})
    settled: dict[int, float] = {}
    note_settled([GpuRow(index=0, memory_used_mib=310, uuid="GPU-a"),
                  GpuRow(index=1, memory_used_mib=310, uuid="GPU-b")], allowance, 2.0, settled)
    assert settled == {0: 2.0}
    assert unsettled_error([GpuRow(index=0, memory_used_mib=310, uuid="GPU-a"),
                            GpuRow(index=1, memory_used_mib=310, uuid="GPU-b")], allowance, 60) == (
        "gpu 1 holds 310 MiB after 60 s (threshold 16 MiB)")
    assert unsettled_error([GpuRow(index=0, memory_used_mib=400, uuid="GPU-a")], allowance, 60) == (
        "gpu 0 holds 400 MiB (300 MiB of it by kept processes) after 60 s (threshold 16 MiB)")


def test_the_allowance_of_a_host_and_of_kept_apps() -> None:
    apps = [ComputeApp(gpu_uuid="GPU-a", pid=77, process_name="nvidia-cuda-mps-server", used_mib=300),
            ComputeApp(gpu_uuid="GPU-a", pid=78, process_name="x", used_mib=None),
            ComputeApp(gpu_uuid="GPU-b", pid=79, process_name="y", used_mib=20),
            ComputeApp(gpu_uuid=None, pid=80, process_name="z", used_mib=999)]
    assert kept_usage(apps) == {"GPU-a": 300, "GPU-b": 20}
    allowance = Allowance.of(Host(name="h", address="h", memory_threshold_mib=8), apps)
    assert allowance == Allowance(8, 256, {"GPU-a": 300, "GPU-b": 20})
    assert (allowance.limit(GpuRow(index=0, memory_used_mib=0, mig=True)),
            allowance.limit(GpuRow(index=0, memory_used_mib=0))) == (256, 8)
    assert Allowance(300,
                     256).limit(GpuRow(index=0, memory_used_mib=0,
                                       mig=True)) == 300  # never less than the plain threshold
    assert Allowance(16).problem(GpuRow(index=3, memory_used_mib=None)) == "gpu 3 memory.used is not a number ([N/A])"
