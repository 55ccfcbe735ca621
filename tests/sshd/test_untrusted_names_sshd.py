"""A name a node's user chose never acts on the operator's terminal: through the real OpenSSH sshd, a process of user
`nobody` on a simulated node holds the device from an executable named `\\r\\e[2Kgpu-b01 clean\\e[8m` (a carriage
return, an erase-line sequence, a fake verdict, then "hidden" text). `fleet check` fails the node naming that
process: on stderr every such byte is written as its escape (no raw ESC, no carriage return: "1 failed" stays
visible), while the JSON report keeps the name as it was, as data. Needs root (to run it as nobody) and setpriv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from support.processes import NOBODY
from support.sshd_nodes import NAME, MakeHost
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test

from fleet.sim.node import NodeSpec

__all__ = ["make_host"]  # the fixture, used by name

EVIL = "\r\x1b[2Kgpu-b01 clean\x1b[8m"
INVENTORY_VARS = ("address", "port", "user", "identity_file", "known_hosts", "gpus", "services", "devices",
                  "nvidia_smi", "connect_timeout", "lock_file")


@pytest.fixture
def evil_holder() -> Iterator[tuple[Path, int]]:
    """A device file in a folder every user may reach, held by nobody's `sleep` copied under EVIL's name; the
    process is killed by its pid and the folder removed after."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: the holder runs as nobody (CI has both)")
    folder = Path(tempfile.mkdtemp(prefix="fleet-names-"))
    folder.chmod(0o755)
    device = folder / "nvidia7"
    device.write_bytes(b"")
    device.chmod(0o644)
    program = folder / EVIL
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    program.chmod(0o755)
    with device.open("rb") as held:
        child = subprocess.Popen([*NOBODY, str(program), "300"], stdin=held, cwd="/")
    try:
        yield device, child.pid
    finally:
        child.kill()
        child.wait()
        shutil.rmtree(folder)


def test_a_name_a_node_chose_is_shown_escaped_and_kept_as_data(make_host: MakeHost, evil_holder: tuple[Path, int],
                                                              tmp_path: Path) -> None:
    device, pid = evil_holder
    _, host = make_host(NodeSpec(name=NAME))
    host = replace(host, devices=(*host.devices, str(device.parent / "nvidia*")))
    fields = asdict(host)
    inventory = tmp_path / "site.yaml"  # JSON is YAML
    inventory.write_text(json.dumps({"hosts": {host.name: {**{k: fields[k] for k in INVENTORY_VARS},
                                                             "simulated": True}}}))  # its lock: in its root
    done = subprocess.run([sys.executable, "-m", "fleet", "check", "-i", str(inventory), host.name, "--json",
                           "--log-dir", str(tmp_path / "logs")], capture_output=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr.decode(errors="replace")
    shown = done.stderr.decode()
    assert "\x1b" not in shown and "\r" not in shown, shown
    assert f"{NAME} failed holders_left: pid {pid} \\x0d\\x1b[2Kgpu-b01 clean\\x1b[8m still holds {device}\n" in shown
    assert "check of 1 host in " in shown and ": 1 failed" in shown
    report = json.loads(done.stdout)
    assert report["hosts"][NAME]["error"] == f"pid {pid} {EVIL} still holds {device}"  # the JSON: the name as data
