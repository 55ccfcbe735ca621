"""A run cut short tells its story, through the CLI as a process on a simulated node: the batch in flight when
Ctrl-C came is in the host's log with how long it ran and what ended it; the step it was in is `interrupted`, not
`skipped`; summary.json, the summary line, `fleet show` (and its exit status) and report.html name the signal."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from support.sim_fleet import busy, fast_vars, fleet_cli
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test
from support.waits import eventually

from fleet.sim.fleetsim import SimFleet


def smi_running(sim: SimFleet) -> bool:
    """Whether an nvidia-smi of the node's runs now (read-only look at /proc)."""
    root = str(sim.nodes["gpu-i01"].root).encode()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if b"nvidia-smi" in cmdline and root in cmdline and not cmdline.startswith(b"timeout"):
            return True
    return False


async def test_ctrl_c_while_a_command_hangs_is_told_in_the_log_the_report_and_show(
        make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-i01", smi_mode="hang")], fast_vars(["gpu-i01"], command_timeout=20))
    logs = tmp_path / "logs"
    proc = await anyio.open_process([sys.executable, "-m", "fleet", "reset", "-i", str(sim.inventory_path),
                                     "gpu-i01", "-y", "--log-dir", str(logs)])
    try:
        # the baselines' nvidia-smi hangs (up to 60 s: its bound, 3 x command_timeout)
        assert await eventually(lambda: smi_running(sim), 60), "no nvidia-smi ran on the node"
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130
    (run,) = [p for p in logs.iterdir() if p.is_dir()]
    document = json.loads((run / "summary.json").read_text())
    host = document["hosts"]["gpu-i01"]
    assert document["interrupted_by"] == "SIGINT"
    assert (host["status"], host["reason"], host["error"]) == ("failed", "interrupted", "interrupted during drain")
    assert [(s["name"], s["status"]) for s in host["steps"]] == [
        ("drain", "interrupted"), ("kill", "skipped"), ("settle", "skipped"), ("verify", "skipped")]

    events = [json.loads(line) for line in (run / "gpu-i01.jsonl").read_text().splitlines()]
    (cut,) = [e for e in events if e.get("ended")]
    assert (cut["event"], cut["step"], cut["ended"], cut["exit_status"]) == ("batch", "drain", "interrupted by SIGINT",
                                                                             None)
    assert cut["duration_s"] > 0 and any("nvidia-smi" in what for what in cut["asked"])

    code, out, _ = await fleet_cli("show", "last", "--log-dir", str(logs))
    assert code == 130  # the run's own status
    assert "gpu-i01 failed interrupted: interrupted during drain" in out
    assert ", interrupted by SIGINT: 1 failed" in out
    assert "gpu-i01 failed in " in out and "drain interrupted" in out  # its line of what was done
    code, out, _ = await fleet_cli("show", "last", "--host", "gpu-i01", "--log-dir", str(logs))
    assert code == 0
    (line,) = [line for line in out.splitlines() if "cut short" in line]
    assert "nvidia-smi" in line and line.endswith(": interrupted by SIGINT") and "-> cut short after " in line
    page = (run / "report.html").read_text()
    assert "interrupted by SIGINT" in page and "<td>drain</td><td>interrupted</td>" in page
