"""Pure decisions: protection, kill records, settle bookkeeping, verify verdicts and their one-line errors."""

from __future__ import annotations

from fleet.inventory.host import BUILTIN_PROTECTED
from fleet.node.probes import ComputeApp, GpuRow, Holder, Lineage, ProcStat, PsRow, UnitState
from fleet.report.models import StepName
from fleet.reset import policy
from fleet.reset.plan import describe_plan

ROWS_CLEAN = (GpuRow(0, 0, "GPU-a"), GpuRow(1, 1, "GPU-b"))


def test_protected_daemon_with_a_cut_comm_is_kept_and_python_is_not() -> None:
    found = (Holder(10, "root", ("/dev/nvidiactl",)), Holder(39865, "alice", ("/dev/nvidia0",)))
    ps = {10: PsRow(10, 1, "root", "/usr/bin/nvidia-persistenced --verbose"),
          39865: PsRow(39865, 1, "alice", "python3 train.py")}
    exe = {10: "/usr/bin/nvidia-persistenced", 39865: "/usr/bin/python3.11"}
    lineage = Lineage({10: ProcStat(10, 1, "nvidia-persiste"), 39865: ProcStat(39865, 1, "python3"),
                       1: ProcStat(1, 0, "systemd")})
    facts = policy.ProcessFacts(ps, exe, lineage)
    kept, target = policy.describe_holders(found, facts, policy.Rules(BUILTIN_PROTECTED))
    assert kept.protected_by == "protected name nvidia-persistenced"
    assert (kept.name, kept.comm) == ("nvidia-persistenced", "nvidia-persiste")
    assert target.protected_by is None
    assert (target.user, target.name, target.comm) == ("alice", "python3", None)


def test_a_holder_gone_before_ps_is_dropped() -> None:
    found = (Holder(7, "root", ("/dev/nvidia0",)),)
    assert policy.describe_holders(found, policy.ProcessFacts({}, {}), policy.Rules(BUILTIN_PROTECTED)) == ()


def test_killed_records_name_the_last_signal_needed() -> None:
    targets = [policy.Holder(p, "root", "python3", None, ()) for p in (1, 2, 3)]
    records = policy.killed_records(targets, after_term=frozenset({2, 3}), after_kill=frozenset({3}))
    assert [(r.pid, r.signal) for r in records] == [(1, "SIGTERM"), (2, "SIGKILL")]
    assert policy.kill_error(frozenset({3}), targets, []) == "survived SIGKILL: pid 3 python3"


def test_new_holder_after_kill_is_an_error() -> None:
    targets = [policy.Holder(1, "root", "python3", None, ())]
    back = [policy.Holder(2, "root", "python3", None, ())]
    assert policy.kill_error(frozenset(), targets, back) == "new GPU holders after kill: pid 2 python3"


def test_note_settled_tracks_first_time_under_and_forgets_a_relapse() -> None:
    settled: dict[int, float] = {}
    policy.note_settled([GpuRow(0, 0), GpuRow(1, 900)], 16, 0.5, settled)
    assert settled == {0: 0.5}
    policy.note_settled([GpuRow(0, 30000), GpuRow(1, 0)], 16, 1.0, settled)
    assert settled == {1: 1.0}


def test_verify_clean() -> None:
    assert policy.verify_error(ROWS_CLEAN, (), 2, 16) is None


def test_verify_names_gpu_memory_and_the_process() -> None:
    rows = (GpuRow(0, 1523, "GPU-a"), GpuRow(1, 0, "GPU-b"))
    apps = (ComputeApp("GPU-a", 39865, "/usr/bin/python3", 1523),)
    error = policy.verify_error(rows, apps, 2, 16)
    assert error == "gpu 0 holds 1523 MiB (pid 39865 python3) (+1 more)"


def test_verify_na_memory_is_never_clean() -> None:
    assert policy.verify_error((GpuRow(0, None), GpuRow(1, 0)), (), 2, 16) == (
        "gpu 0 memory.used is not a number ([N/A])"
    )


def test_verify_missing_gpu() -> None:
    assert policy.verify_error(ROWS_CLEAN, (), 8, 16) == "expected 8 GPUs, nvidia-smi lists 2"


def test_verify_no_gpus_at_all() -> None:
    assert policy.verify_error((), (), None, 16) == "nvidia-smi listed no GPUs"


def test_compute_app_on_an_idle_gpu_is_not_clean() -> None:
    apps = (ComputeApp("GPU-b", 4242, "sglang", 0),)
    assert policy.verify_error(ROWS_CLEAN, apps, 2, 16) == "pid 4242 sglang still runs on gpu 1"


def test_threshold_is_inclusive() -> None:
    assert policy.verify_error((GpuRow(0, 16),), (), 1, 16) is None
    assert policy.verify_error((GpuRow(0, 17),), (), 1, 16) == "gpu 0 holds 17 MiB"


def test_build_plan_splits_kill_and_keep_with_memory_per_process() -> None:
    holders = [
        policy.Holder(10, "root", "nvidia-persiste", None, ("/dev/nvidiactl",), "nvidia-persistenced"),
        policy.Holder(4400, "root", "sglang", None, ("/dev/nvidia0", "/dev/nvidia1")),
        policy.Holder(4412, "alice", "python3", None, ("/dev/nvidia0",)),
    ]
    apps = [ComputeApp("GPU-a", 4400, "sglang", 70000), ComputeApp("GPU-b", 4400, "sglang", 70000),
            ComputeApp("GPU-a", 4412, "python3", 1523)]
    units = {"sglang.service": UnitState("active", "running", 4400), "old.service": UnitState("inactive", None, None)}
    plan = policy.build_plan(units, holders, apps, (GpuRow(0, 71523), GpuRow(1, 70000)))
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



def test_an_unprotected_holder_without_memory_is_not_clean() -> None:
    """A respawned process that opened the devices but has not allocated yet still fails verify."""
    holder = policy.Holder(4242, "root", "python3", "/usr/bin/python3", ("/dev/nvidia2",))
    assert policy.verify_error(ROWS_CLEAN, (), 2, 16, [holder]) == "pid 4242 python3 still holds /dev/nvidia2"


def test_a_kill_the_node_refused_says_how_to_fix_it() -> None:
    targets = [policy.Holder(7, "bob", "python3", None, ())]
    error = policy.kill_error(frozenset({7}), targets, [], denied="kill: (7): Operation not permitted")
    assert error == (
        "not permitted to kill pid 7 python3 (kill: (7): Operation not permitted): run as root or set become: true"
    )
