"""Lineage, cgroup and simulated-unit probes: argv shapes, golden parses, and round trips here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from fleet.node.probes import (
    LINEAGE_AWK,
    SIM_NODE_VAR,
    SIM_UNIT_VAR,
    Lineage,
    ProbeParseError,
    ProcStat,
    cgroup_argv,
    lineage_argv,
    parse_cgroups,
    parse_lineage,
    parse_sim_units,
    sim_units_argv,
    unit_of_cgroup,
)
from fleet.sim import node as sim_node
from fleet.sim import unitd


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env)


@pytest.fixture
def named_child() -> Iterator[Callable[[str], int]]:
    """Start a child that renames itself (/proc/self/comm) and sleeps; each is killed after the test."""
    children: list[subprocess.Popen[bytes]] = []

    def start(comm: str, env: dict[str, str] | None = None) -> int:
        code = "import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); print(flush=True); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code, comm], stdout=subprocess.PIPE, env=env)
        children.append(child)
        assert child.stdout is not None
        child.stdout.readline()  # renamed
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


# --- lineage -------------------------------------------------------


def test_lineage_argv_shape() -> None:
    assert lineage_argv([12, 4242]) == ["awk", LINEAGE_AWK, "self", "12", "4242"]


@pytest.mark.parametrize("pids", [[], [0], [5, -1]])
def test_lineage_argv_rejects_bad_pids(pids: list[int]) -> None:
    with pytest.raises(ValueError, match="pid"):
        lineage_argv(pids)


def test_parse_lineage_golden() -> None:
    text = (
        "self\t900\n"
        "900\t899\tawk\n"
        "899\t880\ttimeout\n"
        "880\t1\tpython3\n"
        "1\t0\tsystemd\n"
        "4242\t12\tpython3\n"
        "12\t1\tnvidia-persiste\n"
        "77\t1\ta) S 1 (b\tc\n"
    )
    lineage = parse_lineage(text)
    assert lineage.own == (900, 899, 880, 1)
    assert not lineage.simulated
    assert lineage.procs[77] == ProcStat(77, 1, "a) S 1 (b\tc")
    assert lineage.ancestors(4242) == [ProcStat(12, 1, "nvidia-persiste"), ProcStat(1, 0, "systemd")]
    assert lineage.ancestors(4242, depth=1) == [ProcStat(12, 1, "nvidia-persiste")]
    assert lineage.ancestors(5) == []


def test_parse_lineage_simulated_and_empty() -> None:
    assert parse_lineage("simulated\n") == Lineage({}, (), True)
    assert parse_lineage("") == Lineage({})


def test_lineage_chain_stops_at_a_loop() -> None:
    assert parse_lineage("self\t5\n5\t6\tx\n6\t5\ty\n").own == (5, 6)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("12\t1", "expected pid<TAB>ppid<TAB>comm"),
        ("x\t1\tsh", "pid is not"),
        ("12\ty\tsh", "ppid is not"),
        ("self\tme", "self pid is not"),
    ],
)
def test_parse_lineage_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_lineage("1\t0\tinit\n" + line)


def test_lineage_round_trip_walks_from_itself_and_from_each_pid(named_child: Callable[[str], int]) -> None:
    """The real awk here: its own chain runs through this test process; odd comms come back whole."""
    odd = named_child("a) S 1 (b) x")
    done = _run(lineage_argv([odd, os.getpid()]))
    assert done.returncode == 0, done.stderr
    lineage = parse_lineage(done.stdout)
    assert lineage.own[1] == os.getpid()  # awk's parent is this process
    assert lineage.own[-1] == 1
    assert lineage.procs[odd] == ProcStat(odd, os.getpid(), "a) S 1 (b) x")
    me = Path("/proc/self/comm").read_text().rstrip("\n")
    assert lineage.procs[os.getpid()] == ProcStat(os.getpid(), os.getppid(), me)
    assert [p.pid for p in lineage.ancestors(odd)] == list(lineage.own[1:])
    assert not lineage.simulated


def test_lineage_says_simulated_only_where_the_simulator_said_so() -> None:
    env = {**os.environ, SIM_NODE_VAR: "/tmp/node"}
    assert parse_lineage(_run(lineage_argv([os.getpid()]), env).stdout).simulated
    assert SIM_NODE_VAR == sim_node.SIM_NODE_VAR


def test_lineage_of_a_vanished_pid_is_just_missing() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    done = _run(lineage_argv([child.pid]))
    assert done.returncode == 0
    assert child.pid not in parse_lineage(done.stdout).procs


# --- cgroups -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        ("/system.slice/sglang.service", "sglang.service"),
        ("/system.slice/sglang.service/payload", "sglang.service"),
        ("/system.slice/system-vllm.slice/vllm@1.service", "vllm@1.service"),
        ("/gpu.slice/trainer.service", "trainer.service"),
        ("/user.slice/user-1000.slice/session-3.scope", None),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service", None),
        ("/system.slice/docker-4f1c.scope", None),
        ("/init.scope", None),
        ("/", None),
        ("", None),
        ("/system.slice/foo\\x2dbar.service", None),
        ("/kubepods.slice/kubepods-pod1.slice/cri-containerd-9ab.scope", None),
    ],
)
def test_unit_of_cgroup(path: str, unit: str | None) -> None:
    assert unit_of_cgroup(path) == unit


def test_cgroup_argv_shape() -> None:
    assert cgroup_argv([1, 4242]) == ["grep", "-s", "-H", "-e", "", "--", "/proc/1/cgroup", "/proc/4242/cgroup"]


def test_parse_cgroups_v2_v1_and_hybrid() -> None:
    text = (
        "/proc/4242/cgroup:0::/system.slice/sglang.service\n"  # cgroup v2
        "/proc/77/cgroup:12:memory:/system.slice/other.service\n"  # v1, not the systemd hierarchy
        "/proc/77/cgroup:1:name=systemd:/system.slice/trainer.service\n"  # v1
        "/proc/88/cgroup:1:name=systemd:/system.slice/old.service\n"  # hybrid: v2 line wins
        "/proc/88/cgroup:0::/system.slice/new.service\n"
        "/proc/99/cgroup:0::/user.slice/user-1000.slice/session-2.scope\n"
        "/proc/1/cgroup:0::/init.scope\n"
    )
    assert parse_cgroups(text) == {4242: "sglang.service", 77: "trainer.service", 88: "new.service"}


def test_parse_cgroups_this_machines_literal_lines() -> None:
    """A container's hybrid layout, as this machine printed it: every process in the root cgroup."""
    text = "".join(f"/proc/7/cgroup:{line}\n" for line in (
        "9:name=systemd:/", "8:pids:/", "4:memory:/process_api/4a7a5d7713c82d12643f3941005508e1", "0::/"))
    assert parse_cgroups(text) == {}


