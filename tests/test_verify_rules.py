"""The verify step's pure verdict: what keeps a node from being clean, in one line."""

from __future__ import annotations

from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset.protection import Holder
from fleet.reset.verify import verify_error

ROWS_CLEAN = (GpuRow(0, 0, "GPU-a"), GpuRow(1, 1, "GPU-b"))


def test_verify_clean() -> None:
    assert verify_error(ROWS_CLEAN, (), 2, 16) is None


def test_verify_names_gpu_memory_and_the_process() -> None:
    rows = (GpuRow(0, 1523, "GPU-a"), GpuRow(1, 0, "GPU-b"))
    apps = (ComputeApp("GPU-a", 39865, "/usr/bin/python3", 1523),)
    error = verify_error(rows, apps, 2, 16)
    assert error == "gpu 0 holds 1523 MiB (pid 39865 python3) (+1 more)"


def test_verify_na_memory_is_never_clean() -> None:
    assert verify_error((GpuRow(0, None), GpuRow(1, 0)), (), 2, 16) == (
        "gpu 0 memory.used is not a number ([N/A])"
    )


def test_verify_missing_gpu() -> None:
    assert verify_error(ROWS_CLEAN, (), 8, 16) == "expected 8 GPUs, nvidia-smi lists 2"


def test_verify_no_gpus_at_all() -> None:
    assert verify_error((), (), None, 16) == "nvidia-smi listed no GPUs"


def test_compute_app_on_an_idle_gpu_is_not_clean() -> None:
    apps = (ComputeApp("GPU-b", 4242, "sglang", 0),)
    assert verify_error(ROWS_CLEAN, apps, 2, 16) == "pid 4242 sglang still runs on gpu 1"


def test_threshold_is_inclusive() -> None:
    assert verify_error((GpuRow(0, 16),), (), 1, 16) is None
    assert verify_error((GpuRow(0, 17),), (), 1, 16) == "gpu 0 holds 17 MiB"


def test_an_unprotected_holder_without_memory_is_not_clean() -> None:
    """A respawned process that opened the devices but has not allocated yet still fails verify."""
    holder = Holder(4242, "root", "python3", "/usr/bin/python3", ("/dev/nvidia2",))
    assert verify_error(ROWS_CLEAN, (), 2, 16, [holder]) == "pid 4242 python3 still holds /dev/nvidia2"
