"""The verify step's pure verdict: what keeps a node from being clean, in one line."""

from __future__ import annotations

import pytest
from support import scripted_node

from fleet.inventory.host import Host
from fleet.model.hostlog import NoLog
from fleet.model.report import StepStatus
from fleet.node.node import Node
from fleet.node.probes.smi import VERIFY_FIELDS, ComputeApp, GpuRow
from fleet.reset.protection import Holder
from fleet.reset.settle import Allowance, kept_usage
from fleet.reset.verify import describe_kept, verify, verify_error
from fleet.transport.scripted import Reply, ScriptedTransport

ROWS_CLEAN = (GpuRow(index=0, memory_used_mib=0, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=1, uuid="GPU-b"))


def test_verify_clean() -> None:
    assert verify_error(ROWS_CLEAN, (), 2, Allowance(16)) is None


def test_verify_names_gpu_memory_and_the_process() -> None:
    rows = (GpuRow(index=0, memory_used_mib=1523, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=0, uuid="GPU-b"))
    apps = (ComputeApp(gpu_uuid="GPU-a", pid=39865, process_name="/usr/bin/python3", used_mib=1523),)
    error = verify_error(rows, apps, 2, Allowance(16))
    assert error == "gpu 0 holds 1523 MiB (pid 39865 python3) (+1 more)"


def test_verify_na_memory_is_never_clean() -> None:
    assert verify_error((GpuRow(index=0, memory_used_mib=None), GpuRow(index=1, memory_used_mib=0)), (), 2,
                        Allowance(16)) == (
        "gpu 0 memory.used is not a number ([N/A])"
    )


def test_verify_missing_gpu() -> None:
    assert verify_error(ROWS_CLEAN, (), 8, Allowance(16)) == "expected 8 GPUs, nvidia-smi lists 2"


def test_verify_no_gpus_at_all() -> None:
    assert verify_error((), (), None, Allowance(16)) == "nvidia-smi listed no GPUs"


def test_compute_app_on_an_idle_gpu_is_not_clean() -> None:
    apps = (ComputeApp(gpu_uuid="GPU-b", pid=4242, process_name="sglang", used_mib=0),)
    assert verify_error(ROWS_CLEAN, apps, 2, Allowance(16)) == "pid 4242 sglang still runs on gpu 1"


def test_threshold_is_inclusive() -> None:
    assert verify_error((GpuRow(index=0, memory_used_mib=16),), (), 1, Allowance(16)) is None
    assert verify_error((GpuRow(index=0, memory_used_mib=17),), (), 1, Allowance(16)) == "gpu 0 holds 17 MiB"


def test_an_unprotected_holder_without_memory_is_not_clean() -> None:
    """A respawned process that opened the devices but has not allocated yet still fails verify."""
    holder = Holder(pid=4242, user="root", name="python3", exe=b"/usr/bin/python3", devices=("/dev/nvidia2",))
    assert verify_error(ROWS_CLEAN, (), 2, Allowance(16), [holder]) == "pid 4242 python3 still holds /dev/nvidia2"


# --- what fleet keeps on purpose, and MIG ---------------------------------------------------

MPS = ComputeApp(gpu_uuid="GPU-a", pid=77, process_name="/usr/bin/nvidia-cuda-mps-server", used_mib=300)


def test_a_kept_mps_servers_memory_is_allowed_on_its_gpu() -> None:
    """The MPS server is kept (protected): what it holds is allowed on its GPU, and it is not a leftover app."""
    allowance = Allowance(16, kept_mib=kept_usage([MPS]))
    assert allowance == Allowance(16, kept_mib={"GPU-a": 300})
    rows = (GpuRow(index=0, memory_used_mib=310, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=0, uuid="GPU-b"))
    assert verify_error(rows, (), 2, allowance) is None
    assert describe_kept([MPS]) == "; kept pid 77 nvidia-cuda-mps-server (300 MiB)"
    assert describe_kept([]) == ""


