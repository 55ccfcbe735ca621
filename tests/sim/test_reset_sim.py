"""fleet reset over real SSH against simulated GPU nodes, asserted on the nodes' own state.

Each node is served by an in-process asyncssh server on its own loopback address
with its own host key; workers are real processes holding real device files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sim_fleet import ALL, FAST, busy, comm, fast_vars, fleet_cli, last_log, reset, step
from support.sim_fleet import make_fleet as make_fleet  # the fixture: fleets torn down after the test
from support.waits import eventually

from fleet.model.report import HostStatus, Reason, StepName, StepStatus
from fleet.node.node import is_remote_command
from fleet.reset import lock
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec


async def test_busy_fleet_with_a_stray_process_is_reset_clean(make_fleet: Any, tmp_path: Path) -> None:
    """Unit stopped gracefully, the stray killed, persistenced alive, memory back to idle, on every node."""
    names = ["gpu-b01", "gpu-b02", "gpu-b03"]
    sim = await make_fleet([busy(n) for n in names], fast_vars(names))
    strays = {n: sim.nodes[n].spawn_worker(WorkerSpec(gpus=(0,), mib=1523, name="python3")) for n in names}
    keepers = {n: [p for p in sim.nodes[n].recorded_pids() if sim.nodes[n].alive(p) and comm(p) == "nvidia-persiste"]
               for n in names}
    assert all(m and m > 16 for m in sim.nodes["gpu-b01"].gpu_memory())

    report = await reset(sim, tmp_path)

    for name in names:
        host, node = report.hosts[name], sim.nodes[name]
        assert host.status is HostStatus.CLEAN, host.error
        assert [s.name for s in host.steps] == list(StepName)
        assert node.unit_state("sglang.service") == "inactive"  # graceful, not escalated
        assert not node.alive(strays[name])
        assert strays[name] in {k.pid for k in host.killed}
        assert keepers[name] and all(node.alive(p) for p in keepers[name])
        assert {(k.pid, k.why) for k in host.kept} == {(p, "protected name nvidia-persistenced") for p in keepers[name]}
        assert node.gpu_memory() == [0] * 8
        assert node.compute_pids() == set()
        assert host.memory_before_mib == (30000 + 1523,) + (30000,) * 7  # what the reset freed, GPU by GPU
        assert len(host.gpus) == 8


async def test_stop_that_hangs_is_escalated_within_drain_timeout(make_fleet: Any, tmp_path: Path) -> None:
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=30000, ignore_sigterm=True, timeout_stop_sec=90)
    sim = await make_fleet([busy("gpu-h01", unit=unit)], fast_vars(["gpu-h01"], drain_timeout=2))
    with anyio.fail_after(30):
        report = await reset(sim, tmp_path)
    host, node = report.hosts["gpu-h01"], sim.nodes["gpu-h01"]
    assert host.status is HostStatus.CLEAN, host.error
    drain = step(host, StepName.DRAIN)
    assert "SIGKILL" in drain.detail
    assert 2 <= drain.duration_s < 15
    assert node.unit_state("sglang.service") in ("inactive", "failed")
    assert node.gpu_memory() == [0] * 8


async def test_memory_that_takes_8_s_to_come_back_is_waited_for(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-h01", linger_s=8.0)], fast_vars(["gpu-h01"]))
    report = await reset(sim, tmp_path)
    host = report.hosts["gpu-h01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert step(host, StepName.SETTLE).duration_s >= 6
    assert all(g.settle_s is not None and g.settle_s >= 6 for g in host.gpus)
    assert sim.nodes["gpu-h01"].gpu_memory() == [0] * 8


async def test_restart_always_process_that_comes_back_is_not_clean(make_fleet: Any, tmp_path: Path) -> None:
    """A unit fleet was not told about respawns its worker after the kill: the node must not be 'clean'."""
    rogue = UnitSpec(name="trainer.service", gpus=(2, 3), mib=20000, process_name="python3", restart="always",
                     restart_sec=0.3)
    spec = NodeSpec(name="gpu-h01", units=(rogue,), linger_s=0.2)
    sim = await make_fleet([spec], {"gpu-h01": {**FAST, "services": [], "settle_timeout": 4}})
    report = await reset(sim, tmp_path)
    host, node = report.hosts["gpu-h01"], sim.nodes["gpu-h01"]
    assert host.status is HostStatus.FAILED
    assert node.compute_pids(), "the respawned worker is alive on the node"
    assert "python3" in (host.error or "")
    assert (node.gpu_memory()[2] or 0) > 16


async def test_hanging_nvidia_smi_fails_that_node_only(make_fleet: Any, tmp_path: Path) -> None:
    names = ["gpu-h01", "gpu-h02", "gpu-h03"]
    specs = [busy(n, smi_mode="hang" if n == "gpu-h02" else "ok") for n in names]
    sim = await make_fleet(specs, {**fast_vars(names), "gpu-h02": {**FAST, "command_timeout": 4}})
    with anyio.fail_after(90):
        report = await reset(sim, tmp_path)
    wedged = report.hosts["gpu-h02"]
    assert wedged.status is HostStatus.FAILED
    assert wedged.error == ("nvidia-smi did not answer within 12 s (nvidia-smi's bound: 3 x command_timeout) in drain, "
                            "not asked again: driver may be wedged; reset its GPUs (--gpu-reset) or reboot the node")
    assert wedged.reason is Reason.COMMAND_TIMEOUT
    assert wedged.memory_before_mib is None
    assert report.hosts["gpu-h01"].status is HostStatus.CLEAN
    assert report.hosts["gpu-h03"].status is HostStatus.CLEAN
    smi = sim.nodes["gpu-h02"].nvidia_smi_path
    assert await eventually(lambda: not _processes_running(smi), 20), "a hung nvidia-smi outlived its bound"


def _processes_running(needle: str) -> list[int]:
    """Pids whose command line mentions needle (read-only look, never used to kill)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


