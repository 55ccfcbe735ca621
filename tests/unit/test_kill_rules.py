"""The kill step's pure part: which signal each target needed, what it says, and what a respawn says."""

from __future__ import annotations

from fleet.reset.kill import Signalled, describe_kill, kill_error, killed_records, split_back
from fleet.reset.protection import Holder


def test_killed_records_name_the_last_signal_needed() -> None:
    targets = [Holder(pid=p, user="root", name="python3", exe=None, devices=(), start=100 + p) for p in (1, 2, 3)]
    term = Signalled(survivors=frozenset({2, 3}), sent=frozenset({1, 2, 3}))
    kill9 = Signalled(survivors=frozenset({3}), sent=frozenset({2, 3}))
    records = killed_records(targets, term, kill9)
    assert [(r.pid, r.signal) for r in records] == [(1, "SIGTERM"), (2, "SIGKILL")]
    assert kill_error(frozenset({3}), targets, []) == "survived SIGKILL: pid 3 python3"


def test_killed_means_signalled() -> None:
    """A target that was gone, or someone else, when its SIGTERM was due was never signalled: not killed, and
    said so; one that died between its SIGTERM and its SIGKILL was killed by the SIGTERM."""
    targets = [Holder(pid=p, user="root", name="python3", exe=None, devices=(), start=100 + p) for p in (1, 2, 3, 4)]
    term = Signalled(survivors=frozenset({4}), sent=frozenset({1, 4}), missed={2: "gone", 3: "changed"})
    kill9 = Signalled(survivors=frozenset(), missed={4: "gone"})
    assert [(r.pid, r.signal) for r in killed_records(targets, term, kill9)] == [(1, "SIGTERM"), (4, "SIGTERM")]
    missed = [(targets[1], "gone"), (targets[2], "changed")]
    assert describe_kill(killed_records(targets, term, kill9), [], [], missed) == (
        "killed 2 (2 on SIGTERM, 0 on SIGKILL); not signalled pid 2 python3 (gone before its signal), "
        "pid 3 python3 (another process has its pid now)")


def test_new_holder_after_kill_is_an_error() -> None:
    targets = [Holder(pid=1, user="root", name="python3", exe=None, devices=())]
    after = [Holder(pid=2, user="root", name="python3", exe=None, devices=())]
    assert kill_error(frozenset(), targets, after) == "new GPU holders after kill: pid 2 python3"


def test_a_kill_the_node_refused_says_how_to_fix_it() -> None:
    targets = [Holder(pid=7, user="bob", name="python3", exe=None, devices=(), start=700)]
    error = kill_error(frozenset({7}), targets, [], denied=frozenset({7}))
    assert error == "not permitted to kill pid 7 python3: run as root or set become: true"


def test_only_the_pids_whose_kill_was_refused_are_named_as_refused() -> None:
    """signal.sh says per process what it did: a refusal names just those pids, before any other survivor."""
    targets = [Holder(pid=7, user="bob", name="python3", exe=None, devices=(), start=700),
               Holder(pid=8, user="root", name="trainer", exe=None, devices=(), start=800),
               Holder(pid=9, user="bob", name="python3", exe=None, devices=(), start=900)]
    error = kill_error(frozenset({7, 8, 9}), targets, [], denied=frozenset({7, 9}))
    assert error == "not permitted to kill pid 7 python3, pid 9 python3: run as root or set become: true"
    assert kill_error(frozenset({8}), targets, [], denied=frozenset({7})) == "survived SIGKILL: pid 8 trainer"


def test_a_survivor_whose_start_time_is_unknown_was_never_signalled() -> None:
    """Without its start time fleet cannot tell the process from a later one with its pid: it is left alone,
    and the error says so (it did not survive SIGKILL: it never got one)."""
    targets = [Holder(pid=7, user="bob", name="python3", exe=None, devices=(), start=700),
               Holder(pid=8, user="root", name="trainer", exe=None, devices=())]
    assert targets[1].identity() is None
    assert kill_error(frozenset({8}), targets, []) == (
        "not signalled, its start time could not be read (who it is is unknown): pid 8 trainer")
    assert kill_error(frozenset({7, 8}), targets, [], denied=frozenset({7})) == (
        "not permitted to kill pid 7 python3: run as root or set become: true")


