"""Time to a verdict, way by way: simulated nodes over real SSH, each going wrong in one of the ways of
docs/operating.md's table, all reset in one run. Each host reaches the verdict the table names within the seconds
`fleet.reset.verdict_time` gives for its own variables, plus the rest of a reset at this machine's pace: a behaviour
check, not a timing benchmark.

A way's seconds are the waits it costs; the rest of the reset goes at the node's own pace, and on a loaded machine
(four test workers on two cores) that pace is several times a quiet one's. So the run also resets a healthy node,
and its duration measures the rest of a reset at the pace of this run: each host may take its row, plus that, plus
SLACK_S for the difference between two nodes' paces. The variables are small, so the run is short, yet each way's
wait is longer than SLACK_S: a host that waited out its bound twice (a wedged driver asked again, a second settle
window) would be past its row. The silent session's row is checked over the real OpenSSH sshd
(`tests/sshd/test_ssh_faults.py`), where a session can be frozen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
from support.processes import Children, children, lock_held
from support.sim_fleet import busy, make_fleet, reset, step

from fleet.inventory.load import load_inventory
from fleet.model.report import HostStatus, Reason, StepName
from fleet.reset import verdict_time
from fleet.sim.node import NodeSpec, UnitSpec

__all__ = ["children", "make_fleet"]  # fixtures, used by name

# Seconds past its way's own and the healthy node's whole reset that a host may take: two nodes' paces differ in one
# run. Less than any way's wait below.
SLACK_S = 5.0
# The healthy node: its reset, start to clean, is the rest of a reset at this run's pace.
HEALTHY = "gpu-t00"
BASE = {"connect_timeout": 5, "command_timeout": 5, "drain_timeout": 5, "kill_grace": 1, "settle_timeout": 10}

# node -> (its spec, its variables, the way it goes wrong, the status and reason it must end with)
CASES: dict[str, tuple[NodeSpec, dict[str, Any], str, HostStatus, Reason | None]] = {
    "gpu-t01": (busy("gpu-t01"), {"connect_timeout": 6}, "nothing answers the connection",
                HostStatus.UNREACHABLE, Reason.CONNECT_TIMEOUT),
    "gpu-t02": (busy("gpu-t02"), {}, "another run holds the node's lock", HostStatus.FAILED, Reason.LOCKED),
    "gpu-t03": (busy("gpu-t03", smi_mode="hang"), {"command_timeout": 4}, "the driver is wedged",
                HostStatus.FAILED, Reason.COMMAND_TIMEOUT),
    "gpu-t04": (busy("gpu-t04", unit=UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000, ignore_sigterm=True)),
                {"drain_timeout": 10}, "a unit's stop hangs", HostStatus.CLEAN, None),
    "gpu-t05": (NodeSpec(name="gpu-t05", linger_s=0.2, units=(
                    UnitSpec(name="trainer.service", gpus=(2, 3), mib=20000, restart="always", restart_sec=0.3),)),
                {"services": [], "kill_grace": 3}, "a holder respawns", HostStatus.FAILED, Reason.RESPAWNED),
    "gpu-t06": (busy("gpu-t06", leaked_mib=((3, 4096),)), {"settle_timeout": 10}, "GPU memory never comes back",
                HostStatus.FAILED, Reason.MEMORY_LEAKED),
}
HOLDS = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print(flush=True); time.sleep(300)")


async def test_each_way_a_host_goes_wrong_reaches_its_verdict_within_the_tables_time(
        make_fleet: Any, children: Children, tmp_path: Path) -> None:
    specs = [busy(HEALTHY), *(spec for spec, *_ in CASES.values())]
    variables = {name: {**BASE, **extra} for name, (_, extra, *_) in CASES.items()}
    sim = await make_fleet(specs, {HEALTHY: BASE, **variables})
    await sim.stall_server("gpu-t01")  # accepts TCP, never says a word
    holder = children.track(_hold(sim.nodes["gpu-t02"].lock_file))
    assert holder.stdout is not None and holder.stdout.readline()
    assert lock_held(sim.nodes["gpu-t02"].lock_file)
    hosts = load_inventory(sim.inventory_path).hosts
    with anyio.fail_after(120):
        report = await reset(sim, tmp_path)

    healthy = report.hosts[HEALTHY]
    assert healthy.status is HostStatus.CLEAN, healthy.error
    # its memory comes back 0.3 s after its unit stops: a settle as long as its window would be a wait that every
    # host pays, which this measure would then hide
    assert step(healthy, StepName.SETTLE).duration_s < BASE["settle_timeout"]
    for name, (_, _, way_name, status, reason) in CASES.items():
        host, found = report.hosts[name], dict(verdict_time.ways(hosts[name]))
        way, = [w for w in found if w.name.startswith(way_name)]
        assert (host.status, host.reason) == (status, reason), (name, host.error)
        assert host.duration_s <= found[way] + healthy.duration_s + SLACK_S, (
            name, host.duration_s, found[way], healthy.duration_s)


def _hold(path: str) -> subprocess.Popen[bytes]:
    """A process of this user's holding the node's lock as another run's would (ended by its pid, `children`)."""
    return subprocess.Popen([sys.executable, "-c", HOLDS, path], stdout=subprocess.PIPE, env=dict(os.environ))
