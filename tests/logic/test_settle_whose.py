"""Settle over a scripted node when memory does not come back: a job's processes fail the step at once, a
leaked context is named as one (and `--gpu-reset` resets the right GPU, by minor number, within its own bound),
another process is named. The node answers in the shapes the real commands print (a real `-q` capture)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support import scripted_node

from fleet.inventory.host import Host
from fleet.model.report import Reason, StepStatus
from fleet.node.node import Node
from fleet.node.probes.smi import SETTLE_FIELDS, VERIFY_FIELDS
from fleet.reset import kill, settle
from fleet.transport.scripted import Reply, ScriptedTransport

JOB = 4242  # a job's process, below slurmstepd pid 800
START = scripted_node.START
BUS = ("00000000:01:00.0", "00000000:02:00.0")
MINOR_LINE = "    Minor Number                                       : 0\n"
FABRIC_LINE = "        State                                          : Completed\n"


@pytest.fixture(autouse=True)
def quick_respawn_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.reset.kill.RESPAWN_SCANS_S", (0.0,))


Log = scripted_node.Log  # records every event a step logs


def q(minors: Sequence[int], nvswitch: bool = False) -> str:
    """A real `nvidia-smi -q` (the H200 capture) of one GPU per bus id in BUS, with these minor numbers."""
    head, section = scripted_node.Q_CAPTURE.read_text().split(f"GPU {scripted_node.Q_BUS_ID}\n", 1)
    head = head.replace("Attached GPUs                                          : 1",
                        f"Attached GPUs                                          : {len(minors)}")
    fabric = FABRIC_LINE if nvswitch else FABRIC_LINE.replace("Completed", "N/A")
    return head + "".join(f"GPU {bus}\n" + section.replace(MINOR_LINE, MINOR_LINE.replace("0", str(m)))
                          .replace(FABRIC_LINE, fabric) for bus, m in zip(BUS, minors, strict=False))


def stat(pid: int, ppid: int, comm: str) -> str:
    return f"{pid}\t{ppid}\t{START}\t{comm}\n"


PS = {1: "/sbin/init", JOB: "python3 train.py", 800: "slurmstepd: [4711.0]", 77: "nvidia-cuda-mps-server",
      55: "python3 serve.py"}
WALK = {JOB: stat(JOB, 800, "python3") + stat(800, 1, "slurmstepd"), 77: stat(77, 1, "nvidia-cuda-mps"),
        55: stat(55, 1, "python3")}


def ps(argv: Sequence[str]) -> Reply:
    pids = [int(w) for w in argv[-1].split(",")]  # `-p 1,4242`
    return Reply(stdout="".join(f"{p:>5} {1:>5} root     {PS[p]}\n" for p in sorted({1, *pids}) if p in PS))


def lineage(argv: Sequence[str]) -> Reply:
    asked = scripted_node.pids_after(argv, "self")
    return Reply(stdout=f"self\t900\n{stat(900, 1, 'awk')}" + "".join(WALK[p] for p in asked if p in WALK)
                 + stat(1, 0, "systemd"))


def node(holders: str, memory: Callable[[], Sequence[int]], apps: str = "", minors: Sequence[int] = (0,),
         nvswitch: bool = False, extra: Sequence[tuple[tuple[str, ...], Any]] = (), **host: Any) -> Node:
    """A node with len(minors) GPUs whose memory.used `memory()` says, whose device files `holders` hold (the scan's
    `user<TAB>/proc/PID/fd/N<TAB>device` lines, every time), and whose compute apps are `apps`."""
    def rows(fields: Sequence[str]) -> Callable[[Sequence[str]], Reply]:
        def answer(argv: Sequence[str]) -> Reply:
            used = memory()
            if fields is SETTLE_FIELDS:
                return Reply(stdout="".join(f"{i}, GPU-{i}, {mib}, Disabled\n" for i, mib in enumerate(used)))
            return Reply(stdout="".join(f"{i}, GPU-{i}, {BUS[i]}, NVIDIA H100, {mib}, 81559, 0, Disabled\n"
                                        for i, mib in enumerate(used)))
        return answer

    t = ScriptedTransport(script=[
        *extra,
        (scripted_node.SCAN, Reply(stdout=scripted_node.scan(holders))),
        (("ps", "-ww"), ps),
        (scripted_node.EXE, lambda argv: scripted_node.exe_reply(
            {p: "/usr/bin/python3.11" for p in (JOB, 77, 55) if f"/proc/{p}/exe" in argv})),
        (scripted_node.LINEAGE, lineage),
        (("grep",), Reply(stdout="")),  # cgroups: none a job's (the job is told by its slurmstepd)
        (("nvidia-smi", "--query-gpu=" + ",".join(SETTLE_FIELDS)), rows(SETTLE_FIELDS)),
        (("nvidia-smi", "--query-gpu=" + ",".join(VERIFY_FIELDS)), rows(VERIFY_FIELDS)),
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout=apps)),
        (("nvidia-smi", "-q"), Reply(stdout=q(minors, nvswitch))),
    ])
    settings: dict[str, Any] = {"command_timeout": 1.0, "kill_grace": 0.3, "settle_timeout": 2.0, **host}
    return Node(Host(name="gpu-01", address="127.0.0.1", gpus=len(minors), **settings), t, Log())


def ran(n: Node, *prefix: str) -> list[tuple[str, ...]]:
    assert isinstance(n.transport, ScriptedTransport)
    return [argv for argv in n.transport.ran if argv[:len(prefix)] == prefix]


async def test_memory_held_only_by_a_jobs_processes_fails_at_once_naming_the_job() -> None:
    """Without --slurm: the kill keeps the job's process; settle's first poll sees its memory, one look says only
    the job holds it, and the step fails then, not after settle_timeout (30 s here)."""
    n = node(f"alice\t/proc/{JOB}/task/{JOB}/fd/3\t/dev/nvidia0\n", lambda: [30000],
             apps=f"GPU-0, {JOB}, python3, 30000\n", settle_timeout=30.0)
    killed = await kill.kill(n)
    assert killed.job_pids == {JOB} and killed.kept == frozenset() and killed.killed == ()
    started = time.monotonic()
    outcome = await settle.settle(n, killed.kept, killed.job_pids)
    assert time.monotonic() - started < 15  # half of settle_timeout: it did not wait it out
    result = outcome.result
    assert (result.status, result.reason) == (StepStatus.FAILED, Reason.MEMORY_HELD_BY_JOB)
    assert result.error is not None and result.error.startswith(
        "gpu 0 holds 30000 MiB: memory held by Slurm job 4711 (slurmstepd pid 800); fleet never kills")
    assert len(ran(n, "nvidia-smi", "--query-gpu=" + ",".join(SETTLE_FIELDS))) == 1  # one poll, then the look


async def test_a_job_on_another_gpu_does_not_end_the_wait_for_memory_no_process_holds() -> None:
    """The job holds gpu 1 (free); gpu 0's memory is nobody's: settle waits its window and says it leaked."""
    n = node(f"alice\t/proc/{JOB}/task/{JOB}/fd/3\t/dev/nvidia1\n", lambda: [2048, 0], minors=(0, 1))
    killed = await kill.kill(n)
    outcome = await settle.settle(n, killed.kept, killed.job_pids)
    assert (outcome.result.status, outcome.result.reason) == (StepStatus.TIMEOUT, Reason.MEMORY_LEAKED)
    assert outcome.result.error == (
        "gpu 0 holds 2048 MiB with no process holding it after 2 s: a leaked context; --gpu-reset can reset it")


async def test_memory_that_comes_back_after_the_jobs_look_settles() -> None:
    """Memory still coming back from a killed process while a job holds another GPU's device file: the look
    finds no job holding it, and the wait goes on until it is free."""
    freed = time.monotonic() + 0.5
    n = node(f"alice\t/proc/{JOB}/task/{JOB}/fd/3\t/dev/nvidia1\n", lambda: [0 if time.monotonic() > freed else 900, 0],
             minors=(0, 1), settle_timeout=10.0)
    outcome = await settle.settle(n, (), {JOB})
    assert outcome.result.status is StepStatus.OK, outcome.result.error
    assert set(outcome.settle_s) == {0, 1}


async def test_memory_another_process_holds_is_named() -> None:
    """A process fleet keeps only because kill_users spares its user is someone's work: `memory_held`, named."""
    n = node("bob\t/proc/55/task/55/fd/3\t/dev/nvidia0\n", lambda: [900], kill_users=("alice",))
    killed = await kill.kill(n)
    outcome = await settle.settle(n, killed.kept, killed.job_pids)
    assert outcome.result.reason is Reason.MEMORY_HELD
    assert outcome.result.error == ("gpu 0 holds 900 MiB after 2 s (threshold 16 MiB), held by pid 55 python3"
                                    " (user root not in kill_users)")