def test_describe_kill_names_every_holder_left_alive_with_why() -> None:
    kept = [Holder(pid=i, user="root", name=f"d{i}", exe=None, devices=(),
                   protected_by=f"reason {i}") for i in range(6)]
    detail = describe_kill((), kept, ())
    assert detail == "no GPU holders to kill; kept " + ", ".join(f"pid {i} d{i} (reason {i})" for i in range(6))


# --- respawn -------------------------------------------------------

KILLED = [Holder(pid=4000, user="root", name="python3", exe=b"/usr/bin/python3.11", devices=(), unit="sglang.service",
                 start=9000),
          Holder(pid=4001, user="root", name="trainer", exe=b"/opt/trainer", devices=(), start=9001)]


def back(pid: int, exe: str | None = None, unit: str | None = None, name: str = "python3") -> Holder:
    return Holder(pid=pid, user="root", name=name, exe=None if exe is None else exe.encode(), devices=("/dev/nvidia0",),
                  unit=unit)


def test_respawn_by_unit_names_the_unit_and_its_restart_setting() -> None:
    error = kill_error(frozenset(), KILLED, [back(4242, unit="sglang.service")], restart={"sglang.service": "always"})
    assert error == "respawned: pid 4242 python3 (sglang.service, Restart=always); add it to services"


def test_respawn_by_executable_without_a_unit() -> None:
    error = kill_error(frozenset(), KILLED, [back(4243, exe="/opt/trainer", name="trainer")])
    assert error == "respawned: pid 4243 trainer (no systemd unit); stop what restarts it"


def test_respawn_of_a_unit_in_services_says_something_starts_it() -> None:
    error = kill_error(frozenset(), KILLED, [back(4242, unit="sglang.service")], services=("sglang.service",))
    assert error == "respawned: pid 4242 python3 (sglang.service); it is in services, yet something starts it again"


def test_several_respawned_are_counted() -> None:
    again = [back(p, unit="sglang.service") for p in (1, 2, 3)] + [back(4, exe="/opt/trainer", name="trainer")]
    error = kill_error(frozenset(), KILLED, again, restart={"sglang.service": "on-failure"})
    assert error == ("respawned: pid 1 python3 (sglang.service, Restart=on-failure), pid 2 python3 "
                     "(sglang.service, Restart=on-failure) and 2 more; add it to services")


def test_a_stranger_after_the_kill_is_a_new_holder() -> None:
    error = kill_error(frozenset(), KILLED, [back(5000, exe="/usr/bin/perl", unit="other.service")])
    assert error == "new GPU holders after kill: pid 5000 python3"
    assert split_back([back(4000, unit="sglang.service")], KILLED) == ([], [])  # a target still dying


def test_the_same_executable_in_another_unit_is_new_not_respawned() -> None:
    """Every python is /usr/bin/python3.11: another service's python after the kill is not the killed one back
    (`--stop-units` would stop that unrelated service)."""
    other = back(5001, exe="/usr/bin/python3.11", unit="jupyter.service")
    assert split_back([other], KILLED) == ([], [other])
    assert kill_error(frozenset(), KILLED, [other]) == "new GPU holders after kill: pid 5001 python3"


def test_the_same_executable_outside_a_unit_is_a_respawn_only_of_a_killed_holder_outside_one() -> None:
    loose = back(5002, exe="/usr/bin/python3.11")  # the killed python3.11 ran in sglang.service
    assert split_back([loose], KILLED) == ([], [loose])
    trainer = back(5003, exe="/opt/trainer", name="trainer")  # the killed trainer ran in no unit
    assert split_back([trainer], KILLED) == ([trainer], [])
    in_a_unit = back(5004, exe="/opt/trainer", unit="other.service", name="trainer")
    assert split_back([in_a_unit], KILLED) == ([], [in_a_unit])
    assert split_back([back(5005)], KILLED) == ([], [back(5005)])  # no exe, no unit: nothing ties it to a kill


def test_survivors_come_before_respawns() -> None:
    assert kill_error(frozenset({4001}), KILLED, [back(1, unit="sglang.service")]) == (
        "survived SIGKILL: pid 4001 trainer")