async def test_refused_port_and_wrong_host_key_are_unreachable_and_untouched(
    make_fleet: Any, tmp_path: Path
) -> None:
    names = ["gpu-h01", "gpu-h02", "gpu-h03"]
    sim = await make_fleet([busy(n) for n in names], fast_vars(names, connect_timeout=3))
    await sim.stop_server("gpu-h01")
    sim.corrupt_host_key("gpu-h02")
    before = sim.nodes["gpu-h02"].compute_pids()
    report = await reset(sim, tmp_path)
    refused, wrong_key = report.hosts["gpu-h01"], report.hosts["gpu-h02"]
    assert refused.status is HostStatus.UNREACHABLE and "refused" in (refused.error or "")
    assert wrong_key.status is HostStatus.UNREACHABLE and "host key" in (wrong_key.error or "").lower()
    assert refused.reason is Reason.CONNECT_REFUSED and wrong_key.reason is Reason.HOST_KEY_CHANGED
    assert all(s.status is StepStatus.SKIPPED for s in wrong_key.steps)
    assert sim.nodes["gpu-h02"].compute_pids() == before, "nothing may run on a host whose key is wrong"
    assert sim.nodes["gpu-h02"].unit_state("sglang.service") == "active"
    assert report.hosts["gpu-h03"].status is HostStatus.CLEAN


async def test_missing_gpu_and_na_memory_fail_verify(make_fleet: Any, tmp_path: Path) -> None:
    specs = [busy("gpu-h01", gpus=7), busy("gpu-h02", na_memory_gpus=(3,))]
    unit7 = UnitSpec(name="sglang.service", gpus=(0, 1, 2, 3, 4, 5, 6), mib=30000)
    specs[0] = busy("gpu-h01", gpus=7, unit=unit7)
    sim = await make_fleet(specs, {"gpu-h01": {**FAST, "gpus": 8}, "gpu-h02": {**FAST, "settle_timeout": 2}})
    report = await reset(sim, tmp_path)
    assert report.hosts["gpu-h01"].status is HostStatus.FAILED
    assert report.hosts["gpu-h01"].error == "expected 8 GPUs, nvidia-smi lists 7"
    assert report.hosts["gpu-h01"].reason is Reason.GPU_MISSING
    na = report.hosts["gpu-h02"]
    assert na.status is HostStatus.FAILED
    assert na.error == "gpu 3 memory.used is not a number ([N/A])"
    assert next(g for g in na.gpus if g.index == 3).memory_used_mib is None




