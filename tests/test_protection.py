"""Who is left alive and why, which units may be stopped, and what a respawn says (pure rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import InventoryError
from fleet.inventory.host import BUILTIN_PROTECTED, Host
from fleet.inventory.load import load_inventory
from fleet.node.probes import Holder as Found
from fleet.node.probes import Lineage, ProcStat, PsRow
from fleet.reset import policy, protection
from fleet.reset.policy import Holder, ProcessFacts, Rules

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
    ],
)
def test_rules_in_order(pid: int, name: str | None, exe: str | None, reason: str | None) -> None:
    assert judge(pid, name=name, exe=exe) == reason


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


def test_describe_holders_joins_and_judges() -> None:
    found = [Found(pid, "root", ("/dev/nvidia0",)) for pid in (12, 13, 4242, 6000)]
    ps = {12: PsRow(12, 1, "root", "/usr/bin/nvidia-persistenced"), 13: PsRow(13, 12, "root", "helper -d"),
          4242: PsRow(4242, 720, "alice", "python3 train.py")}  # 6000 exited before ps
    facts = ProcessFacts(ps, {4242: "/usr/bin/python3.11"}, LINEAGE, {4242: "train.service"})
    holders = policy.describe_holders(found, facts, Rules.of(Host("h", "h", kill_users=("root",))))
    assert [(h.pid, h.name, h.unit, h.protected_by) for h in holders] == [
        (12, "nvidia-persistenced", None, "protected name nvidia-persistenced"),
        (13, "helper", None, "child of nvidia-persistenced (pid 12)"),
        (4242, "python3", "train.service", "user alice not in kill_users"),
    ]


def test_describe_kill_names_every_holder_left_alive_with_why() -> None:
    kept = [Holder(i, "root", f"d{i}", None, (), f"reason {i}") for i in range(6)]
    detail = policy.describe_kill((), kept, ())
    assert detail == "no GPU holders to kill; kept " + ", ".join(f"pid {i} d{i} (reason {i})" for i in range(6))


# --- respawn -------------------------------------------------------

KILLED = [Holder(4000, "root", "python3", "/usr/bin/python3.11", (), unit="sglang.service"),
          Holder(4001, "root", "trainer", "/opt/trainer", ())]


def back(pid: int, exe: str | None = None, unit: str | None = None, name: str = "python3") -> Holder:
    return Holder(pid, "root", name, exe, ("/dev/nvidia0",), unit=unit)


def test_respawn_by_unit_names_the_unit_and_its_restart_setting() -> None:
    error = policy.kill_error(frozenset(), KILLED, [back(4242, unit="sglang.service")],
                              restart={"sglang.service": "always"})
    assert error == "respawned: pid 4242 python3 (sglang.service, Restart=always); add it to services"


def test_respawn_by_executable_without_a_unit() -> None:
    error = policy.kill_error(frozenset(), KILLED, [back(4243, exe="/opt/trainer", name="trainer")])
    assert error == "respawned: pid 4243 trainer (no systemd unit); stop what restarts it"


def test_respawn_of_a_unit_in_services_says_something_starts_it() -> None:
    error = policy.kill_error(frozenset(), KILLED, [back(4242, unit="sglang.service")], services=("sglang.service",))
    assert error == "respawned: pid 4242 python3 (sglang.service); it is in services, yet something starts it again"


def test_several_respawned_are_counted() -> None:
    again = [back(p, unit="sglang.service") for p in (1, 2, 3)] + [back(4, exe="/opt/trainer", name="trainer")]
    error = policy.kill_error(frozenset(), KILLED, again, restart={"sglang.service": "on-failure"})
    assert error == ("respawned: pid 1 python3 (sglang.service, Restart=on-failure), pid 2 python3 "
                     "(sglang.service, Restart=on-failure) and 2 more; add it to services")


def test_a_stranger_after_the_kill_is_a_new_holder() -> None:
    error = policy.kill_error(frozenset(), KILLED, [back(5000, exe="/usr/bin/perl", unit="other.service")])
    assert error == "new GPU holders after kill: pid 5000 python3"
    assert policy.split_back([back(4000, unit="sglang.service")], KILLED) == ([], [])  # a target still dying


def test_survivors_come_before_respawns() -> None:
    assert policy.kill_error(frozenset({4001}), KILLED, [back(1, unit="sglang.service")]) == (
        "survived SIGKILL: pid 4001 trainer")


# --- units stop_units may stop ------------------------------------------------


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