async def test_gpu_reset_takes_the_gpu_by_index_where_minor_numbers_differ() -> None:
    """/dev/nvidia0 is gpu 1 here (-q: minor 0 is bus 02): the MPS server holding it does not block a reset of
    gpu 0, whose context leaked; `nvidia-smi -r -i 0` runs, bounded by gpu_reset_timeout, not command_timeout."""
    memory = [2048, 0]

    def reset(argv: Sequence[str]) -> Reply:
        memory[0] = 0
        return Reply(stdout=f"GPU {BUS[0]} was successfully reset.\nAll done.\n", delay_s=1.5)

    n = node("root\t/proc/77/task/77/fd/3\t/dev/nvidia0\n", lambda: memory, minors=(1, 0),
             extra=[(("nvidia-smi", "-r"), reset)], gpu_reset_timeout=4.0)
    killed = await kill.kill(n)
    assert killed.kept == {77}
    outcome = await settle.settle(n, killed.kept, killed.job_pids, gpu_reset=True)
    assert outcome.result.status is StepStatus.OK, outcome.result.error
    assert outcome.result.detail.startswith("reset gpu 0 with nvidia-smi -r; 2 GPUs at or under 16 MiB after it")
    assert ran(n, "nvidia-smi", "-r") == [("nvidia-smi", "-r", "-i", "0")]
    assert isinstance(n.log, Log)
    bounds = [f["timeout_s"] for e, f in n.log.events if e == "command" and f["argv"][:2] == ["nvidia-smi", "-r"]]
    assert bounds == [4.0]


