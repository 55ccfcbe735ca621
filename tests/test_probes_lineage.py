"""The lineage probe: its argv and awk program, golden parses, and round trips here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from test_signal_identity import start_time

from fleet.node.probes import lineage as lineage_probes
from fleet.node.probes.lineage import LINEAGE_AWK, LINEAGE_DEPTH, Lineage, ProcStat, lineage_argv, parse_lineage
from fleet.node.probes.parse import ProbeParseError
from fleet.sim import unitd

# The variable by which fleet once told a simulated node: it no longer means anything to the lineage walk.
OLD_SIM_NODE_VAR = "FLEET_SIM_NODE"


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
    assert lineage_argv([12, 4242]) == ["awk", "-v", "depth=64", LINEAGE_AWK, "self", "12", "4242"]
    assert LINEAGE_DEPTH == 64
    probe = lineage_probes.lineage([12, 4242])
    assert (probe.argv, probe.needs_root) == (tuple(lineage_argv([12, 4242])), True)  # /proc/PID/stat under hidepid


def test_the_awk_program_is_lineage_awk_without_its_comments() -> None:
    source = (Path(lineage_probes.__file__).parent / "lineage.awk").read_text().splitlines()
    code = [line for line in source if line.strip() and not line.lstrip().startswith("#")]
    assert LINEAGE_AWK.splitlines() == code
    assert any(line.startswith("#") for line in source)
    assert "ENVIRON" not in LINEAGE_AWK  # it reads /proc/PID/stat only, never an environment variable


@pytest.mark.parametrize("pids", [[], [0], [5, -1]])
def test_lineage_argv_rejects_bad_pids(pids: list[int]) -> None:
    with pytest.raises(ValueError, match="pid"):
        lineage_argv(pids)


def test_parse_lineage_golden() -> None:
    text = (
        "self\t900\n"
        "900\t899\t88001\tawk\n"
        "899\t880\t88000\ttimeout\n"
        "880\t1\t87000\tpython3\n"
        "1\t0\t2\tsystemd\n"
        "4242\t12\t9001\tpython3\n"
        "12\t1\t350\tnvidia-persiste\n"
        "77\t1\t400\ta) S 1 (b\tc\n"
    )
    lineage = parse_lineage(text)
    assert lineage.own == (900, 899, 880, 1)
    assert set(lineage.procs) == {900, 899, 880, 1, 4242, 12, 77}
    assert lineage.procs[77] == ProcStat(77, 1, "a) S 1 (b\tc", 400)
    assert lineage.procs[4242].start == 9001
    assert lineage.ancestors(4242) == [ProcStat(12, 1, "nvidia-persiste", 350), ProcStat(1, 0, "systemd", 2)]
    assert lineage.ancestors(4242, depth=1) == [ProcStat(12, 1, "nvidia-persiste", 350)]
    assert lineage.ancestors(5) == []


def test_parse_lineage_has_no_simulated_line_and_reads_empty() -> None:
    """A `simulated` line is no answer of the walk any more: it is malformed like any other stray line."""
    with pytest.raises(ProbeParseError, match="line 1: expected pid<TAB>ppid<TAB>starttime<TAB>comm"):
        parse_lineage("simulated\n")
    assert [f.name for f in dataclasses.fields(Lineage)] == ["procs", "own"]
    assert parse_lineage("") == Lineage({})


def test_lineage_chain_stops_at_a_loop() -> None:
    assert parse_lineage("self\t5\n5\t6\t100\tx\n6\t5\t90\ty\n").own == (5, 6)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("12\t1", "expected pid<TAB>ppid<TAB>starttime<TAB>comm"),
        ("12\t1\tsh", "expected pid<TAB>ppid<TAB>starttime<TAB>comm"),  # the old 3-field line: no start time
        ("x\t1\t5\tsh", "pid is not"),
        ("12\ty\t5\tsh", "ppid is not"),
        ("12\t1\tsh\t5", "starttime is not"),
        ("12\t1\t\tsh", "starttime is not"),
        ("self\tme", "self pid is not"),
    ],
)
def test_parse_lineage_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_lineage("1\t0\t2\tinit\n" + line)


def test_lineage_round_trip_walks_from_itself_and_from_each_pid(named_child: Callable[[str], int]) -> None:
    """The real awk here: its own chain runs through this test process; odd comms come back whole."""
    odd = named_child("a) S 1 (b) x")
    done = _run(lineage_argv([odd, os.getpid()]))
    assert done.returncode == 0, done.stderr
    lineage = parse_lineage(done.stdout)
    assert lineage.own[1] == os.getpid()  # awk's parent is this process
    assert lineage.own[-1] == 1
    assert lineage.procs[odd] == ProcStat(odd, os.getpid(), "a) S 1 (b) x", start_time(odd))
    me = Path("/proc/self/comm").read_text().rstrip("\n")
    assert lineage.procs[os.getpid()] == ProcStat(os.getpid(), os.getppid(), me, start_time(os.getpid()))
    assert lineage.procs[1].start == start_time(1)
    assert [p.pid for p in lineage.ancestors(odd)] == list(lineage.own[1:])
    assert "simulated" not in done.stdout.splitlines()


def test_lineage_never_says_simulated_whatever_the_environment() -> None:
    """fleet no longer tells a simulated node by an environment variable (the host variable `simulated` does)."""
    env = {**os.environ, OLD_SIM_NODE_VAR: "/tmp/node", unitd.SIM_UNIT_VAR: "trainer.service"}
    done = _run(lineage_argv([os.getpid()]), env)
    assert done.returncode == 0, done.stderr
    assert "simulated" not in done.stdout.splitlines()
    plain = parse_lineage(_run(lineage_argv([os.getpid()])).stdout)
    assert parse_lineage(done.stdout).own[1:] == plain.own[1:]  # the same walk, only awk's own pid differs
    assert not hasattr(lineage_probes, "SIM_NODE_VAR")


def test_lineage_of_a_vanished_pid_is_just_missing() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    done = _run(lineage_argv([child.pid]))
    assert done.returncode == 0
    assert child.pid not in parse_lineage(done.stdout).procs
