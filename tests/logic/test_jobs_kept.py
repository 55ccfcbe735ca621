"""A job's processes through the kill and verify steps over a scripted node: never signalled, however deep
below slurmstepd, whatever their parent when their cgroup is a job's; a holder whose lineage was cut is kept
and never makes the node clean. The node answers in the shapes the real commands print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from support import scripted_node

from fleet.inventory.host import Host
from fleet.model.report import Reason, StepStatus
from fleet.node.node import Node
from fleet.node.probes.smi import VERIFY_FIELDS
from fleet.node.probes.units import cgroup_argv
from fleet.reset import kill
from fleet.reset.verify import verify
from fleet.transport.scripted import Reply, ScriptedTransport

HOLDER = 4242
ADOPTED = "/system.slice/slurmstepd.scope/job_4711/step_extern/user/task_special"
START = scripted_node.START


@pytest.fixture(autouse=True)
def quick_respawn_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.reset.kill.RESPAWN_SCANS_S", (0.0,))


Log = scripted_node.Log  # records every event a step logs


def stat(pid: int, ppid: int, comm: str) -> str:
    return f"{pid}\t{ppid}\t{START}\t{comm}\n"


def under_sshd() -> str:
    """The holder's walk: python3 > bash > sshd-session > sshd > init, as an ssh login's is."""
    return stat(HOLDER, 720, "python3") + stat(720, 710, "bash") + stat(710, 700, "sshd-session") + \
        stat(700, 1, "sshd") + stat(1, 0, "systemd")


def under_slurmstepd(levels: int) -> str:
    """The holder `levels` processes below slurmstepd (pid 800), which init started."""
    chain = [800 + i for i in range(1, levels)] + [HOLDER]
    parents = [800, *chain[:-1]]
    return "".join(stat(pid, ppid, "python3") for pid, ppid in zip(chain, parents, strict=True)) + \
        stat(800, 1, "slurmstepd") + stat(1, 0, "systemd")


def cut() -> str:
    """A walk that stopped below the holder's top: its grandparent 719 was never read (it vanished)."""
    return stat(HOLDER, 720, "python3") + stat(720, 719, "bash")


def script(walk: str, cgroups: Mapping[int, str], scans: Sequence[str]) -> ScriptedTransport:
    found = iter(scans)

    def cgroup(argv: Sequence[str]) -> Reply:
        return Reply(stdout="".join(f"/proc/{p}/cgroup:{line}\n" for p, line in cgroups.items()
                                    if f"/proc/{p}/cgroup" in argv))

    return ScriptedTransport(script=[
        (scripted_node.SCAN, lambda argv: Reply(stdout=scripted_node.scan(next(found, "")))),
        (("ps", "-ww"), Reply(stdout=scripted_node.ps(f" {HOLDER}   720 alice    python3 train.py\n"))),
        (scripted_node.EXE, scripted_node.exe_reply({HOLDER: "/usr/bin/python3.11"})),
        (scripted_node.LINEAGE, Reply(stdout=f"self\t900\n{stat(900, 1, 'awk')}{walk}")),
        (("grep",), cgroup),
        (("sh", "-c"), scripted_node.signal()),
        *scripted_node.healthy("00000000:01:00.0"),
        (("nvidia-smi", "--query-gpu=" + ",".join(VERIFY_FIELDS)),
         Reply(stdout="0, GPU-a, 00000000:01:00.0, NVIDIA H100, 0, 81559, 0, Disabled\n")),
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout="")),
        (scripted_node.KERNEL_LOG, scripted_node.kernel_log_reply()),
    ])


def holding() -> str:
    return f"alice\t/proc/{HOLDER}/task/{HOLDER}/fd/3\t/dev/nvidia0\n"


def on(t: ScriptedTransport) -> Node:
    return Node(Host(name="gpu-01", address="127.0.0.1", gpus=1, command_timeout=1.0, kill_grace=0.3), t, Log())


def signalled(t: ScriptedTransport) -> list[tuple[str, ...]]:
    return [argv for argv in t.ran if argv[:2] == ("sh", "-c") and argv[3] == "fleet-signal"]


async def test_a_process_adopted_into_a_job_is_kept_and_named_with_its_job() -> None:
    """pam_slurm_adopt's: parent sshd, cgroup the job's extern step. The cgroup is read in the holders' one
    batch (ps, exe links, lineage, cgroups) and the process is never signalled."""
    t = script(under_sshd(), {HOLDER: f"0::{ADOPTED}"}, [holding()] * 3)
    outcome = await kill.kill(on(t))
    assert outcome.result.status is StepStatus.OK, outcome.result.error
    assert outcome.result.detail == (
        f"no GPU holders to kill; kept pid {HOLDER} python3 (a Slurm job's process (job 4711, cgroup {ADOPTED}))")
    assert signalled(t) == [] and outcome.killed == ()
    assert tuple(cgroup_argv([HOLDER])) in t.ran
    assert HOLDER not in outcome.kept  # kept, but no part of the machine
    assert [(k.pid, k.why) for k in outcome.left_alive] == [
        (HOLDER, f"a Slurm job's process (job 4711, cgroup {ADOPTED})")]  # the report's kept: as data, with why


async def test_the_same_login_without_a_jobs_cgroup_is_killed() -> None:
    """The control: the same ssh login in a session scope is no job's."""
    t = script(under_sshd(), {HOLDER: "0::/user.slice/user-1000.slice/session-3.scope"}, [holding(), ""])
    outcome = await kill.kill(on(t))
    assert [k.pid for k in outcome.killed] == [HOLDER]


@pytest.mark.parametrize("version", ["v2", "v1"])
async def test_a_jobs_process_is_kept_by_its_cgroup_in_either_hierarchy(version: str) -> None:
    lines = {"v2": f"0::{ADOPTED}", "v1": "4:freezer:/slurm/uid_1000/job_4711/step_extern"}
    t = script(under_sshd(), {HOLDER: lines[version]}, [holding()] * 3)
    outcome = await kill.kill(on(t))
    assert "(a Slurm job's process (job 4711, cgroup " in outcome.result.detail
    assert signalled(t) == []


@pytest.mark.parametrize("levels", [8, 9, 12, 50])
async def test_a_jobs_process_deep_below_slurmstepd_is_never_signalled(levels: int) -> None:
    t = script(under_slurmstepd(levels), {}, [holding()] * 3)
    outcome = await kill.kill(on(t))
    assert outcome.result.detail.endswith(f"kept pid {HOLDER} python3 (a Slurm job's process (slurmstepd pid 800))")
    assert signalled(t) == []


async def test_a_holder_whose_lineage_was_cut_is_kept_and_the_node_is_not_clean() -> None:
    """What lies above the cut is unknown: it may be a job. Kept, and verify says the GPU is still held."""
    t = script(cut(), {}, [holding()] * 6)
    node = on(t)
    outcome = await kill.kill(node)
    reason = "lineage not read past pid 720: may be a Slurm job's process"
    assert outcome.result.detail == f"no GPU holders to kill; kept pid {HOLDER} python3 ({reason})"
    assert signalled(t) == []
    checked = await verify(node)
    assert checked.result.status is StepStatus.FAILED
    assert checked.result.reason is Reason.HOLDERS_LEFT
    assert checked.result.error == f"pid {HOLDER} python3 still holds /dev/nvidia0 ({reason})"