async def test_gpu_reset_is_refused_for_the_gpu_whose_device_file_is_held_and_says_who() -> None:
    """/dev/nvidia1 is gpu 0 (minor 1 is bus 01): the MPS server holds the GPU to reset; nothing is reset."""
    n = node("root\t/proc/77/task/77/fd/3\t/dev/nvidia1\n", lambda: [2048, 0], minors=(1, 0),
             extra=[(("nvidia-smi", "-r"), Reply(stdout="", exit_status=255))])
    killed = await kill.kill(n)
    outcome = await settle.settle(n, killed.kept, killed.job_pids, gpu_reset=True)
    assert (outcome.result.status, outcome.result.reason) == (StepStatus.TIMEOUT, Reason.MEMORY_LEAKED)
    error = outcome.result.error or ""
    assert error.startswith("gpu 0 holds 2048 MiB with only the machine's own processes holding it after 2 s: a"
                            " leaked context; gpu reset refused: pid 77 nvidia-cuda-mps-server (protected name ")
    assert error.endswith(") still hold gpu 0")
    assert ran(n, "nvidia-smi", "-r") == []


async def test_a_gpu_reset_that_does_not_end_within_its_bound_fails_and_says_so() -> None:
    n = node("", lambda: [2048], extra=[(("nvidia-smi", "-r"), Reply(delay_s=5.0))], gpu_reset_timeout=0.5,
             nvswitch=True)
    outcome = await settle.settle(n, gpu_reset=True)
    assert outcome.result.reason is Reason.MEMORY_LEAKED
    assert outcome.result.error is not None and outcome.result.error.endswith(
        "a leaked context; gpu reset failed: nvidia-smi -r did not end within 0.5 s (gpu_reset_timeout)")
    assert ran(n, "nvidia-smi", "-r") == [("nvidia-smi", "-r")]  # an NVSwitch baseboard: all GPUs at once
