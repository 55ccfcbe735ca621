"""`benchmarks/connectstorm.py` at a few dozen hosts: a smoke test of the benchmark, over the real OpenSSH sshd.

Checked: every host connects through fleet's connect path and runs its `true` (none unreachable or failed); with
`--hold` every session is held at once; the bounds are fleet's defaults; every daemon and session the benchmark
started is gone (by its recorded pid) and its temp folder removed. Not timed: speed is `make bench`'s to measure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import connectstorm
import pytest
from fanoutlib.procs import alive
from fanoutlib.sshd import Daemons, addresses
from fanoutlib.storm import storm

from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select

BENCH = Path(connectstorm.__file__).parent
pytestmark = pytest.mark.timeout(300)
DEFAULT = Host(name="x", address="127.0.0.1")  # fleet's built-in defaults



async def test_every_host_connects_runs_true_and_is_held_at_once(tmp_path: Path) -> None:
    daemons = Daemons(tmp_path, addresses(20))  # two daemons: 16 addresses and 4
    try:
        daemons.start()
        assert len(daemons.procs) == 2
        connectstorm.write_inventory(daemons, tmp_path / "inventory.yaml")
        hosts = list(select(load_inventory(tmp_path / "inventory.yaml"), groups=["all"]))
        assert [h.connect_timeout for h in hosts] == [DEFAULT.connect_timeout] * 20
        tally = await storm(hosts, None, hold=True)
        assert (tally.unreachable, tally.failed) == ({}, {})
        assert tally.peak_held == 20 and tally.held == 0 and len(tally.connect_s) == 20
        assert 1 <= tally.peak_connecting <= 20
    finally:
        pids = [p.pid for p in daemons.procs] + daemons.sessions()
        daemons.stop()
    assert pids and not [pid for pid in pids if alive(pid)]


def test_the_benchmark_runs_whole_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "storm.json"
    before = set(os.listdir("/tmp"))
    done = subprocess.run([sys.executable, str(BENCH / "connectstorm.py"), "--sizes", "24", "--pause", "0",
                           "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS hosts unreachable or failed at N=24: 0" in done.stdout
    result = json.loads(out.read_text())["sizes"]["24"]
    assert (result["hosts"], result["unreachable"], result["failed"], result["rc"]) == (24, 0, 0, 0)
    assert result["bounds"] == {"connect_timeout": DEFAULT.connect_timeout,
                                "command_timeout": DEFAULT.command_timeout}
    assert result["peak_fds"] >= result["fds_before"] and result["cpu_s"] > 0 and result["peak_rss_mb"] > 0
    assert not [name for name in set(os.listdir("/tmp")) - before if name.startswith("cs-")]