@pytest.mark.parametrize(
    "line", ["/proc/7/cgroup 0::/", "/proc/self/cgroup:0::/", "0::/system.slice/x.service", "/proc/7/cgroup:x::/"]
)
def test_parse_cgroups_malformed(line: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID/cgroup:ID:CONTROLLERS:PATH"):
        parse_cgroups(line)


def test_cgroup_round_trip_on_this_process() -> None:
    """The real /proc/self/cgroup here gives what the pure reading of its lines gives; a gone pid is skipped."""
    child = subprocess.Popen(["true"])
    child.wait()
    done = _run(cgroup_argv([os.getpid(), child.pid]))
    assert done.returncode == 2 and done.stderr == ""  # -s: a vanished pid is no noise
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    expected = {os.getpid(): u for u in (unit_of_cgroup(line.split(":", 2)[2]) for line in lines) if u}
    found = parse_cgroups(done.stdout)
    assert set(found) <= {os.getpid()}
    assert found.get(os.getpid()) in {*expected.values(), None}
    assert len(done.stdout.splitlines()) == len(lines)


# --- the simulator's stand-in for cgroups ------------------------------------------


def test_sim_units_argv_shape() -> None:
    assert sim_units_argv([5]) == ["grep", "-a", "-z", "-s", "-H", "-e", "^FLEET_SIM_UNIT=", "--", "/proc/5/environ"]


def test_parse_sim_units_golden() -> None:
    text = "/proc/5/environ:FLEET_SIM_UNIT=trainer.service\0/proc/6/environ:FLEET_SIM_UNIT=bad unit\0"
    assert parse_sim_units(text) == {5: "trainer.service"}
    assert parse_sim_units("") == {}


def test_parse_sim_units_malformed() -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID/environ:FLEET_SIM_UNIT=UNIT"):
        parse_sim_units("/proc/5/environ:HOME=/root\0")


def test_sim_units_round_trip_reads_that_variable_and_nothing_else(named_child: Callable[..., int]) -> None:
    env = {**os.environ, SIM_UNIT_VAR: "trainer.service", "API_TOKEN": "s3cret"}
    pid = named_child("trainer", env)
    plain = named_child("stray")
    done = _run(sim_units_argv([pid, plain]))
    assert parse_sim_units(done.stdout) == {pid: "trainer.service"}
    assert "s3cret" not in done.stdout
    assert SIM_UNIT_VAR == unitd.SIM_UNIT_VAR
