"""Whose the GPU memory that did not come back is (pure): which GPU a device file is (by minor number, never
by taking it for an index), a leaked context, a Slurm job's processes, another process; what `--gpu-reset`
would do; and the one line each ends with."""

from __future__ import annotations

from fleet.model.report import Reason
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset import leaks
from fleet.reset.leaks import Board, Look, Unsettled
from fleet.reset.protection import Holder, JobRef, job_of
from fleet.reset.remedy import GpuReset, choose_gpu_reset
from fleet.reset.settle import Allowance, held_verdict, job_verdict, leaked_line, reset_advice
from fleet.slurm.jobs import JOBS as SLURM

JOB_PROCESS = "a Slurm job's process"

BUS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0")
# As on a DGX: device files numbered in the driver's probe order, not nvidia-smi's index order.
MINORS = {2: BUS[0], 3: BUS[1], 0: BUS[2], 1: BUS[3]}
BOARD = Board(MINORS, nvswitch=False)
ROWS = tuple(GpuRow(index=i, memory_used_mib=0, uuid=f"GPU-{i}", pci_bus_id=BUS[i]) for i in range(4))
PERSISTENCED = Holder(pid=12, user="root", name="nvidia-persistenced", exe=b"/usr/bin/nvidia-persistenced",
                      devices=(*(f"/dev/nvidia{m}" for m in range(4)), "/dev/nvidiactl"),
                      protected_by="protected name nvidia-persistenced")
STEPD_JOB = f"{JOB_PROCESS} (slurmstepd pid 20)"
CGROUP_JOB = f"{JOB_PROCESS} (job 4712, cgroup /system.slice/slurmstepd.scope/job_4712/step_0/user/task_0)"


def holder(pid: int, *devices: str, why: str | None = None, user: str = "alice") -> Holder:
    return Holder(pid=pid, user=user, name="python3", exe=b"/usr/bin/python3.11", devices=devices, protected_by=why)


def look(*holders: Holder, rows: tuple[GpuRow, ...] = ROWS, apps: tuple[ComputeApp, ...] = (),
         board: Board | None = BOARD, titles: dict[int, str] | None = None) -> Look:
    return Look(rows=rows, apps=apps, holders=holders, board=board, titles=titles or {})


def test_a_device_file_is_the_gpu_whose_minor_number_it_carries_never_the_index() -> None:
    found = look(holder(5, "/dev/nvidia0", "/dev/nvidiactl"), holder(6, "/dev/nvidia-uvm"))
    assert found.gpus_of(found.holders[0]) == {2}  # minor 0 is bus 3A, nvidia-smi's gpu 2
    assert found.gpus_of(found.holders[1]) == set()  # no GPU's own device file
    assert found.holders_by_gpu()[2] == (found.holders[0],) and found.holders_by_gpu()[0] == ()


def test_a_device_file_whose_gpu_cannot_be_told_holds_every_gpu() -> None:
    unread = look(holder(5, "/dev/nvidia0"), board=None)
    assert unread.gpus_of(unread.holders[0]) == {0, 1, 2, 3}
    unlisted = look(holder(5, "/dev/nvidia9"))
    assert unlisted.gpus_of(unlisted.holders[0]) == {0, 1, 2, 3}


def test_memory_no_process_holds_is_a_leaked_context_the_machines_own_processes_aside() -> None:
    found = look(PERSISTENCED,
                 apps=(ComputeApp(gpu_uuid="GPU-3", pid=77, process_name="nvidia-cuda-mps-server", used_mib=300),))
    kept = {77}  # the MPS server the kill kept: its 300 MiB are in the allowance
    (gpu,) = leaks.explain(found, {3: "gpu 3 holds 4096 MiB"}, kept)
    assert gpu.leaked and not gpu.by_jobs
    assert gpu.machine == (PERSISTENCED,) and gpu.holders == () and gpu.strays == ()


def test_memory_a_process_holds_is_no_leak_and_the_process_is_named() -> None:
    spared = holder(5, "/dev/nvidia1", why="user bob not in kill_users", user="bob")  # minor 1: gpu 3
    found = look(spared, PERSISTENCED,
                 apps=(ComputeApp(gpu_uuid="GPU-0", pid=9, process_name="/opt/app/bin/serve", used_mib=800),))
    by_gpu = {u.index: u for u in leaks.explain(found, {0: "gpu 0 holds 800 MiB", 3: "gpu 3 holds 4096 MiB"})}
    assert by_gpu[3].holders == (spared,) and not by_gpu[3].leaked
    assert by_gpu[0].strays == found.apps and not by_gpu[0].leaked  # a compute app no device file showed
    verdict = held_verdict(list(by_gpu.values()), Allowance(16), 60)
    assert verdict == (Reason.MEMORY_HELD, "gpu 0 holds 800 MiB (+1 more) after 60 s (threshold 16 MiB), held by"
                                           " pid 9 serve")


def test_memory_held_only_by_a_jobs_processes_names_the_job() -> None:
    job = holder(33, "/dev/nvidia2", why=STEPD_JOB)  # minor 2: gpu 0
    stepd = Holder(pid=20, user="root", name="slurmstepd", exe=b"/usr/sbin/slurmstepd", devices=("/dev/nvidiactl",),
                   protected_by=f"{JOB_PROCESS} (slurmstepd)")
    found = look(job, stepd, PERSISTENCED,
                 apps=(ComputeApp(gpu_uuid="GPU-0", pid=33, process_name="python3", used_mib=30000),),
                 titles={20: "slurmstepd: [4711.0]"})
    unsettled = leaks.explain(found, {0: "gpu 0 holds 30000 MiB"})
    assert [u.by_jobs for u in unsettled] == [True]
    verdict = job_verdict(unsettled, found.titles)
    assert verdict is not None and verdict[0] is Reason.MEMORY_HELD_BY_JOB
    assert verdict[1].startswith("gpu 0 holds 30000 MiB: memory held by Slurm job 4711 (slurmstepd pid 20); ")