async def test_cli_group_and_limit_leave_other_hosts_untouched(make_fleet: Any, tmp_path: Path) -> None:
    names = ["gpu-b01", "gpu-b02", "gpu-h01"]
    groups = {"blackwell": ["gpu-b01", "gpu-b02"], "hopper": ["gpu-h01"]}
    sim = await make_fleet([busy(n) for n in names], fast_vars(names), groups)
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "--group", "blackwell",
                                "--limit", "gpu-b02", "-y", "--json", "--log-dir", str(tmp_path / "logs"))
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc["hosts"]) == ["gpu-b02"]
    assert sim.nodes["gpu-b02"].compute_pids() == set()
    for untouched in ("gpu-b01", "gpu-h01"):
        assert sim.nodes[untouched].unit_state("sglang.service") == "active"
        assert len(sim.nodes[untouched].compute_pids()) == 1
    run_dir = tmp_path / "logs" / doc["run_id"]
    assert json.loads((run_dir / "summary.json").read_text()) == doc
    events = [json.loads(line) for line in (run_dir / "gpu-b02.jsonl").read_text().splitlines()]
    commands = [e for e in events if e["event"] == "command"]
    assert commands and all({"timestamp", "level", "host", "argv", "exit_status", "duration_s"} <= set(e)
                            for e in commands)
    assert all("step" in e for e in commands if not lock.is_lock_argv(e["argv"]))  # the lock is held around the steps
    assert [e["step"] for e in events if e["event"] == "step_end"] == ["drain", "kill", "settle", "verify"]
    assert events[-1]["event"] == "host_end" and events[-1]["status"] == "clean"
    assert "gpu-b02 clean" in err


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"gpus": "eight"}, "gpus"),
        ({"services": ["sglang.service; rm -rf /"]}, "services"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_bad_inventory_exits_2_with_one_line_and_touches_nothing(
    make_fleet: Any, tmp_path: Path, patch: dict[str, Any], key: str
) -> None:
    import yaml

    sim = await make_fleet([busy("gpu-b01")], fast_vars(["gpu-b01"]))
    data = yaml.safe_load(sim.inventory_path.read_text())
    data["hosts"]["gpu-b01"].update(patch)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, out, err = await fleet_cli("reset", "-i", str(bad), "gpu-b01", "-y", "--log-dir", str(tmp_path / "logs"))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "bad.yaml" in err and key in err
    assert sim.nodes["gpu-b01"].unit_state("sglang.service") == "active"
    assert not (tmp_path / "logs").exists()


async def test_check_is_read_only(make_fleet: Any, tmp_path: Path) -> None:
    sim = await make_fleet([busy("gpu-b01")], fast_vars(["gpu-b01"]))
    before = sim.nodes["gpu-b01"].compute_pids()
    report = await reset(sim, tmp_path, command="check")
    host = report.hosts["gpu-b01"]
    assert host.status is HostStatus.FAILED
    assert "holds 30000 MiB" in (host.error or "") and host.reason is Reason.MEMORY_HELD
    assert sim.nodes["gpu-b01"].compute_pids() == before
    assert [s.status for s in host.steps][:3] == [StepStatus.SKIPPED] * 3


async def test_dry_run_plans_from_the_node_and_touches_nothing(make_fleet: Any, tmp_path: Path) -> None:
    """--dry-run lists the units it would stop and the holders it would kill or keep; the node is untouched."""
    sim = await make_fleet([busy("gpu-b01")], fast_vars(["gpu-b01"]))
    node = sim.nodes["gpu-b01"]
    stray = node.spawn_worker(WorkerSpec(gpus=(0,), mib=1523, name="python3"))
    before = (node.compute_pids(), node.gpu_memory())
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-b01", "--dry-run", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    assert code == 0, err
    host = json.loads(out)["hosts"]["gpu-b01"]
    assert host["status"] == "planned"
    assert host["plan"]["would_stop"] == ["sglang.service"]
    assert {p["pid"]: p["mib"] for p in host["plan"]["would_kill"]}[stray] == 1523
    assert [p["name"] for p in host["plan"]["kept"]] == ["nvidia-persistenced"]
    assert (node.compute_pids(), node.gpu_memory()) == before
    assert node.unit_state("sglang.service") == "active"
    assert "would kill pid" in err


async def test_cli_stop_units_stops_the_unit_that_respawns(make_fleet: Any, tmp_path: Path) -> None:
    """`fleet reset --stop-units`: the Restart=always unit fleet was not told about is stopped; the node ends clean."""
    rogue = UnitSpec(name="trainer.service", gpus=(2, 3), mib=20000, process_name="python3", restart="always",
                     restart_sec=0.3)
    sim = await make_fleet([NodeSpec(name="gpu-h01", units=(rogue,), linger_s=0.2)],
                           {"gpu-h01": {**FAST, "services": []}})
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "gpu-h01", "--stop-units", "--json",
                                "--log-dir", str(tmp_path / "logs"))
    assert code == 0, err
    assert json.loads(out)["hosts"]["gpu-h01"]["status"] == "clean"
    node = sim.nodes["gpu-h01"]
    assert node.unit_state("trainer.service") in ("inactive", "failed")
    assert node.compute_pids() == set()


