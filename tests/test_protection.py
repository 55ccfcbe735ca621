"""Who is left alive and why, which units may be stopped, and what a process is called (pure rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import InventoryError
from fleet.inventory.host import BUILTIN_PROTECTED, Host
from fleet.inventory.load import load_inventory
from fleet.node.probes.lineage import Lineage, ProcStat
from fleet.node.probes.procs import Identity, PsRow
from fleet.reset import protection
from fleet.reset.protection import Holder, ProcessFacts, Rules, full_name, is_protected, is_sshd

RULES = Rules(BUILTIN_PROTECTED)
# The node: init (1), sshd (700) > sshd-session (710) > bash (720) > python3 (4242, alice's job);
# nvidia-persistenced (12) > helper (13) > its worker (14); nv-hostengine (20, not a holder here);
# a user manager `systemd --user` (900) > a user service (910); fleet's probe (990) > timeout (980) >
# the job that ran fleet (970, a holder) > bash (960) > sshd-session (711) > sshd (700).
STATS = {
    1: ProcStat(1, 0, "systemd"),
    700: ProcStat(700, 1, "sshd"),
    710: ProcStat(710, 700, "sshd-session"),
    720: ProcStat(720, 710, "bash"),
    4242: ProcStat(4242, 720, "python3"),
    12: ProcStat(12, 1, "nvidia-persiste"),
    13: ProcStat(13, 12, "helper"),
    14: ProcStat(14, 13, "worker"),
    20: ProcStat(20, 1, "nv-hostengine"),
    21: ProcStat(21, 20, "dcgm-job"),
    900: ProcStat(900, 1, "systemd"),
    910: ProcStat(910, 900, "python3"),
    711: ProcStat(711, 700, "sshd-session"),
    960: ProcStat(960, 711, "bash"),
    970: ProcStat(970, 960, "bench"),
    980: ProcStat(980, 970, "timeout"),
    990: ProcStat(990, 980, "awk"),
    800: ProcStat(800, 1, "slurmstepd"),
    810: ProcStat(810, 800, "bash"),
    820: ProcStat(820, 810, "torchrun"),
    830: ProcStat(830, 820, "python3"),
}
LINEAGE = Lineage(STATS, own=(990, 980, 970, 960, 711, 700, 1))


def judge(pid: int, user: str = "root", name: str | None = None, exe: str | None = None, rules: Rules = RULES,
          args: str = "") -> str | None:
    comm = STATS[pid].comm if pid in STATS else (name or "python3")
    holder = Holder(pid, user, name or comm, exe, ("/dev/nvidia0",), comm=comm)
    return protection.protected_by(holder, ProcessFacts({pid: PsRow(pid, 1, user, args)}, {}, LINEAGE), rules)


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
    job = Holder(830, "alice", "python3", None, ("/dev/nvidia0",), protected_by=reason)
    daemon = Holder(12, "root", "nvidia-persistenced", None, ("/dev/nvidiactl",), protected_by=judge(12))
    assert not job.part_of_the_machine and daemon.part_of_the_machine


def test_kill_users_keeps_other_users_processes_and_says_whose() -> None:
    rules = Rules(BUILTIN_PROTECTED, kill_users=("root", "bench"))
    assert judge(4242, user="alice", rules=rules) == "user alice not in kill_users"
    assert judge(4242, user="bench", rules=rules) is None
    assert judge(4242, user="alice") is None  # unset: any user
    assert judge(12, user="nvidia", rules=rules) == "protected name nvidia-persistenced"  # names come first


def test_protected_name_of_a_helper_comes_from_its_full_name() -> None:
    """An ancestor that is itself a holder is matched on its full name (argv[0]), not only its comm."""
    stats = {**STATS, 30: ProcStat(30, 1, "my-inference-su"), 31: ProcStat(31, 30, "python3")}
    ps = {30: PsRow(30, 1, "root", "/opt/bin/my-inference-supervisor --port 80"), 31: PsRow(31, 30, "root", "python3")}
    found = ProcessFacts(ps, {}, Lineage(stats))
    rules = Rules(("my-inference-supervisor",))
    assert protection.protected_ancestor(31, found, rules.protected_names) == ("my-inference-supervisor", 30)


def test_inheritance_is_bounded() -> None:
    chain = {i: ProcStat(i, i - 1, f"p{i}") for i in range(101, 120)}
    stats = {100: ProcStat(100, 1, "nv-hostengine"), 1: ProcStat(1, 0, "systemd"), **chain}
    found = ProcessFacts({}, {}, Lineage(stats))
    assert protection.protected_ancestor(100 + protection.ANCESTRY_DEPTH, found, BUILTIN_PROTECTED) == (
        "nv-hostengine", 100)
    assert protection.protected_ancestor(101 + protection.ANCESTRY_DEPTH, found, BUILTIN_PROTECTED) is None


# --- units stop_units may stop ------------------------------------------------


def back(pid: int, exe: str | None = None, unit: str | None = None, name: str = "python3") -> Holder:
    return Holder(pid, "root", name, exe, ("/dev/nvidia0",), unit=unit)


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
    kept = [Holder(20, "root", "nv-hostengine", None, (), "protected name nv-hostengine", unit="dcgm.service")]
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
    assert Host("n3", "n3").kill_users == ()
    path.write_text("hosts: {n1: {kill_users: ['alice;reboot']}}\n")
    with pytest.raises(InventoryError, match=r"inv\.yaml: hosts\.n1\.kill_users\[0\]: invalid user name"):
        load_inventory(path)


# --- names: a process's full name, protected names, sshd -------------------------------------------------------


def test_nvidia_imex_is_protected_by_default() -> None:
    """The IMEX daemon (multi-node NVLink memory export) holds the GPUs on GB200/H200 NVL nodes."""
    assert "nvidia-imex" in BUILTIN_PROTECTED
    assert "nvidia-imex" in Host("h", "h").protected_names
    assert judge(5003, name="nvidia-imex", exe="/usr/bin/nvidia-imex") == "protected name nvidia-imex"


def test_a_holders_identity_is_its_pid_start_exe_and_the_owner_of_its_fd_table() -> None:
    holder = Holder(4242, "alice", "python3", "/usr/bin/python3.11", (), start=9001, owner="alice")
    assert holder.identity() == Identity(4242, 9001, "/usr/bin/python3.11", "alice")
    assert Holder(4242, "alice", "python3", None, (), start=9001).identity() == Identity(4242, 9001, None, "alice")
    assert Holder(4242, "alice", "python3", None, (), start=9001, owner="1000").identity() == Identity(
        4242, 9001, None, "1000")  # the scan's owner (find prints a number for a user with no name) is what is checked
    assert Holder(4242, "alice", "python3", None, ()).identity() is None  # start time unknown: no signal at all


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
    assert is_protected(comm, exe, names) == expected


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
    assert full_name(comm, argv0, exe) == name


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
    assert is_protected(comm, exe, names, name) == expected


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
    assert is_sshd(comm, exe, name) is expected