def test_a_job_shared_with_any_other_process_is_not_the_jobs_alone() -> None:
    job = holder(33, "/dev/nvidia2", why=STEPD_JOB)
    other = holder(34, "/dev/nvidia2", why="lineage not read past pid 700: may be a Slurm job's process")
    (gpu,) = leaks.explain(look(job, other), {0: "gpu 0 holds 30000 MiB"})
    assert not gpu.by_jobs and job_verdict([gpu], {}) is None
    (na,) = leaks.explain(look(job, rows=(GpuRow(index=0, memory_used_mib=None, uuid="GPU-0", pci_bus_id=BUS[0]),)),
                          {0: "gpu 0 memory.used is not a number"})
    assert not na.by_jobs and not na.leaked  # [N/A]: nobody can say what is held


def test_a_job_is_named_by_what_is_known_of_it() -> None:
    titles = {20: "slurmstepd: [4711.batch]", 21: "slurmstepd: [4713+1.0]"}
    assert leaks.job_label(holder(33, why=STEPD_JOB), titles) == "Slurm job 4711 (slurmstepd pid 20)"
    assert leaks.job_label(holder(33, why=f"{JOB_PROCESS} (slurmstepd pid 21)"), titles) == (
        "Slurm job 4713 (slurmstepd pid 21)")
    assert leaks.job_label(holder(33, why=STEPD_JOB), {}) == "a Slurm job (slurmstepd pid 20)"
    assert leaks.job_label(holder(33, why=CGROUP_JOB), {}) == "Slurm job 4712 (pid 33 python3)"
    stepd = Holder(pid=20, user="root", name="slurmstepd", exe=None, devices=(),
                   protected_by=f"{JOB_PROCESS} (slurmstepd)")
    assert leaks.job_label(stepd, titles) == "Slurm job 4711 (slurmstepd pid 20)"
    jobs = [Unsettled(index=0, problem="gpu 0 holds 1 MiB",
                      holders=(holder(33, why=STEPD_JOB), holder(34, why=STEPD_JOB))),
            Unsettled(index=1, problem="gpu 1 holds 1 MiB", holders=(holder(35, why=CGROUP_JOB),))]
    assert leaks.jobs_holding(jobs, titles) == "Slurm job 4711 (slurmstepd pid 20), Slurm job 4712 (pid 35 python3)"


def test_job_of_reads_back_every_reason_a_job_is_kept_for() -> None:
    assert job_of(holder(33, why=CGROUP_JOB)) == JobRef(side=SLURM, job="4712")
    assert job_of(holder(33, why=STEPD_JOB)) == JobRef(side=SLURM, daemon="slurmstepd", daemon_pid=20)
    assert job_of(holder(20, why=f"{JOB_PROCESS} (slurmstepd)")) == JobRef(side=SLURM, daemon="slurmstepd",
                                                                           daemon_pid=20)
    assert job_of(holder(33, why="protected name nvidia-persistenced")) is None
    assert job_of(holder(33)) is None


def test_the_leaked_line_says_whether_gpu_reset_would_help() -> None:
    alone = Unsettled(index=3, problem="gpu 3 holds 4096 MiB")
    assert f"{leaked_line([alone], 60)}; {reset_advice(GpuReset((3,)))}" == (
        "gpu 3 holds 4096 MiB with no process holding it after 60 s: a leaked context; --gpu-reset can reset it")
    held_open = Unsettled(index=3, problem="gpu 3 holds 4096 MiB", machine=(PERSISTENCED,))
    blocked = GpuReset(blocked="pid 12 nvidia-persistenced (protected name nvidia-persistenced) still hold gpu 3")
    assert f"{leaked_line([held_open, alone], 60)}; {reset_advice(blocked)}" == (
        "gpu 3 holds 4096 MiB with only the machine's own processes holding it (+1 more) after 60 s: a leaked"
        " context; --gpu-reset would be refused: pid 12 nvidia-persistenced (protected name nvidia-persistenced)"
        " still hold gpu 3")


def test_a_reset_is_chosen_by_nvidia_smi_index_and_refused_for_any_holder_of_a_gpu_it_takes() -> None:
    mps = holder(77, "/dev/nvidia1", why="protected name nvidia-cuda-mps-server")  # minor 1: gpu 3
    held = look(mps).holders_by_gpu()
    assert choose_gpu_reset([1], held, False, range(4)) == GpuReset((1,))  # /dev/nvidia1 is not gpu 1
    assert choose_gpu_reset([3], held, False, range(4)).blocked == (
        "pid 77 python3 (protected name nvidia-cuda-mps-server) still hold gpu 3")
    assert choose_gpu_reset([1], held, True, range(4)).blocked == (
        "pid 77 python3 (protected name nvidia-cuda-mps-server) still hold the baseboard's GPUs")
    assert choose_gpu_reset([1], look().holders_by_gpu(), True, range(4)) == GpuReset((0, 1, 2, 3), together=True)
    unread = choose_gpu_reset([1], held, None, range(4)).blocked
    assert unread is not None and unread.startswith("nvidia-smi -q could not be read")
