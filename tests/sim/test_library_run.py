"""fleet as a library, in a benchmark harness's own process: `fleet.run` returns the report and leaves the process
as it was (its garbage collector's thresholds and frozen objects, its file limit, its signal handlers, its stdout
and stderr); the sweep `fleet`'s docstring shows runs as written, on a simulated rack over SSH."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from support.paths import REPO
from support.sim_fleet import busy, fast_vars
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test

NAMES = ["gpu-l01", "gpu-l02"]


async def test_the_documented_sweep_runs_and_leaves_the_harness_process_as_it_was(make_fleet: Any,
                                                                                  tmp_path: Path) -> None:
    # command_timeout 30: no bound is part of this test, and a loaded machine runs a node's commands slowly
    sim = await make_fleet([busy(n) for n in NAMES], fast_vars(NAMES, command_timeout=30), groups={"blackwell": NAMES})
    logs = tmp_path / "logs"
    with anyio.fail_after(240):
        done = await anyio.run_process([sys.executable, str(REPO / "tests" / "support" / "library_sweep.py"),
                                        str(sim.inventory_path), str(logs)], check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""
    result = json.loads(done.stdout)
    assert result["dirty"] == {} and result["ran"] == [NAMES, NAMES]  # reset clean before each benchmark
    before, after = result["before"], result["after"]
    # the collector's thresholds, the file limit, the signal handlers: as the harness left them; its frozen objects
    # still frozen (a run that gave them back to the collector would leave about none)
    assert {k: v for k, v in after.items() if k != "frozen"} == {k: v for k, v in before.items() if k != "frozen"}
    assert min(before["frozen"], after["frozen"]) >= result["kept"]
    assert result["said"] == ""  # nothing on the harness's stdout or stderr
    assert result["warned"] == []  # no warning of a library's, asyncssh's import-time one included
    assert len([p for p in logs.iterdir() if p.is_dir()]) == 2  # each run's hosts' logs, and nothing else there
    assert not (logs / "history.sqlite").exists()
    for run in logs.iterdir():
        assert sorted(p.name for p in run.iterdir()) == sorted([*(f"{n}.jsonl" for n in NAMES), "running.lock"])
    for node in sim.nodes.values():
        assert node.compute_pids() == set()
