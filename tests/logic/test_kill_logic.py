"""The kill step over a scripted node: what is kept, what respawns, and `stop_units` (no processes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence

import pytest
from support import scripted_node

from fleet.inventory.host import Host
from fleet.model.report import KeptProcess, StepStatus
from fleet.node.node import Node
from fleet.node.probes import procs, units
from fleet.reset import kill
from fleet.transport.scripted import Reply, ScriptedTransport

TRAINER = "0::/system.slice/trainer.service"


@pytest.fixture(autouse=True)
def quick_respawn_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted holder is back at the first look after the kill."""
    monkeypatch.setattr("fleet.reset.kill.RESPAWN_SCANS_S", (0.0,))


Log = scripted_node.Log  # records every event a step logs


def pids_of(argv: Sequence[str]) -> list[int]:
    """The pids a probe was asked about, whatever its shape."""
    words = [w for a in argv for w in a.replace("/", " ").replace(",", " ").split()]
    return [int(w) for w in words if w.isdigit() and int(w) > 1]


def node(scans: Iterator[str], cgroup: dict[int, str]) -> ScriptedTransport:
    """Holders as `scans` yields them; every process a python3 child of init; units per `cgroup`."""
    return ScriptedTransport(script=[
        (scripted_node.SCAN, lambda argv: Reply(stdout=scripted_node.scan(next(scans, "")))),
        (("ps", "-ww"), lambda argv: Reply(stdout=scripted_node.ps("".join(
            f"{p} 1 root python3 -m trainer\n" for p in pids_of(argv))))),
        (scripted_node.EXE, lambda argv: scripted_node.exe_reply(dict.fromkeys(pids_of(argv), "/usr/bin/python3.11"))),
        (scripted_node.LINEAGE, scripted_node.lineage),
        (("sh", "-c", units.MEMBERS_SH), lambda argv: Reply(stdout="".join(
            f"/proc/{p}/cgroup:{line}\n" for p, line in cgroup.items() if line.endswith(argv[-1])))),
        (("grep",), lambda argv: Reply(stdout="".join(
            f"/proc/{p}/cgroup:{cgroup[p]}\n" for p in pids_of(argv) if p in cgroup))),
        (("sh", "-c"), scripted_node.signal()),
        (("systemctl", "show", "--property=Restart"), Reply(stdout="Restart=always\n")),
        (("systemctl", "stop"), Reply()),
        (("systemctl", "show"), Reply(stdout="ActiveState=inactive\nSubState=dead\nMainPID=0\n")),
    ])


def holder(pid: int) -> str:
    return f"root\t/proc/{pid}/task/{pid}/fd/3\t/dev/nvidia0\n"


def remote(t: ScriptedTransport, log: Log | None = None) -> Node:
    host = Host(name="gpu-01", address="127.0.0.1", command_timeout=1.0, kill_grace=0.3, drain_timeout=1.0)
    return Node(host, t, log if log is not None else Log())


async def test_a_respawn_names_the_unit_and_is_not_stopped_without_stop_units() -> None:
    t = node(iter([holder(100), holder(101)]), {100: TRAINER, 101: TRAINER})
    outcome = await kill.kill(remote(t))
    assert outcome.result.status is StepStatus.FAILED
    assert outcome.result.error == "respawned: pid 101 python3 (trainer.service, Restart=always); add it to services"
    assert not [argv for argv in t.ran if argv[:2] == ("systemctl", "stop")]


async def test_stop_units_stops_the_unit_then_kills_again() -> None:
    t = node(iter([holder(100), holder(101), ""]), {100: TRAINER, 101: TRAINER})
    log = Log()
    outcome = await kill.kill(remote(t, log), stop_respawning=True)
    assert outcome.result.status is StepStatus.OK, outcome.result.error
    assert ("systemctl", "stop", "--no-block", "--", "trainer.service") in t.ran
    assert "stopped units of respawned holders: trainer.service inactive" in outcome.result.detail
    assert [k.pid for k in outcome.killed] == [100]
    assert ("stop_respawning_units", {"step": "kill", "units": ["trainer.service"]}) in log.events


async def test_stop_units_never_stops_the_unit_fleet_itself_runs_in() -> None:
    """The probe's own chain (pid 900) is in trainer.service: that unit is fleet's own session."""
    t = node(iter([holder(100), holder(101)]), {100: TRAINER, 101: TRAINER, 900: TRAINER})
    outcome = await kill.kill(remote(t), stop_respawning=True)
    assert outcome.result.error is not None and outcome.result.error.startswith("respawned: pid 101")
    assert not [argv for argv in t.ran if argv[:2] == ("systemctl", "stop")]