async def test_max_fail_stops_at_the_right_host_and_leaves_the_rest_untouched(make_fleet: Any, tmp_path: Path) -> None:
    """-j 1 --max-fail 1: b02 and b03 refuse; after the second failure no host starts; b04 and b05 keep running."""
    names = [f"gpu-b{i:02d}" for i in range(1, 6)]
    sim = await make_fleet([busy(n) for n in names], fast_vars(names))
    for down in ("gpu-b02", "gpu-b03"):
        await sim.stop_server(down)
    code, out, err = await fleet_cli("reset", "-i", str(sim.inventory_path), "-g", "sim", "-y", "-j", "1",
                                "--max-fail", "1", "--json", "--log-dir", str(tmp_path / "logs"))
    assert code == 4  # unreachable hosts, the rest skipped, none failed
    hosts = json.loads(out)["hosts"]
    assert [hosts[n]["status"] for n in names] == ["clean", "unreachable", "unreachable", "skipped", "skipped"]
    assert hosts["gpu-b04"]["error"] == "failure budget spent: 2 hosts failed or unreachable, 1 tolerated"
    for untouched in ("gpu-b04", "gpu-b05"):
        assert sim.nodes[untouched].unit_state("sglang.service") == "active"
        assert len(sim.nodes[untouched].compute_pids()) == 1
    assert "stopped starting hosts" in err


async def test_failed_canary_leaves_every_other_host_untouched(make_fleet: Any, tmp_path: Path) -> None:
    names = ["gpu-b01", "gpu-b02", "gpu-b03"]
    specs = [busy(n, smi_mode="driver-not-loaded" if n == "gpu-b01" else "ok") for n in names]
    sim = await make_fleet(specs, fast_vars(names))
    code, out, _ = await fleet_cli("reset", "-i", str(sim.inventory_path), "-g", "sim", "-y", "--canary", "1",
                              "--batch", "1", "--json", "--log-dir", str(tmp_path / "logs"))
    assert code == 1
    hosts = json.loads(out)["hosts"]
    assert hosts["gpu-b01"]["status"] == "failed"
    assert "driver" in hosts["gpu-b01"]["error"].lower()
    for other in ("gpu-b02", "gpu-b03"):
        assert hosts[other]["status"] == "skipped"
        assert hosts[other]["error"] == "canary failed on gpu-b01: no other host started"
        assert sim.nodes[other].unit_state("sglang.service") == "active"




def asked(events: list[dict[str, Any]]) -> list[str]:
    """Every probe a host's log says ran, as `step:program`, batched or not."""
    return [e.get("step", "lock") + ":" + Path(e["argv"][0]).name for e in events if e["event"] == "command"]


