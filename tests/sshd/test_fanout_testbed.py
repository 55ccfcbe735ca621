"""The fan-out testbed (`benchmarks/fanoutlib/testbed.py`): every simulated node has its own process table.

Over the real OpenSSH sshd: a session to a node's address runs in that node's PID namespace, so its /proc shows
the node's processes only (its serving unit's worker holds the node's GPUs, another node's does not appear);
`fleet reset` over the testbed ends every node clean and the benchmark's own check counts them; stopping the
testbed ends every namespace (its init, recorded by pid) and with it every process the nodes started.
Not timed: speed is `make bench`'s to measure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fanoutlib import testbed as fanout_testbed
from fanoutlib.procs import alive


def namespaces_allowed() -> bool:
    """This machine lets root make a PID namespace with its own /proc (a container without CAP_SYS_ADMIN does not)."""
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not namespaces_allowed(), reason="no PID namespaces here (unshare --pid refused)")]


def started_under(folder: Path) -> list[int]:
    """Live processes whose command line names `folder` (every simulated node's process does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(folder).encode() in argv and alive(int(entry.name)):
                found.append(int(entry.name))
    return found



@pytest.fixture
def bed(tmp_path: Path) -> Iterator[fanout_testbed.Testbed]:
    testbed = fanout_testbed.Testbed(tmp_path, 2, linger_s=0.2, protected_daemon=True)
    try:
        testbed.start_nodes()
        testbed.start_sshd()
        testbed.write_inventory()
        yield testbed
    finally:
        testbed.stop_sshd()
        testbed.stop_nodes()


def ssh(bed: fanout_testbed.Testbed, name: str, command: str) -> str:
    argv = ["ssh", "-i", str(bed.key), "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-p", str(bed.port), f"root@{bed.addrs[name]}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def test_a_session_sees_its_own_node_only(bed: fanout_testbed.Testbed) -> None:
    table = ssh(bed, "n0001", "ps -e -o pid=,comm=").split("\n")
    names = [line.split(None, 1)[1] for line in table if line.strip()]
    assert names.count("sglang") == 1 and "nvidia-persiste" in names  # its unit's worker and daemon, not n0002's
    apps = ssh(bed, "n0002", "nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()
    assert len(apps) == 8 and len(set(apps)) == 1  # one worker on all 8 GPUs, a pid of n0002's own table


def test_fleet_resets_every_node_and_stop_leaves_nothing(bed: fanout_testbed.Testbed, tmp_path: Path) -> None:
    inits = [namespace.init_pid for namespace in bed.namespaces.values()]
    assert all(alive(pid) for pid in inits) and started_under(tmp_path / "nodes")
    done = subprocess.run([sys.executable, "-m", "fleet", "reset", "-i", str(bed.inventory), "-g", "all", "-y",
                           "--json", "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=240)
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert {h["status"] for h in report["hosts"].values()} == {"clean"}
    assert bed.verify(dict.fromkeys(bed.names, report["run_id"])) == 2
    bed.restart_units()
    assert len(ssh(bed, "n0001", "nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()) == 8
    bed.stop_sshd()
    bed.stop_nodes()
    assert not any(alive(pid) for pid in inits)
    assert started_under(tmp_path / "nodes") == []
