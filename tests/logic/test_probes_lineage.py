"""The lineage probe: its argv and awk program, golden parses, and round trips here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from support.deep_chain import deep_chain
from support.processes import named_child as named_child  # the fixture: children killed after the test
from support.processes import start_time

from fleet.node.probes import lineage as lineage_probes
from fleet.node.probes.lineage import (
    LINEAGE_AWK,
    LINEAGE_DEPTH,
    Ancestry,
    Lineage,
    ProcStat,
    lineage_argv,
    parse_lineage,
)
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.units import SIM_UNIT_VAR

# The variable by which fleet once told a simulated node: it no longer means anything to the lineage walk.
OLD_SIM_NODE_VAR = "FLEET_SIM_NODE"


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env)




# --- lineage -------------------------------------------------------


def test_lineage_argv_shape() -> None:
    assert lineage_argv([12, 4242]) == ["env", "LC_ALL=C", "awk", "-v", "depth=64", LINEAGE_AWK, "self", "12", "4242"]
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
        "77\t1\t400\ta)\\040S\\0401\\040(b\\011c\\012\\377\\134\n"
    )
    lineage = parse_lineage(text)
    assert lineage.own == (900, 899, 880, 1)
    assert set(lineage.procs) == {900, 899, 880, 1, 4242, 12, 77}
    # lossy_text: what is not UTF-8 replaced
    assert lineage.procs[77] == ProcStat(pid=77, ppid=1, comm="a) S 1 (b\tc\n\ufffd\\", start=400)
    assert lineage.procs[4242].start == 9001
    assert lineage.ancestors(4242) == [ProcStat(pid=12, ppid=1, comm="nvidia-persiste", start=350),
                                       ProcStat(pid=1, ppid=0, comm="systemd", start=2)]
    assert lineage.ancestors(4242, depth=1) == [ProcStat(pid=12, ppid=1, comm="nvidia-persiste", start=350)]
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
        ("12\t1\t5\ta b", "expected pid<TAB>ppid<TAB>starttime<TAB>comm \\(escaped\\)"),  # a raw comm: never
        ("12\t1\t5\ta\tb", "expected pid<TAB>ppid<TAB>starttime<TAB>comm"),
        ("12\t1\t5\tb\\x", "unknown escape"),
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
    assert lineage.procs[odd] == ProcStat(pid=odd, ppid=os.getpid(), comm="a) S 1 (b) x", start=start_time(odd))
    me = Path("/proc/self/comm").read_text().rstrip("\n")
    assert lineage.procs[os.getpid()] == ProcStat(pid=os.getpid(), ppid=os.getppid(), comm=me,
                                                  start=start_time(os.getpid()))
    assert lineage.procs[1].start == start_time(1)
    assert [p.pid for p in lineage.ancestors(odd)] == list(lineage.own[1:])
    assert "simulated" not in done.stdout.splitlines()


def test_a_comm_that_forges_a_record_comes_back_whole_and_forges_nothing() -> None:
    """A comm (its owner's choice) holding a newline, tabs and a lineage record for another pid (init's child
    pid 1 as its own parent: the top), and bytes not UTF-8: the real awk escapes it, so it is one record."""
    comm = b"\n1\t0\t5\tx\xff\\ ("
    code = "import sys, time; open('/proc/self/comm', 'wb').write(sys.argv[1].encode('latin-1')); print(flush=True); " \
           "time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code, comm.decode("latin-1")], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        done = _run(lineage_argv([child.pid]), {**os.environ, "LANG": "C.UTF-8"})
        assert done.returncode == 0, done.stderr
        lineage = parse_lineage(done.stdout)
        assert lineage.procs[child.pid] == ProcStat(pid=child.pid, ppid=os.getpid(), comm=comm.decode(errors="replace"),
                                                    start=start_time(child.pid))
        assert lineage.procs[1].start == start_time(1)  # pid 1's record is its own, not the forged one
        assert len(done.stdout.splitlines()) == len(lineage.procs) + 1  # one line a process, and `self`
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_lineage_never_says_simulated_whatever_the_environment() -> None:
    """fleet no longer tells a simulated node by an environment variable (the host variable `simulated` does)."""
    env = {**os.environ, OLD_SIM_NODE_VAR: "/tmp/node", SIM_UNIT_VAR: "trainer.service"}
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


# --- whole or cut: how far a lineage was read ---------------------------------------------------------


def test_ancestry_is_whole_when_it_reaches_a_process_whose_parent_is_pid_0() -> None:
    lineage = parse_lineage("4242\t12\t9001\tpython3\n12\t1\t350\tnvidia-persiste\n1\t0\t2\tsystemd\n")
    assert lineage.ancestry(4242) == Ancestry((ProcStat(pid=12, ppid=1, comm="nvidia-persiste", start=350),
                                               ProcStat(pid=1, ppid=0, comm="systemd", start=2)))
    assert lineage.ancestry(1) == Ancestry(())
    # a container's init has parent 0 too: its chain is whole inside the container
    assert parse_lineage("7\t1\t5\tpython3\n1\t0\t1\ttini\n").ancestry(7).cut_at is None


@pytest.mark.parametrize(
    ("text", "pid", "chain", "cut_at"),
    [
        ("4242\t12\t9001\tpython3\n12\t11\t350\tbash\n", 4242, [12], 12),  # 11 never read: depth, or it vanished
        ("4242\t12\t9001\tpython3\n", 4242, [], 4242),
        ("1\t0\t2\tsystemd\n", 4242, [], 4242),  # the holder itself was not read
        ("5\t6\t100\tx\n6\t5\t90\ty\n", 5, [6], 6),  # a loop (pids reused mid-walk) is no top
    ],
)
def test_ancestry_says_where_a_cut_lineage_stopped(text: str, pid: int, chain: list[int], cut_at: int) -> None:
    ancestry = parse_lineage(text).ancestry(pid)
    assert ([p.pid for p in ancestry.chain], ancestry.cut_at) == (chain, cut_at)


def test_a_chain_deeper_than_eight_is_walked_whole_here() -> None:
    """12 real processes, each the parent of the next, below this test: the real walk reads every one of them
    and on up to the top."""
    with deep_chain(12) as chain:
        done = _run(lineage_argv([chain.leaf]))
        assert done.returncode == 0, done.stderr
        ancestry = parse_lineage(done.stdout).ancestry(chain.leaf)
    assert ancestry.cut_at is None
    assert [p.pid for p in ancestry.chain][:12] == chain.levels
    assert ancestry.chain[-1].ppid == 0


def test_a_chain_deeper_than_the_walk_is_cut_and_says_so() -> None:
    """LINEAGE_DEPTH processes are read from each start: past them the lineage is cut, never whole. A later
    walk that meets a chain already read goes on through it and reads what lies above it."""
    with deep_chain(LINEAGE_DEPTH + 6) as chain:
        alone = parse_lineage(_run(lineage_argv([chain.leaf])).stdout)
        middle = chain.levels[40]  # 41 generations above the leaf: within the walk's depth from there
        both = parse_lineage(_run(lineage_argv([chain.leaf, middle])).stdout)
    deep = alone.ancestry(chain.leaf)
    assert len(deep.chain) == LINEAGE_DEPTH - 1 and deep.cut_at == deep.chain[-1].pid
    assert deep.cut_at == chain.levels[LINEAGE_DEPTH - 2]
    assert both.ancestry(middle).cut_at is None  # its walk went on through what the leaf's had read, and past it
    assert both.ancestry(chain.leaf).cut_at is None