async def test_an_already_clean_host_costs_six_remote_commands(make_fleet: Any, tmp_path: Path) -> None:
    """The count docs/operating.md states (and the benchmark reports): it must not grow without a reason.
    (No nvidia-persistenced here: a kept holder costs the commands that describe it.) Six: the lock, the
    baselines as drain begins (the GPU memory, the compute apps, the kernel log read whole: one batch), drain's
    look before the stop, the stop and the first look after it (one batch), kill's holder scan, settle's one query,
    and verify's one batch (two nvidia-smi queries, the health gate's health fields and row remapper, the holder
    scan, the kernel log after the baseline's cursor, the fabric manager's version). Sixteen probes, six remote
    commands."""
    sim = await make_fleet([busy("gpu-c01", protected_daemon=False)], fast_vars(["gpu-c01"]))
    first = await reset(sim, tmp_path)
    assert first.hosts["gpu-c01"].status is HostStatus.CLEAN, first.hosts["gpu-c01"].error
    second = await reset(sim, tmp_path)
    assert second.hosts["gpu-c01"].status is HostStatus.CLEAN, second.hosts["gpu-c01"].error
    events = last_log(tmp_path, "gpu-c01")
    assert sorted(asked(events)) == sorted([
        "lock:sh", "drain:nvidia-smi", "drain:nvidia-smi", "drain:sh", "drain:systemctl", "drain:systemctl",
        "drain:systemctl", "kill:sh", "settle:nvidia-smi", "verify:nvidia-smi", "verify:nvidia-smi",
        "verify:nvidia-smi", "verify:nvidia-smi", "verify:sh", "verify:sh", "verify:nv-fabricmanager",
    ])
    remote = [e.get("step", "lock") for e in events if is_remote_command(e)]
    assert remote == ["drain", "drain", "kill", "settle", "verify", "lock"]  # the lock is logged on its release


async def test_a_busy_host_costs_at_most_ten_remote_commands(make_fleet: Any, tmp_path: Path) -> None:
    """A host whose only GPU user is its serving unit: the unit's stop is polled and its memory lingers (0.3 s),
    so drain and settle look more than once; still one command a look, at most ten in all."""
    sim = await make_fleet([busy("gpu-c02", protected_daemon=False)], fast_vars(["gpu-c02"]))
    report = await reset(sim, tmp_path)
    assert report.hosts["gpu-c02"].status is HostStatus.CLEAN, report.hosts["gpu-c02"].error
    remote = [e for e in last_log(tmp_path, "gpu-c02") if is_remote_command(e)]
    assert 6 <= len(remote) <= 10, [(e.get("step"), e["argv"][0]) for e in remote]


async def test_a_clean_become_host_costs_nine_remote_commands_four_of_them_through_sudo(make_fleet: Any,
                                                                                       tmp_path: Path) -> None:
    """The count docs/operating.md states for `become: true`. Only the probes that need root go through sudo (least
    privilege), so a batch that mixes them is two remote commands: the baselines (the kernel log through sudo,
    nvidia-smi not), drain (the look before the stop and the stop through sudo, the looks after it not) and verify
    (the holder scan and the kernel log through sudo, four nvidia-smi queries and the fabric manager's version
    not) are two each; the lock, kill's holder scan and settle one each. Nine where six without become, for the
    same sixteen probes. (A real
    node's lock, in /run/lock, goes through sudo too: five of the nine; the simulated node's is under its own
    folder.)"""
    sim = await make_fleet([busy("gpu-c03", protected_daemon=False)], fast_vars(["gpu-c03"], become=True))
    first = await reset(sim, tmp_path)
    assert first.hosts["gpu-c03"].status is HostStatus.CLEAN, first.hosts["gpu-c03"].error
    sudo_log = sim.nodes["gpu-c03"].root / "log" / "sudo.log"  # what the node's sudo ran, one JSON argv a line
    before = len(sudo_log.read_text().splitlines())
    second = await reset(sim, tmp_path)
    assert second.hosts["gpu-c03"].status is HostStatus.CLEAN, second.hosts["gpu-c03"].error
    events = last_log(tmp_path, "gpu-c03")
    assert len(asked(events)) == 16
    remote = [e.get("step", "lock") for e in events if is_remote_command(e)]
    assert remote == ["drain"] * 4 + ["kill", "settle", "verify", "verify", "lock"]
    through_sudo = [json.loads(line) for line in sudo_log.read_text().splitlines()[before:]]
    wire = [" ".join(argv[argv.index("timeout") + 4:]) for argv in through_sudo]  # after `timeout -k K T`
    assert [line.split()[0] for line in wire] == ["sh", "sh", "sh", "sh"]
    assert "journalctl" in wire[0] and "systemctl stop" in wire[1] and "fleet-scan" in wire[2]
    assert "fleet-scan" in wire[3] and "journalctl" in wire[3]
    assert not any("nvidia-smi" in line for line in wire)