def test_memory_beyond_what_kept_processes_hold_is_not_clean_and_says_how_much_is_kept() -> None:
    allowance = Allowance(16, kept_mib={"GPU-a": 300})
    rows = (GpuRow(index=0, memory_used_mib=400, uuid="GPU-a"), GpuRow(index=1, memory_used_mib=0, uuid="GPU-b"))
    assert verify_error(rows, (), 2, allowance) == "gpu 0 holds 400 MiB (300 MiB of it by kept processes)"
    assert verify_error((GpuRow(index=0, memory_used_mib=310, uuid="GPU-b"),
                         GpuRow(index=1, memory_used_mib=0, uuid="GPU-a")), (), 2, allowance) == (
        "gpu 0 holds 310 MiB")  # kept memory counts only on the GPU it is on


def test_a_kept_server_beside_a_leftover_app_names_the_app() -> None:
    allowance = Allowance(16, kept_mib={"GPU-a": 300})
    leftover = ComputeApp(gpu_uuid="GPU-a", pid=4242, process_name="/usr/bin/python3", used_mib=2000)
    assert verify_error((GpuRow(index=0, memory_used_mib=2300, uuid="GPU-a"),), (leftover,), 1, allowance) == (
        "gpu 0 holds 2300 MiB (300 MiB of it by kept processes) (pid 4242 python3) (+1 more)")


def test_an_idle_mig_gpu_is_clean_under_the_mig_threshold() -> None:
    """An idle H200 with MIG instances reports 55 MiB used with no process."""
    assert verify_error((GpuRow(index=0, memory_used_mib=55, uuid="GPU-a", mig=True),), (), 1,
                        Allowance(16, 256)) is None
    assert verify_error((GpuRow(index=0, memory_used_mib=257, uuid="GPU-a", mig=True),), (), 1,
                        Allowance(16, 256)) == "gpu 0 holds 257 MiB"


def test_the_same_memory_on_a_gpu_without_mig_is_not_clean() -> None:
    assert verify_error((GpuRow(index=0, memory_used_mib=55, uuid="GPU-a"),), (), 1,
                        Allowance(16, 256)) == "gpu 0 holds 55 MiB"
    assert verify_error((GpuRow(index=0, memory_used_mib=55, uuid="GPU-a", mig=True),), (), 1,
                        Allowance(16)) == "gpu 0 holds 55 MiB"


def mps_node(used_mib: int) -> Node:
    """One GPU at `used_mib`, the MPS server (pid 77, 300 MiB) its only compute app and device holder."""
    t = ScriptedTransport(script=[
        *scripted_node.healthy("00000000:01:00.0"),
        (("nvidia-smi", "--query-gpu=" + ",".join(VERIFY_FIELDS)),
         Reply(stdout=f"0, GPU-a, 00000000:01:00.0, NVIDIA H100, {used_mib}, 81559, 0, Disabled\n")),
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout="GPU-a, 77, nvidia-cuda-mps-server, 300\n")),
        (scripted_node.SCAN, Reply(stdout=scripted_node.scan("root\t/proc/77/task/77/fd/3\t/dev/nvidia0\n"))),
        (("ps", "-ww"), Reply(stdout=scripted_node.ps("   77     1 root     nvidia-cuda-mps-server -d\n"))),
        (scripted_node.EXE, scripted_node.exe_reply({77: "/usr/bin/nvidia-cuda-mps-server"})),
        (scripted_node.LINEAGE, lambda argv: scripted_node.lineage(argv, comm="nvidia-cuda-mps")),
        (("grep",), Reply(stdout="/proc/77/cgroup:0::/system.slice/nvidia-mps.service\n")),  # in no job
        (scripted_node.KERNEL_LOG, scripted_node.kernel_log_reply()),
    ])
    return Node(Host(name="gpu-01", address="127.0.0.1", gpus=1, command_timeout=1.0), t, NoLog())


async def test_verify_keeps_the_mps_server_and_allows_what_it_holds() -> None:
    outcome = await verify(mps_node(310))
    assert (outcome.result.status, outcome.result.error) == (StepStatus.OK, None)
    assert outcome.result.detail.endswith("0 compute apps, 0 unprotected holders; kept pid 77 nvidia-cuda-mps-server"
                                          " (300 MiB)")


@pytest.mark.parametrize("used", [400, 317])
async def test_verify_with_the_mps_server_kept_still_sees_memory_beyond_it(used: int) -> None:
    outcome = await verify(mps_node(used))
    assert outcome.result.status is StepStatus.FAILED
    assert outcome.result.error == f"gpu 0 holds {used} MiB (300 MiB of it by kept processes)"
