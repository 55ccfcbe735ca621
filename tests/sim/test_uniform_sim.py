"""The rack compared, end to end over simulated nodes: one node on an older driver and one with
another VBIOS among them. The summary's `settings:` line, the JSON report's `settings` and each host's, the history,
`--uniform` failing the odd ones out with `not_uniform` (reset and check), `check` showing the same and changing
nothing. The fabric manager's version across NVSwitch nodes, one without it, one whose binary fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.sim_fleet import busy, fast_vars, fleet_cli, last_log, make_fleet

from fleet.history import History, history_path
from fleet.sim.fleetsim import SimFleet

__all__ = ["make_fleet"]  # the fixture

NAMES = ["gpu-v01", "gpu-v02", "gpu-v03", "gpu-v04", "gpu-v05"]
OLDER, USUAL = "535.183.01", "550.90.07"  # the older driver's version, and the simulated node's default


async def rack(make_fleet: Any) -> SimFleet:
    """Five busy nodes: gpu-v03 on an older driver, gpu-v05 with another VBIOS."""
    specs = [busy(n, driver_version=OLDER) if n == "gpu-v03" else
             busy(n, vbios_version="96.00.61.00.01") if n == "gpu-v05" else busy(n) for n in NAMES]
    sim: SimFleet = await make_fleet(specs, fast_vars(NAMES, command_timeout=30))  # a loaded machine is slow
    return sim


async def run(sim: SimFleet, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    confirm = ["-y"] if args[0] == "reset" else []
    code, out, err = await fleet_cli(*args, *confirm, "-i", str(sim.inventory_path), "--group", "sim", "--json",
                                     "--log-dir", str(tmp_path / "logs"))
    return code, json.loads(out), err


def settings_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("settings: "))


async def test_a_node_on_another_driver_is_named_in_the_summary_the_json_and_the_history(
    make_fleet: Any, tmp_path: Path
) -> None:
    sim = await rack(make_fleet)
    code, document, err = await run(sim, tmp_path, "reset")
    assert code == 0, err  # without --uniform the odd ones out are only named
    assert settings_line(err) == (f"settings: gpu-v03 driver {OLDER} (4 others {USUAL}); gpu-v05 VBIOS"
                                  " 96.00.61.00.01 (4 others 96.00.A5.00.01)")
    compared = document["settings"]
    assert compared["hosts"] == 5
    assert compared["properties"]["driver"] == {"majority": USUAL, "alike": 4, "odd": {"gpu-v03": OLDER},
                                                "tie": False, "unobserved": False, "absent": 0}
    assert compared["properties"]["fabric_manager"]["absent"] == 5  # no NVSwitch: no fabric manager, no difference
    assert compared["properties"]["vbios"]["odd"] == {"gpu-v05": "96.00.61.00.01"}
    assert {name for name, p in compared["properties"].items() if p["odd"]} == {"driver", "vbios"}
    assert compared["groups"]["sim"]["properties"]["driver"]["odd"] == {"gpu-v03": OLDER}
    host = document["hosts"]["gpu-v03"]
    assert host["status"] == "clean" and {g["settings"]["driver"] for g in host["gpus"]} == {OLDER}
    assert {g["settings"]["vbios"] for g in document["hosts"]["gpu-v05"]["gpus"]} == {"96.00.61.00.01"}
    with History.open(history_path(tmp_path / "logs")) as history:
        (row,) = history.host_history("gpu-v03")
    assert row.settings == [g["settings"] for g in host["gpus"]]  # each GPU's, as the report has them


async def test_uniform_fails_the_odd_ones_out_and_check_shows_them_changing_nothing(
    make_fleet: Any, tmp_path: Path
) -> None:
    sim = await rack(make_fleet)
    code, document, err = await run(sim, tmp_path, "check")  # busy nodes: check names the odd ones and kills nothing
    assert code == 1
    assert settings_line(err).startswith(f"settings: gpu-v03 driver {OLDER} (4 others {USUAL})")
    assert {(h["status"], h["reason"]) for h in document["hosts"].values()} == {("failed", "memory_held")}
    assert all(sum(m or 0 for m in node.gpu_memory()) > 0 for node in sim.nodes.values())

    code, document, err = await run(sim, tmp_path, "check", "--uniform")  # a host failed already keeps its reason
    assert {h["status"] for h in document["hosts"].values()} == {"failed"}
    assert "not_uniform" not in {h["reason"] for h in document["hosts"].values()}

    code, document, err = await run(sim, tmp_path, "reset", "--uniform")
    assert code == 1
    statuses = {n: (h["status"], h["reason"]) for n, h in document["hosts"].items()}
    assert statuses == {"gpu-v01": ("clean", None), "gpu-v02": ("clean", None), "gpu-v04": ("clean", None),
                        "gpu-v03": ("failed", "not_uniform"), "gpu-v05": ("failed", "not_uniform")}
    assert document["hosts"]["gpu-v03"]["error"] == (f"not uniform with the run's other hosts: driver {OLDER}"
                                                     f" (4 others {USUAL})")
    assert "gpu-v03 failed not_uniform: not uniform with the run's other hosts: driver" in err
    with History.open(history_path(tmp_path / "logs")) as history:
        rows = [r for r in history.host_history("gpu-v03") if r.command == "reset"]
    assert [(r.status, r.reason) for r in rows] == [("failed", "not_uniform")]

    code, document, err = await run(sim, tmp_path, "check", "--uniform")  # clean nodes now: only the odd ones fail
    assert code == 1
    assert {n for n, h in document["hosts"].items() if h["reason"] == "not_uniform"} == {"gpu-v03", "gpu-v05"}
    assert {h["status"] for n, h in document["hosts"].items() if n not in ("gpu-v03", "gpu-v05")} == {"clean"}


async def test_the_fabric_manager_version_is_read_in_verify_and_the_odd_one_named(make_fleet: Any,
                                                                                   tmp_path: Path) -> None:
    """Three NVSwitch nodes (a fabric manager each, gpu-f03's older and on the older driver it goes with), a PCIe one
    (no nv-fabricmanager: absent, no difference): the summary names both of gpu-f03's differences; each host's
    `fabric_manager` is in the JSON report; verify still costs one remote command."""
    names = ["gpu-f01", "gpu-f02", "gpu-f03", "gpu-f04"]
    specs = [busy(n, driver_version=OLDER, fabric_manager=OLDER) if n == "gpu-f03" else
             busy(n, fabric_manager=USUAL) if n != "gpu-f04" else busy(n) for n in names]
    sim: SimFleet = await make_fleet(specs, fast_vars(names, command_timeout=30))
    code, document, err = await run(sim, tmp_path, "reset")
    assert code == 0, err
    assert settings_line(err) == (f"settings: gpu-f03 driver {OLDER} (3 others {USUAL}); gpu-f03 fabric manager"
                                  f" {OLDER} (2 others {USUAL})")
    hosts = document["hosts"]
    assert hosts["gpu-f01"]["fabric_manager"] == {"state": "present", "version": USUAL, "why": None}
    assert hosts["gpu-f03"]["fabric_manager"] == {"state": "present", "version": OLDER, "why": None}
    assert hosts["gpu-f04"]["fabric_manager"] == {"state": "absent", "version": None, "why": None}
    assert document["settings"]["properties"]["fabric_manager"] == {
        "majority": USUAL, "alike": 2, "odd": {"gpu-f03": OLDER}, "tie": False, "unobserved": False, "absent": 1}
    verify = [e for e in last_log(tmp_path, "gpu-f01") if e.get("step") == "verify"]
    first = next(e["batch"] for e in verify if e["event"] == "batch")
    (read,) = [e for e in verify if e["event"] == "command" and e["argv"] == ["nv-fabricmanager", "--version"]]
    assert read["batch"] == first and read["exit_status"] == 0  # a section of verify's one batch, no command more
    in_batch = [e["argv"][0] for e in verify if e["event"] == "command" and e.get("batch") == first]
    assert in_batch[-1] == "nv-fabricmanager"  # last: a hang of it ends no other read