async def test_kept_holders_are_logged_with_why() -> None:
    t = node(iter([holder(900)]), {})
    log = Log()
    outcome = await kill.kill(remote(t, log))
    assert outcome.result.detail == "no GPU holders to kill; kept pid 900 python3 (fleet's own session)"
    assert ("kept", {"step": "kill", "pid": 900, "name": "python3", "reason": "fleet's own session"}) in log.events
    assert outcome.left_alive == (KeptProcess(pid=900, name="python3", user="root", why="fleet's own session"),
                                  )  # the report's kept


CRON = "0::/system.slice/cron.service"


async def test_stop_units_never_stops_a_service_that_runs_other_processes_too() -> None:
    """The holder came back in cron.service, which also runs crond (pid 55) and another user's job (pid 56): a
    shared service is not stopped; the kill fails naming it, and what to do if it is the workload's own."""
    t = node(iter([holder(100), holder(101)]), {100: CRON, 101: CRON, 55: CRON, 56: CRON})
    log = Log()
    outcome = await kill.kill(remote(t, log), stop_respawning=True)
    assert not [argv for argv in t.ran if argv[:2] == ("systemctl", "stop")]
    assert outcome.result.status is StepStatus.FAILED
    assert outcome.result.error == (
        "respawned: pid 101 python3 (cron.service, Restart=always); add it to services; not stopped: cron.service "
        "runs 2 other processes (pid 55, pid 56): add it to services if it is the workload's own")
    assert ("unit_not_stopped", {"step": "kill", "unit": "cron.service", "others": [55, 56]}) in log.events


def test_a_units_members_are_read_by_its_cgroup_not_by_a_name_that_contains_it() -> None:
    """`grep -F /cron.service` also finds `anacron.service`'s lines and a delegated sub-cgroup's: the cgroup is
    read as a unit is (its top-level .service), so only cron.service's own processes and those below it count."""
    probe = units.unit_members("cron.service", simulated=False)
    text = ("/proc/55/cgroup:0::/system.slice/cron.service\n/proc/70/cgroup:0::/system.slice/anacron.service\n"
            "/proc/71/cgroup:0::/system.slice/cron.service/job-1\n")
    assert probe.parse(text) == frozenset({55, 71})
    sim = units.unit_members("cron.service", simulated=True, known=55)
    assert sim.parse("/proc/55/environ:FLEET_SIM_UNIT=cron.service\0") == frozenset({55})


def test_a_simulated_units_members_are_those_of_its_own_node() -> None:
    """Simulated nodes share this machine's /proc: the members of `trainer.service` are the processes with that
    stand-in and the same node as the known member, never another simulated node's."""
    def start(node: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, units.SIM_UNIT_VAR: "trainer.service", units.SIM_NODE_VAR: node}
        return subprocess.Popen(["sleep", "60"], env=env)

    ours, also_ours, theirs = start("/sim/a"), start("/sim/a"), start("/sim/b")
    try:
        probe = units.unit_members("trainer.service", simulated=True, known=ours.pid)
        done = subprocess.run(list(probe.argv), capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        assert probe.parse(done.stdout) == {ours.pid, also_ours.pid}
    finally:
        for child in (ours, also_ours, theirs):
            child.kill()
            child.wait()


BATCH = "0::/system.slice/batch.service"


async def test_stop_units_never_stops_an_unrelated_service_running_the_same_python() -> None:
    """After the kill the trainer is back in its unit, and a batch job started in another unit: both run
    /usr/bin/python3.11. Only the trainer's own unit is stopped; the batch job is a new holder, not a respawn."""
    t = node(iter([holder(100), holder(101) + holder(102), ""]), {100: TRAINER, 101: TRAINER, 102: BATCH})
    outcome = await kill.kill(remote(t), stop_respawning=True)
    stopped = [argv[-1] for argv in t.ran if argv[:2] == ("systemctl", "stop")]
    assert stopped == ["trainer.service"]
    assert outcome.result.status is StepStatus.OK, outcome.result.error


SIGNAL = ("sh", "-c", procs.SIGNAL_SH, "fleet-signal")


async def test_a_pid_that_is_someone_else_after_sigterm_is_never_sigkilled() -> None:
    """The holder ignores SIGTERM; by the time of the next look its pid belongs to another process
    (signal.sh says `changed`): it counts as gone, and SIGKILL is never sent to that pid."""
    looks = iter(["alive", "changed"])

    def answer(argv: Sequence[str]) -> Reply:
        sig, pids = scripted_node.targets(argv)
        verdict = next(looks, "changed") if sig == "-" else "sent"
        return Reply(stdout="".join(f"{verdict} {pid}\n" for pid in pids))

    t = node(iter([holder(100), ""]), {})
    t.script.insert(0, (SIGNAL, answer))
    outcome = await kill.kill(remote(t))
    signals = [scripted_node.targets(argv)[0] for argv in t.ran if tuple(argv[:4]) == SIGNAL]
    assert "KILL" not in signals
    assert outcome.result.status is StepStatus.OK, outcome.result.error
    assert [(k.pid, k.signal) for k in outcome.killed] == [(100, "SIGTERM")]
