"""Say what happened, whatever the bytes: through a stock OpenSSH sshd (integration suite, marker `sshd`).

A log folder whose name is not UTF-8 (`fleet check --log-dir $'...\\xff\\xfe'`, run as a user with a UTF-8 locale
whose stdout refuses surrogates): the --json report on stdout, summary.json, report.html and the history's end are
all written, no traceback. An nvidia-smi that SIGKILL ends long before its bound (as the kernel's OOM killer does):
the host fails with "killed by signal 9 (out of memory?)", never "driver may be wedged", and the reads after it in
its batch still run. Every node is stopped, every process it started killed by pid; sshd is stopped by the fixture.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from support.sshd_nodes import NAME, MakeHost, kernel_reads, run, serving
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test

from fleet.engine.walk import Mode
from fleet.model.report import HostStatus, Reason, StepName, StepStatus
from fleet.sim.node import NodeSpec

__all__ = ["make_host"]  # the fixture, shared with test_health_sshd

NOT_UTF8 = b"runs-\xff\xfe"  # two bytes no UTF-8 text holds
INVENTORY_VARS = ("address", "port", "user", "identity_file", "known_hosts", "gpus", "services", "devices",
                  "nvidia_smi", "drain_timeout", "kill_grace", "settle_timeout", "connect_timeout", "lock_file")


def test_a_log_folder_whose_name_is_not_utf8_loses_no_report(make_host: MakeHost, tmp_path: Path) -> None:
    _, host = make_host(NodeSpec(name=NAME))  # idle: check finds it clean
    fields = asdict(host)
    inventory = tmp_path / "site.yaml"  # JSON is YAML
    inventory.write_text(json.dumps({"hosts": {host.name: {**{k: fields[k] for k in INVENTORY_VARS},
                                                             "simulated": True}}}))  # its lock: in its root
    logs = os.fsencode(tmp_path) + b"/" + NOT_UTF8
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}  # as under en_US.UTF-8: stdout refuses surrogates
    done = subprocess.run([os.fsencode(sys.executable), b"-m", b"fleet", b"check", b"-i", os.fsencode(inventory),
                           host.name.encode(), b"--json", b"--log-dir", logs],
                          capture_output=True, timeout=120, env=env, check=False)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "Traceback" not in err and "UnicodeEncodeError" not in err
    report = json.loads(done.stdout)
    assert report["hosts"][host.name]["status"] == "clean"
    shown = f"{tmp_path}/runs-\\xff\\xfe/{report['run_id']}"  # the bytes, printable
    assert f"logs: {shown}\n" in err
    folder = Path(os.fsdecode(logs)) / report["run_id"]
    assert json.loads((folder / "summary.json").read_text())["run_id"] == report["run_id"]
    assert shown in (folder / "report.html").read_text(encoding="utf-8")
    with sqlite3.connect(Path(os.fsdecode(logs)) / "history.sqlite") as history:
        ((ended_at, exit_code, log_dir),) = history.execute(
            "SELECT ended_at, exit_code, log_dir FROM runs WHERE run_id = ?", (report["run_id"],)).fetchall()
    assert ended_at is not None and exit_code == 0  # the history's end is written
    assert log_dir == f"{tmp_path}/runs-\\xff\\xfe"
    listed = subprocess.run([os.fsencode(sys.executable), b"-m", b"fleet", b"show", b"last", b"--html",
                             b"--log-dir", logs], capture_output=True, timeout=60, env=env, check=False)
    assert listed.returncode == 0 and listed.stdout.decode() == f"{shown}/report.html\n", listed.stderr


async def test_an_nvidia_smi_the_oom_killer_ends_is_killed_not_wedged(make_host: MakeHost, tmp_path: Path) -> None:
    """Every nvidia-smi call is SIGKILLed at once (exit 137 from its batch section, its 30 s bound far off): check
    fails naming the kill, and verify's later reads (the holder scan, the kernel log) still ran in the same batch."""
    _, host = make_host(serving(smi_mode="killed"))
    result, events = await run(host, tmp_path, Mode.CHECK)
    assert result.status is HostStatus.FAILED, result.error
    assert result.reason is Reason.PROBE_FAILED, result.reason
    assert result.error is not None and result.error.endswith("was killed by signal 9 before its bound (out of "
                                                              "memory?)"), result.error
    assert "wedged" not in result.error and "did not answer" not in result.error
    (verify,) = [s for s in result.steps if s.name is StepName.VERIFY]
    assert verify.status is StepStatus.FAILED  # failed, not timeout: nothing hung
    smi = [e for e in events if e["event"] == "command" and e.get("batch") and e["argv"][0].endswith("nvidia-smi")]
    assert smi and {e["exit_status"] for e in smi} == {137} and not any(e["timed_out"] for e in smi)
    (log,) = kernel_reads(events)
    assert log["exit_status"] == 0  # the batch went on past the killed sections
