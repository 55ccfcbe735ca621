"""The dry run's pure part: what a reset would stop, kill and keep, and how the plan reads."""

from __future__ import annotations

from fleet.model.report import StepName
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.node.probes.units import UnitState
from fleet.reset.plan import build_plan, describe_plan
from fleet.reset.protection import Holder


def test_build_plan_splits_kill_and_keep_with_memory_per_process() -> None:
    holders = [
        Holder(pid=10, user="root", name="nvidia-persiste", exe=None, devices=("/dev/nvidiactl",),
               protected_by="nvidia-persistenced"),
        Holder(pid=4400, user="root", name="sglang", exe=None, devices=("/dev/nvidia0", "/dev/nvidia1")),
        Holder(pid=4412, user="alice", name="python3", exe=None, devices=("/dev/nvidia0",)),
    ]
    apps = [ComputeApp(gpu_uuid="GPU-a", pid=4400, process_name="sglang", used_mib=70000),
            ComputeApp(gpu_uuid="GPU-b", pid=4400, process_name="sglang", used_mib=70000),
            ComputeApp(gpu_uuid="GPU-a", pid=4412, process_name="python3", used_mib=1523)]
    units = {"sglang.service": UnitState(active_state="active", sub_state="running", main_pid=4400),
             "old.service": UnitState(active_state="inactive", sub_state=None, main_pid=None)}
    plan = build_plan(units, holders, apps,
                      (GpuRow(index=0, memory_used_mib=71523), GpuRow(index=1, memory_used_mib=70000)))
    assert plan.would_stop == ("sglang.service",)
    assert [(p.pid, p.mib) for p in plan.would_kill] == [(4400, 140000), (4412, 1523)]
    assert [(p.pid, p.kept_because, p.mib) for p in plan.kept] == [(10, "nvidia-persistenced", None)]
    lines = describe_plan(plan)
    assert lines[StepName.DRAIN] == "would stop sglang.service; now sglang.service (active), old.service (inactive)"
    assert lines[StepName.KILL] == (
        "would kill pid 4400 sglang (root, 140000 MiB), pid 4412 python3 (alice, 1523 MiB); "
        "would keep pid 10 nvidia-persiste (root): nvidia-persistenced"
    )
    assert lines[StepName.SETTLE] == "GPUs now hold 141523 MiB in all (max 71523 MiB on one GPU)"
