"""Who is left alive and why, which units may be stopped, and what a process is called (pure rules)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from support.lineages import LINEAGE, STATS

from fleet.inventory.host import BUILTIN_PROTECTED, Host
from fleet.inventory.load import load_inventory
from fleet.model.errors import InventoryError
from fleet.node.probes.jobs import JobCgroup
from fleet.node.probes.lineage import Lineage, ProcStat
from fleet.node.probes.procs import Identity, PsRow
from fleet.reset import protection
from fleet.reset.protection import Holder, ProcessFacts, Rules, full_name, is_protected, is_sshd

RULES = Rules(BUILTIN_PROTECTED)


def as_bytes(exe: str | None) -> bytes | None:
    """An executable path as the exe lookup gives it: bytes."""
    return None if exe is None else os.fsencode(exe)


def judge(pid: int, user: str = "root", name: str | None = None, exe: str | None = None, rules: Rules = RULES,
          args: str = "", lineage: Lineage = LINEAGE, jobs: Mapping[int, JobCgroup] | None = None) -> str | None:
    """Why pid is kept; a pid the lineage does not know is a child of init, read whole."""
    comm = lineage.procs[pid].comm if pid in lineage.procs else (name or "python3")
    if pid not in lineage.procs:
        lineage = Lineage({**lineage.procs, pid: ProcStat(pid=pid, ppid=1, comm=comm)}, lineage.own)
    holder = Holder(pid=pid, user=user, name=name or comm, exe=as_bytes(exe), devices=("/dev/nvidia0",), comm=comm)
    facts = ProcessFacts(ps={pid: PsRow(pid=pid, ppid=1, user=user, args=args)}, exe={}, lineage=lineage,
                         jobs=jobs or {})
    return protection.protected_by(holder, facts, rules)


@pytest.mark.parametrize(
    ("pid", "name", "exe", "reason"),
    [
        (1, None, None, "pid 1"),
        (970, None, None, "fleet's own session"),
        (710, None, None, "sshd"),
        (5000, "sshd-auth", None, "sshd"),
        (5001, "x", "/usr/lib/openssh/sshd-session", "sshd"),
        (12, "nvidia-persistenced", None, "protected name nvidia-persistenced"),
        (13, None, None, "child of nvidia-persistenced (pid 12)"),
        (14, None, None, "child of nvidia-persistenced (pid 12)"),
        (21, None, None, "child of nv-hostengine (pid 20)"),
        (4242, None, None, None),  # a job started over ssh: sshd's descendants are fair game
        (910, None, None, None),  # a user service under `systemd --user`
        (5002, "python3", "/usr/bin/python3.11", None),
        (800, None, None, "a Slurm job's process (slurmstepd)"),
        (830, None, None, "a Slurm job's process (slurmstepd pid 800)"),  # the job's worker, three levels down
    ],
)
def test_rules_in_order(pid: int, name: str | None, exe: str | None, reason: str | None) -> None:
    assert judge(pid, name=name, exe=exe) == reason


def test_a_jobs_process_is_kept_but_is_not_part_of_the_machine() -> None:
    """Kept in any mode (a reset never kills a job), yet the memory it holds keeps the node from being clean."""
    reason = judge(830)
    job = Holder(pid=830, user="alice", name="python3", exe=None, devices=("/dev/nvidia0",), protected_by=reason)
    daemon = Holder(pid=12, user="root", name="nvidia-persistenced", exe=None, devices=("/dev/nvidiactl",),
                    protected_by=judge(12))
    assert not job.part_of_the_machine and daemon.part_of_the_machine


def test_kill_users_keeps_other_users_processes_and_says_whose() -> None:
    rules = Rules(BUILTIN_PROTECTED, kill_users=("root", "bench"))
    assert judge(4242, user="alice", rules=rules) == "user alice not in kill_users"
    assert judge(4242, user="bench", rules=rules) is None
    assert judge(4242, user="alice") is None  # unset: any user
    assert judge(12, user="nvidia", rules=rules) == "protected name nvidia-persistenced"  # names come first


def test_protected_name_of_a_helper_comes_from_its_full_name() -> None:
    """An ancestor that is itself a holder is matched on its full name (argv[0]), not only its comm."""
    stats = {**STATS, 30: ProcStat(pid=30, ppid=1, comm="my-inference-su"),
             31: ProcStat(pid=31, ppid=30, comm="python3")}
    ps = {30: PsRow(pid=30, ppid=1, user="root", args="/opt/bin/my-inference-supervisor --port 80"),
          31: PsRow(pid=31, ppid=30, user="root", args="python3")}
    found = ProcessFacts(ps=ps, exe={}, lineage=Lineage(stats))
    rules = Rules(("my-inference-supervisor",))
    assert protection.protected_ancestor(31, found, rules.protected_names) == ("my-inference-supervisor", 30)


def chain(top: int, levels: int, comm: str = "python3") -> dict[int, ProcStat]:
    """`levels` processes below pid `top`: top+1 is its child, top+2 its grandchild, ..."""
    return {top + i: ProcStat(pid=top + i, ppid=top + i - 1, comm=comm) for i in range(1, levels + 1)}


def below(daemon: str, levels: int, top: int = 5000) -> Lineage:
    """init > `daemon` (pid `top`) > `levels` processes, the deepest at pid top + levels."""
    return Lineage({**STATS, top: ProcStat(pid=top, ppid=1, comm=daemon), **chain(top, levels)}, LINEAGE.own)


@pytest.mark.parametrize("levels", [1, 8, 9, 12, 40])
def test_a_jobs_process_is_kept_however_deep(levels: int) -> None:
    """slurmstepd anywhere in the lineage read: container, conda, torchrun and DataLoader nesting reach 9 and
    more (a job's GPU process 12 levels below slurmstepd was SIGTERMed when only 8 were looked at)."""
    reason = judge(5000 + levels, user="alice", lineage=below("slurmstepd", levels))
    assert reason == "a Slurm job's process (slurmstepd pid 5000)"
    kept = Holder(pid=5000 + levels, user="alice", name="python3", exe=None, devices=(), protected_by=reason)
    assert not kept.part_of_the_machine and not kept.lineage_unread


def test_a_jobs_process_is_kept_whatever_kill_users_says() -> None:
    """kill_users names whose processes may be killed: never a job's, however deep."""
    rules = Rules(BUILTIN_PROTECTED, kill_users=("alice",))
    assert judge(5012, user="alice", rules=rules, lineage=below("slurmstepd", 12)) == (
        "a Slurm job's process (slurmstepd pid 5000)")
    assert judge(5012, user="alice", rules=rules, lineage=below("bash", 12)) is None
    assert judge(5012, user="bob", rules=rules, lineage=below("bash", 12)) == "user bob not in kill_users"


def test_a_job_above_an_sshd_or_a_systemd_is_still_the_jobs() -> None:
    """Protected names are not inherited past sshd or systemd (every session descends from them); a job is: a
    job that runs its own sshd or init (a container) is still the job."""
    stats = {**STATS, 5000: ProcStat(pid=5000, ppid=1, comm="slurmstepd"),
             5001: ProcStat(pid=5001, ppid=5000, comm="sshd"),
             **chain(5001, 10), 6000: ProcStat(pid=6000, ppid=1, comm="nv-hostengine"),
             6001: ProcStat(pid=6001, ppid=6000, comm="sshd"), 6002: ProcStat(pid=6002, ppid=6001, comm="python3")}
    lineage = Lineage(stats, LINEAGE.own)
    assert judge(5011, lineage=lineage) == "a Slurm job's process (slurmstepd pid 5000)"
    assert judge(6002, lineage=lineage) is None


@pytest.mark.parametrize("levels", [1, 9, 30])
def test_a_protected_daemons_children_are_kept_however_deep(levels: int) -> None:
    assert judge(5000 + levels, lineage=below("nv-hostengine", levels)) == "child of nv-hostengine (pid 5000)"
    found = ProcessFacts(ps={}, exe={}, lineage=below("nv-hostengine", levels))
    assert protection.protected_ancestor(5000 + levels, found, BUILTIN_PROTECTED) == ("nv-hostengine", 5000)
    assert protection.protected_ancestor(5000 + levels, found, ("other",)) is None


def test_a_cut_lineage_is_never_no_job() -> None:
    """A lineage whose top the walk never reached (its depth ran out, a parent vanished mid-walk) may hide a
    slurmstepd above the cut: the holder is kept, says where the read stopped, and is nobody's machine."""
    # 5000 never read
    cut = Lineage({5001: ProcStat(pid=5001, ppid=5000, comm="python3"), **chain(5001, 40)}, LINEAGE.own)
    reason = judge(5041, user="alice", lineage=cut)
    assert reason == "lineage not read past pid 5001: may be a Slurm job's process"
    kept = Holder(pid=5041, user="alice", name="python3", exe=None, devices=(), protected_by=reason)
    assert kept.lineage_unread and not kept.part_of_the_machine
    rules = Rules(BUILTIN_PROTECTED, kill_users=("alice",))
    assert judge(5041, user="alice", rules=rules, lineage=cut) == reason  # kill_users never reads it as "no job"
    assert judge(5041, name="nv-hostengine", lineage=cut) == reason  # nor does a protected name make it the machine


def test_a_cut_lineage_still_finds_a_job_below_the_cut() -> None:
    """What was read is judged: a slurmstepd below the cut makes it a job's process."""
    cut = Lineage({5000: ProcStat(pid=5000, ppid=4999, comm="slurmstepd"), **chain(5000, 12)}, LINEAGE.own)
    assert judge(5012, lineage=cut) == "a Slurm job's process (slurmstepd pid 5000)"


def test_a_holder_the_walk_did_not_read_is_kept() -> None:
    """Its own stat unread (it exited mid-walk, or the walk failed for it): nothing is known above it."""
    holder = Holder(pid=7777, user="alice", name="python3", exe=None, devices=("/dev/nvidia0",), comm="python3")
    facts = ProcessFacts(ps={7777: PsRow(pid=7777, ppid=1, user="alice", args="python3")}, exe={}, lineage=LINEAGE)
    assert protection.protected_by(holder, facts, RULES) == (
        "lineage not read past pid 7777: may be a Slurm job's process")


def test_a_lineage_that_loops_is_cut() -> None:
    """Pids reused mid-walk can make the chain read loop: never walked forever, never whole."""
    loop = Lineage({5001: ProcStat(pid=5001, ppid=5002, comm="python3"),
                    5002: ProcStat(pid=5002, ppid=5001, comm="bash")}, LINEAGE.own)
    assert judge(5001, lineage=loop) == "lineage not read past pid 5002: may be a Slurm job's process"


# The cgroup paths of a job's processes as Slurm makes them (fleet/node/probes/jobs.py names the source).
V2_EXTERN = "/system.slice/slurmstepd.scope/job_4711/step_extern/user/task_special"
V1_EXTERN = "/slurm/uid_1000/job_4711/step_extern"


@pytest.mark.parametrize("path", [V2_EXTERN, V1_EXTERN])
def test_a_process_adopted_into_a_job_is_the_jobs_whatever_its_parent(path: str) -> None:
    """pam_slurm_adopt puts an ssh login to a node where the user has a job into the job's extern step: its
    parent is sshd, its cgroup names the job. It is named with its job id and kept, nobody's machine."""
    jobs = {4242: JobCgroup("4711", path, "slurm")}
    reason = judge(4242, user="alice", jobs=jobs)  # python3 > bash > sshd-session > sshd: no slurmstepd above
    assert reason == f"a Slurm job's process (job 4711, cgroup {path})"
    assert not Holder(pid=4242, user="alice", name="python3", exe=None, devices=(),
                      protected_by=reason).part_of_the_machine
    rules = Rules(BUILTIN_PROTECTED, kill_users=("alice",))
    assert judge(4242, user="alice", rules=rules, jobs=jobs) == reason
    # whatever it is called: an MPS server a job started is the job's, not the machine's
    assert judge(5003, name="nvidia-cuda-mps-server", jobs={5003: JobCgroup("4711", path, "slurm")}) == (
        f"a Slurm job's process (job 4711, cgroup {path})")
    # its cgroup names the job even where its lineage was cut
    cut = Lineage({5001: ProcStat(pid=5001, ppid=5000, comm="python3")}, LINEAGE.own)
    assert judge(5001, lineage=cut, jobs={5001: JobCgroup("4711", path, "slurm")}) == (
        f"a Slurm job's process (job 4711, cgroup {path})")


# --- units stop_units may stop ------------------------------------------------


def back(pid: int, exe: str | None = None, unit: str | None = None, name: str = "python3") -> Holder:
    return Holder(pid=pid, user="root", name=name, exe=as_bytes(exe), devices=("/dev/nvidia0",), unit=unit)


@pytest.mark.parametrize(
    ("unit", "reason"),
    [
        ("ssh.service", "sshd"),
        ("sshd.service", "sshd"),
        ("sshd@3-10.0.0.1:22.service", "sshd"),
        ("bench.service", "fleet's own session"),
        ("nvidia-persistenced.service", "protected name nvidia-persistenced"),
        ("dcgm.service", "it runs pid 20 nv-hostengine (protected name nv-hostengine)"),
        ("trainer.service", None),
    ],
)
def test_unit_protected_by(unit: str, reason: str | None) -> None:
    kept = [Holder(pid=20, user="root", name="nv-hostengine", exe=None, devices=(),
                   protected_by="protected name nv-hostengine", unit="dcgm.service")]
    assert protection.unit_protected_by(unit, kept, {"bench.service"}, BUILTIN_PROTECTED) == reason


def test_units_to_stop_are_known_unprotected_and_not_in_services() -> None:
    respawned = [back(1, unit="trainer.service"), back(2, unit="trainer.service"), back(3),
                 back(4, unit="sglang.service"), back(5, unit="bench.service"), back(6, unit="ssh.service")]
    units = protection.units_to_stop(respawned, [], {"bench.service"}, RULES, services=("sglang.service",))
    assert units == ("trainer.service",)


# --- the kill_users variable ------------------------------------------------


def test_kill_users_in_the_inventory(tmp_path: Path) -> None:
    """Merged like any list variable, every name a valid user name; unset means any user."""
    path = tmp_path / "inv.yaml"
    path.write_text("defaults: {kill_users: [root]}\nhosts: {n1: null, n2: {kill_users: [bench, svc-ml]}}\n")
    hosts = load_inventory(path).hosts
    assert (hosts["n1"].kill_users, hosts["n2"].kill_users) == (("root",), ("bench", "svc-ml"))
    assert Host(name="n3", address="n3").kill_users == ()
    path.write_text("hosts: {n1: {kill_users: ['alice;reboot']}}\n")
    with pytest.raises(InventoryError, match=r"inv\.yaml: hosts\.n1\.kill_users\[0\]: invalid user name"):
        load_inventory(path)


# --- names: a process's full name, protected names, sshd -------------------------------------------------------


def test_job_daemons_are_protected_because_their_scheduler_names_them() -> None:
    """The core's list names no scheduler; each registered one's job daemons join a host's rules (Slurm's
    slurmstepd), so a respawned holder's `slurmstepd.scope` is never stopped."""
    assert "slurmstepd" not in BUILTIN_PROTECTED
    rules = Rules.of(Host(name="h", address="h", protected=("mine",)))
    assert rules.protected_names == (*BUILTIN_PROTECTED, "mine", "slurmstepd")
    reason = protection.unit_protected_by("slurmstepd.scope", [], (), rules.protected_names)
    assert reason == "protected name slurmstepd"


def test_nvidia_imex_is_protected_by_default() -> None:
    """The IMEX daemon (multi-node NVLink memory export) holds the GPUs on GB200/H200 NVL nodes."""
    assert "nvidia-imex" in BUILTIN_PROTECTED
    assert "nvidia-imex" in Host(name="h", address="h").protected_names
    assert judge(5003, name="nvidia-imex", exe="/usr/bin/nvidia-imex") == "protected name nvidia-imex"


def test_a_holders_identity_is_its_pid_start_exe_and_the_owner_of_its_fd_table() -> None:
    holder = Holder(pid=4242, user="alice", name="python3", exe=b"/usr/bin/python3.11", devices=(), start=9001,
                    owner="alice")
    assert holder.identity() == Identity(pid=4242, start=9001, exe=b"/usr/bin/python3.11", user="alice")
    assert Holder(pid=4242, user="alice", name="python3", exe=None, devices=(),
                  start=9001).identity() == Identity(pid=4242, start=9001, exe=None, user="alice")
    # the scan's owner (find prints a number for a user with no name) is what is checked
    assert Holder(pid=4242, user="alice", name="python3", exe=None, devices=(), start=9001,
                  owner="1000").identity() == Identity(pid=4242, start=9001, exe=None, user="1000")
    assert Holder(pid=4242, user="alice", name="python3", exe=None,
                  devices=()).identity() is None  # start time unknown: no signal at all


@pytest.mark.parametrize("name", BUILTIN_PROTECTED)
def test_builtin_names_match_full_and_kernel_cut_comm(name: str) -> None:
    assert is_protected(name, None, BUILTIN_PROTECTED) == name
    matched = is_protected(name[:15], None, BUILTIN_PROTECTED)
    assert matched is not None
    assert matched[:15] == name[:15]


@pytest.mark.parametrize(
    ("comm", "exe", "names", "expected"),
    [
        ("nvidia-persiste", None, ("nvidia-persistenced",), "nvidia-persistenced"),
        ("nvidia-persiste", None, ("nvidia",), None),
        ("nvidia", None, ("nvidia-persistenced",), None),
        ("nvidia-persist", None, ("nvidia-persistenced",), None),
        ("nvidia-persistenced", None, ("nvidia-persiste",), None),
        ("nv-hostengine", None, ("nv-hostengine",), "nv-hostengine"),
        ("python3", "/usr/bin/python3.11", BUILTIN_PROTECTED, None),
        ("python3", None, BUILTIN_PROTECTED, None),
        ("sshd-session", "/usr/lib/openssh/sshd-session", ("sshd",), None),
        ("exporter", "/usr/bin/dcgm-exporter", BUILTIN_PROTECTED, "dcgm-exporter"),
        ("exporter", "/usr/bin/dcgm-exporter (deleted)", ("dcgm-exporter",), "dcgm-exporter"),
        ("trainer", "", ("trainer-x",), None),
        ("my-daemon", None, ("other", "my-daemon"), "my-daemon"),
    ],
)
def test_is_protected(comm: str, exe: str | None, names: tuple[str, ...], expected: str | None) -> None:
    assert is_protected(comm, as_bytes(exe), names) == expected


@pytest.mark.parametrize(
    ("comm", "argv0", "exe", "name"),
    [
        ("nvidia-persiste", "nvidia-persistenced", "/usr/bin/nvidia-persistenced", "nvidia-persistenced"),
        ("nvidia-persiste", None, "/usr/bin/nvidia-persistenced (deleted)", "nvidia-persistenced"),
        ("nv-fabricmanage", "nv-fabricmanager", None, "nv-fabricmanager"),
        ("nvidia-persiste", "python3", "/usr/bin/python3.11", "nvidia-persiste"),  # cut, origin unknown
        ("python3", "python3.11", "/usr/bin/python3.11", "python3"),  # not cut: comm is the name
        ("my-daemon", "my-daemon-with-a-long-name", None, "my-daemon"),  # 9 characters: never cut
        ("nvidia-persiste", "nvidia-persiste", None, "nvidia-persiste"),
    ],
)
def test_full_name_uncuts_comm_from_argv0_or_exe(comm: str, argv0: str | None, exe: str | None, name: str) -> None:
    assert full_name(comm, argv0, as_bytes(exe)) == name


@pytest.mark.parametrize(
    ("comm", "exe", "name", "names", "expected"),
    [
        ("nvidia-persiste", None, "nvidia-persistenced", ("nvidia-persistenced",), "nvidia-persistenced"),
        ("exporter", None, "dcgm-exporter", BUILTIN_PROTECTED, "dcgm-exporter"),  # comm renamed, argv0 tells
        ("python3", "/usr/bin/python3.11", "python3", ("python3.1",), None),
        ("my-inference-su", None, "my-inference-supervisor", ("my-inference-supervisor",), "my-inference-supervisor"),
        ("train", None, "trainer", ("train-x", "trainer-x"), None),
    ],
)
def test_is_protected_by_full_name(
    comm: str, exe: str | None, name: str, names: tuple[str, ...], expected: str | None
) -> None:
    assert is_protected(comm, as_bytes(exe), names, name) == expected


@pytest.mark.parametrize(
    ("comm", "exe", "name", "expected"),
    [
        ("sshd", "/usr/sbin/sshd", "sshd:", True),
        ("sshd-session", "/usr/lib/openssh/sshd-session", "sshd-session", True),
        ("sshd-auth", None, None, True),
        ("x", "/usr/lib/openssh/sshd-session", None, True),
        ("sshd-keygen", "/usr/libexec/openssh/sshd-keygen", "sshd-keygen", False),
        ("python3", "/usr/bin/python3", "python3", False),
    ],
)
def test_is_sshd_knows_every_name_of_openssh(comm: str, exe: str | None, name: str | None, expected: bool) -> None:
    assert is_sshd(comm, as_bytes(exe), name) is expected
