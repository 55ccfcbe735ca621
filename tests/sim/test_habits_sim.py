"""An operator's habits from pdsh, clush and OpenSSH, and the mistakes a newcomer makes, through the CLI as a process
on simulated nodes: `-h`, `-x HOSTS`, `-f N`, `fleet show` for the last run; `gpu-b[01-09]` on a rack whose
inventory lists three (exit 2 naming the six, before anything connects; or, with `--missing-ok`, the three, said in
one line); a `services` unit the node does not have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.sim_fleet import busy, fast_vars, fleet_cli
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test

from fleet.sim.node import NodeSpec, WorkerSpec

NAMES = ["gpu-b01", "gpu-b02", "gpu-b03"]


@pytest.mark.parametrize("command", [[], ["reset"], ["check"], ["show"], ["runs"], ["inventory"]])
async def test_dash_h_is_help_everywhere(command: list[str]) -> None:
    code, out, err = await fleet_cli(*command, "-h")
    assert code == 0, err
    assert out.startswith(f"Usage: fleet {' '.join(command)}".rstrip() + " "), out


async def test_a_node_set_naming_hosts_the_inventory_lacks_stops_before_anything_connects(
        make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([NodeSpec(name=n) for n in NAMES], fast_vars(NAMES))
    logs = tmp_path / "logs"
    code, out, err = await fleet_cli("check", "-i", str(sim.inventory_path), "gpu-b[01-09]", "--log-dir", str(logs))
    assert code == 2 and out == ""
    assert err == (f"fleet: error: gpu-b[04-09] not in {sim.inventory_path}: list them there, name them with -w,"
                   " or pass --missing-ok to target only the 3 it has\n")
    assert not logs.exists()  # nothing ran
    code, out, err = await fleet_cli("check", "-i", str(sim.inventory_path), "gpu-b[01-09]", "--missing-ok",
                                     "--json", "--log-dir", str(logs))
    assert code == 0, err
    assert f"fleet: left out gpu-b[04-09]: not in {sim.inventory_path} (--missing-ok)\n" in err
    assert sorted(json.loads(out)["hosts"]) == NAMES


async def test_x_excludes_f_is_the_fan_out_and_show_shows_the_last_run(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([NodeSpec(name=n) for n in NAMES], fast_vars(NAMES))
    logs = tmp_path / "logs"
    code, out, err = await fleet_cli("check", "-i", str(sim.inventory_path), "gpu-b[01-03]", "-x", "gpu-b02",
                                     "-f", "1", "--json", "--log-dir", str(logs))
    assert code == 0, err
    document = json.loads(out)
    assert sorted(document["hosts"]) == ["gpu-b01", "gpu-b03"]
    shown = [await fleet_cli("show", *last, "--json", "--log-dir", str(logs)) for last in ([], ["last"])]
    assert shown[0] == shown[1] and shown[0][0] == 0
    assert json.loads(shown[0][1])["run_id"] == document["run_id"]


async def test_a_services_unit_the_node_does_not_have_is_named_and_fails_the_reset(
        make_fleet: Any, tmp_path: Path) -> None:
    """`services: [sglang-server.service]` where the node runs sglang.service: the dry run shows it `not-found`, and
    the reset fails drain naming it (a typo leaves the real service unstopped), rather than ending clean."""
    sim = await make_fleet([busy("gpu-b01")], {"gpu-b01": {**fast_vars(["gpu-b01"])["gpu-b01"],
                                                          "services": ["sglang-server.service"]}})
    logs = tmp_path / "logs"
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-b01", "--dry-run", "--json",
                                     "--log-dir", str(logs))
    assert code == 0, err
    assert "sglang-server.service (not-found)" in err, err
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-b01", "-y", "--json", "--log-dir",
                                     str(logs))
    host = json.loads(out)["hosts"]["gpu-b01"]
    assert code == 1 and host["status"] == "failed" and host["reason"] == "drain_failed", host
    assert host["error"] == ("drain: sglang-server.service: no such unit on gpu-b01 (LoadState=not-found): a typo in"
                             " services? the service that holds the GPUs was not stopped")


async def test_a_reset_says_what_it_did_on_each_host_and_the_dry_run_lays_out_its_plan(
        make_fleet: Any, tmp_path: Path) -> None:
    """After the summary, a line per host from its report: the unit stopped, the process killed (name:pid, signal),
    how long settle took. `-q` leaves only the summary. The dry run lays a host's plan over lines, a step each, and
    counts the unit's own processes as the unit's (drain stops them), not as the kill's."""
    names = ["gpu-b01", "gpu-b02"]
    sim = await make_fleet([busy(n, workers=(WorkerSpec(gpus=(0,), mib=1523, name="python3"),)) for n in names],
                           fast_vars(names, services=["sglang.service"]))
    inventory, logs = str(sim.inventory_path), str(tmp_path / "logs")
    code, out, err = await fleet_cli("reset", "-i", inventory, "gpu-b01", "--dry-run", "--log-dir", logs)
    assert code == 0, err
    lines = err.splitlines()
    start = lines.index("gpu-b01 (dry run):")
    drain, kill = lines[start + 1], lines[start + 2]
    assert drain.startswith("  drain   would stop sglang.service; now sglang.service (active); their processes end"
                            " with them: pid "), drain
    assert drain.endswith(" sglang (root, 240000 MiB)") and "sglang" not in kill, kill  # 30000 MiB on each GPU
    assert kill.startswith("  kill    would kill pid ") and kill.endswith(" python3 (root, 1523 MiB)"), kill
    assert lines[start + 3].startswith("          would keep pid ") and lines[start + 3].endswith(
        " nvidia-persistenced (root): protected name nvidia-persistenced"), lines[start + 3]
    assert [line[:9] for line in lines[start + 4:start + 6]] == ["  settle ", "  verify "]
    code, out, err = await fleet_cli("reset", "-i", inventory, "gpu-b01", "-y", "--json", "--log-dir", logs)
    assert code == 0, err
    host = json.loads(out)["hosts"]["gpu-b01"]
    (killed,), (kept,) = host["killed"], host["kept"]
    assert host["stopped"] == ["sglang.service"] and killed["name"] == "python3"
    settle = next(s for s in host["steps"] if s["name"] == "settle")
    line = (f"gpu-b01 clean in {host['duration_s']:.1f} s: stopped sglang.service; killed python3:{killed['pid']}"
            f" ({killed['signal']}); kept nvidia-persistenced:{kept['pid']} (protected name); settled in"
            f" {settle['duration_s']:.1f} s")
    summary = err.splitlines().index("reset of 1 host in " + err.split("reset of 1 host in ")[1].split("\n")[0])
    assert err.splitlines()[summary + 1] == line, err
    code, out, err = await fleet_cli("reset", "-i", inventory, "gpu-b02", "-y", "-q", "--log-dir", logs)
    assert code == 0, err
    assert "gpu-b02 clean\n" in err and "gpu-b02 clean in" not in err, err
    code, out, err = await fleet_cli("reset", "-i", inventory, "gpu-b02", "-y", "-q", "-v", "--log-dir", logs)
    assert code == 2 and err == "fleet: error: -v/--verbose and -q/--quiet: one or the other\n"
