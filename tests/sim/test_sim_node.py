"""The simulated node: real processes in tmp_path, probed the way fleet probes a node.

Every command runs as the SSH server runs it: `/bin/sh -c CMD` with
`env=node.env()` and `cwd=node.root`. The fake nvidia-smi's output is checked
against the real captures in tests/fixtures/nvidia-smi (see its SOURCES.md).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.paths import FIXTURES
from support.sim_nodes import MakeNode, sh, soon
from support.sim_nodes import make_node as make_node  # the fixture: nodes stopped after the test

from fleet.node.probes import health
from fleet.sim import NodeSpec, SimError, SimNode, UnitSpec, WorkerSpec, state

FIXTURES = FIXTURES / "nvidia-smi"
H100_IDLE_ALLFIELDS = FIXTURES / "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv"
P100_NOUNITS = FIXTURES / "tesla-p100-pcie-16gb_drv510.47.03_1gpu_query-gpu_csv-nounits.csv"
APPS_IDLE = FIXTURES / "h100-80gb-hbm3_drv590.48.01_1gpu_query-compute-apps_csv_idle-header-only.csv"
APPS_LOAD = FIXTURES / "h100-80gb-hbm3_drv590.48.01_1gpu_query-compute-apps_csv_load-3procs.csv"
TABLE_550 = FIXTURES / "8x-h100-80gb-hbm3_drv550.90.07_table_idle-1MiB-each.txt"
APPS_FIELDS = "timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,used_gpu_memory"
VERIFY_FIELDS = (
    "index,uuid,pci.bus_id,name,memory.used,memory.total,memory.free,"
    "ecc.errors.uncorrected.volatile.total,count,driver_version,persistence_mode"
)
# What each verify field's value looks like in a real `--format=csv` row.
SHAPES = {
    "index": r"\d+",
    "uuid": r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "pci.bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]",
    "name": r"NVIDIA H100 80GB HBM3",
    "memory.used [MiB]": r"\d+ MiB",
    "memory.total [MiB]": r"\d+ MiB",
    "memory.free [MiB]": r"\d+ MiB",
    "ecc.errors.uncorrected.volatile.total": r"\d+",
    "count": r"\d+",
    "driver_version": r"\d+\.\d+(\.\d+)?",
    "persistence_mode": r"Enabled|Disabled",
}
FAST_UNIT = UnitSpec(name="sglang", gpus=(0, 1, 2, 3), mib=30000, restart_sec=0.1, timeout_stop_sec=30.0)


def smi_memory(node: SimNode) -> list[str]:
    out = sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    assert out.returncode == 0, out
    return out.stdout.splitlines()



def fixture_row(path: Path) -> dict[str, str]:
    header, row = path.read_text().splitlines()[:2]
    return dict(zip(header.split(", "), row.split(", "), strict=True))


def registered_pid(node: SimNode, name: str) -> int:
    return next(reg["pid"] for reg in state.registrations(node.root) if reg["name"] == name)


# ---------------------------------------------------------------- memory and processes


def test_start_reports_memory_of_unit_stray_and_daemon(make_node: MakeNode) -> None:
    """A unit on GPUs 0-3 and a stray worker on 3-4 add up per GPU over the idle base."""
    spec = NodeSpec(name="mem", idle_mib=1, units=(FAST_UNIT,),
                    workers=(WorkerSpec(gpus=(3, 4), mib=2000, name="stray"),))
    node = make_node(spec)
    expected = [30001, 30001, 30001, 32001, 2001, 1, 1, 1]
    assert smi_memory(node) == [f"{i}, {mib}" for i, mib in enumerate(expected)]
    assert node.gpu_memory() == expected
    assert node.compute_pids() == {node.unit_main_pid("sglang"), registered_pid(node, "stray")}
    assert node.unit_state("sglang") == "active"


def test_device_holders_found_by_real_find(make_node: MakeNode) -> None:
    """The real `find` over /proc sees the workers and the daemon, not the unit supervisor."""
    node = make_node(NodeSpec(name="find", units=(FAST_UNIT,), workers=(WorkerSpec(gpus=(5,), mib=100),)))
    out = sh(node, f"find /proc/[0-9]*/fd -lname '{node.devices_glob}' 2>/dev/null | cut -d/ -f3 | sort -u")
    holders = {int(pid) for pid in out.stdout.split()}
    expected = {reg["pid"] for reg in state.registrations(node.root)}
    assert holders == expected
    assert len(expected) == 3
    assert state.read_unit(node.root, "sglang")["supervisor_pid"] not in holders


def test_worker_comm_is_cut_to_15_characters(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="comm"))
    pid = registered_pid(node, "nvidia-persistenced")
    assert Path(f"/proc/{pid}/comm").read_text() == "nvidia-persiste\n"
    assert sh(node, f"ps -o comm= -p {pid}").stdout.strip() == "nvidia-persiste"
    assert pid not in node.compute_pids()


def test_a_worker_looks_like_a_program_of_its_name(make_node: MakeNode) -> None:
    """argv[0] is ROOT/libexec/NAME (so ps shows the full name), /proc/PID/exe the interpreter."""
    node = make_node(NodeSpec(name="argv0"))
    pid = registered_pid(node, "nvidia-persistenced")
    assert sh(node, f"ps -ww -o args= -p {pid}").stdout.split()[0] == str(node.root / "libexec" / "nvidia-persistenced")
    assert Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("python")
    assert "FLEET_SIM_UNIT=" not in Path(f"/proc/{pid}/environ").read_text()
    assert not any(e.startswith("FLEET_SIM") for e in Path(f"/proc/{pid}/environ").read_text().split("\0"))


def test_a_units_worker_carries_the_units_name_and_systemctl_shows_restart(make_node: MakeNode) -> None:
    """The simulator's stand-in for cgroups: FLEET_SIM_UNIT in the unit's worker; Restart= as systemd shows it."""
    node = make_node(NodeSpec(name="unit-env", units=(UnitSpec(name="trainer", gpus=(1,), mib=10, restart="always"),)))
    pid = node.unit_main_pid("trainer.service")
    assert "FLEET_SIM_UNIT=trainer.service" in Path(f"/proc/{pid}/environ").read_text().split("\0")
    assert sh(node, "systemctl show --property=Restart -- trainer.service").stdout == "Restart=always\n"


def test_a_worker_can_start_a_child_and_run_as_another_user(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="family", protected_daemon=False))
    user = "nobody" if os.geteuid() == 0 else None
    helper = WorkerSpec(gpus=(2,), mib=0, name="helper", compute=False)
    pid = node.spawn_worker(WorkerSpec(gpus=(1,), mib=10, name="daemon", child=helper, user=user))
    [child] = node.children_of(pid)
    assert Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid)
    assert Path(f"/proc/{child}/comm").read_text() == "helper\n"
    assert child not in node.compute_pids() and pid in node.compute_pids()
    if user is not None:
        assert sh(node, f"ps -o user= -p {pid},{child}").stdout.split() == ["nobody", "root"]


def test_sigkilled_worker_memory_lingers_then_drops(make_node: MakeNode) -> None:
    """Like a driver tearing down a context: used memory outlives the process by ~linger_s."""
    node = make_node(NodeSpec(name="linger", linger_s=0.5, protected_daemon=False))
    pid = node.spawn_worker(WorkerSpec(gpus=(0,), mib=5000))
    os.kill(pid, signal.SIGKILL)
    assert soon(lambda: not node.alive(pid))
    killed_at = time.monotonic()
    assert smi_memory(node)[0] == "0, 5000"
    assert pid not in node.compute_pids()
    assert soon(lambda: smi_memory(node)[0] == "0, 0")
    assert time.monotonic() - killed_at >= 0.3  # it lingered; `soon` says it then dropped
    assert state.registrations(node.root) == []


def test_sigterm_records_death_time(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="term", linger_s=30.0, protected_daemon=False))
    pid = node.spawn_worker(WorkerSpec(gpus=(1,), mib=700))
    before = time.time()
    os.kill(pid, signal.SIGTERM)
    assert soon(lambda: not node.alive(pid))
    (reg,) = state.registrations(node.root)
    assert before <= reg["died_at"] <= time.time()
    assert node.gpu_memory()[1] == 700


def test_no_compute_worker_uses_memory_but_is_not_listed(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="graphics", protected_daemon=False))
    pid = node.spawn_worker(WorkerSpec(gpus=(2,), mib=300, name="Xorg", compute=False))
    assert node.gpu_memory()[2] == 300
    out = sh(node, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    assert (out.returncode, out.stdout) == (0, "")
    assert node.alive(pid)


# ---------------------------------------------------------------- nvidia-smi output formats


def test_query_gpu_header_matches_real_header(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="header"))
    out = sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv")
    lines = out.stdout.splitlines()
    assert lines[0] == "index, memory.used [MiB]"
    assert "memory.used [MiB]" in H100_IDLE_ALLFIELDS.read_text().splitlines()[0].split(", ")
    assert lines[1:] == [f"{i}, 0 MiB" for i in range(8)]
    assert out.stdout.endswith("MiB\n")


def test_verify_fields_have_the_real_shapes(make_node: MakeNode) -> None:
    """Header names and per-value shapes agree with a real H100 `--format=csv` capture."""
    node = make_node(NodeSpec(name="verify"))
    real = fixture_row(H100_IDLE_ALLFIELDS)
    out = sh(node, f"nvidia-smi --query-gpu={VERIFY_FIELDS} --format=csv")
    header, *rows = out.stdout.splitlines()
    assert len(rows) == 8
    ours = dict(zip(header.split(", "), rows[0].split(", "), strict=True))
    assert set(ours) == set(SHAPES) <= set(real)
    for column, shape in SHAPES.items():
        assert re.fullmatch(shape, real[column]), (column, real[column])
        assert re.fullmatch(shape, ours[column]), (column, ours[column])
    for column in ("memory.used [MiB]", "memory.total [MiB]", "memory.free [MiB]", "persistence_mode"):
        assert ours[column] == real[column], column


def test_nounits_values_are_bare_like_the_real_capture(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="nounits", units=(FAST_UNIT,)))
    real_header = P100_NOUNITS.read_text().splitlines()[0]
    assert "memory.used [MiB]" in real_header.split(", ")
    assert re.fullmatch(r"\d+", fixture_row(P100_NOUNITS)["memory.used [MiB]"])
    out = sh(node, "nvidia-smi --query-gpu=memory.used,memory.total --format=csv,nounits")
    header, *rows = out.stdout.splitlines()
    assert header == "memory.used [MiB], memory.total [MiB]"
    assert rows == ["30000, 81559"] * 4 + ["0, 81559"] * 4


def test_compute_apps_idle_is_the_real_header_alone(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="apps-idle"))
    out = sh(node, f"nvidia-smi --query-compute-apps={APPS_FIELDS} --format=csv")
    assert (out.returncode, out.stdout) == (0, APPS_IDLE.read_text())
    assert sh(node, f"nvidia-smi --query-compute-apps={APPS_FIELDS} --format=csv,noheader").stdout == ""


def test_compute_apps_rows_have_the_real_shape(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="apps-load", units=(FAST_UNIT,)))
    out = sh(node, f"nvidia-smi --query-compute-apps={APPS_FIELDS} --format=csv")
    header, *rows = out.stdout.splitlines()
    real_header, *real_rows = APPS_LOAD.read_text().splitlines()
    assert header == real_header
    row_shape = (
        r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}, NVIDIA H100 80GB HBM3, 0{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7], \d{13}, "
        r"GPU-[0-9a-f-]{36}, \d+, [^,]+, \d+ MiB"
    )
    assert all(re.fullmatch(row_shape, row) for row in real_rows)
    assert len(rows) == 4
    assert all(re.fullmatch(row_shape, row) for row in rows), rows
    pid = node.unit_main_pid("sglang")
    assert all(row.endswith(f", {pid}, python3, 30000 MiB") for row in rows)


def test_compute_apps_nounits_gpu_uuid_pid_name_memory(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="apps-min", protected_daemon=False))
    pid = node.spawn_worker(WorkerSpec(gpus=(6,), mib=1234, name="sglang::scheduler"))
    uuids = sh(node, "nvidia-smi --query-gpu=uuid --format=csv,noheader").stdout.split()
    query = "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv,noheader,nounits"
    out = sh(node, f"nvidia-smi {query}")
    assert out.stdout == f"{uuids[6]}, {pid}, sglang::scheduler, 1234\n"
    assert len(set(uuids)) == 8


def test_na_memory_gpu_prints_na(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="na", na_memory_gpus=(3,)))
    assert smi_memory(node)[3] == "3, [N/A]"
    out = sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader")
    assert out.stdout.splitlines()[3] == "3, [N/A]"
    assert node.gpu_memory()[3] is None


def test_missing_gpu_node_has_seven(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="seven", gpus=7))
    out = sh(node, "nvidia-smi --query-gpu=index,count --format=csv,noheader")
    assert out.stdout.splitlines() == [f"{i}, 7" for i in range(7)]
    assert sh(node, "nvidia-smi -L").stdout.count("NVIDIA H100 80GB HBM3 (UUID: GPU-") == 7


def test_unknown_field_is_the_real_error(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="badfield"))
    out = sh(node, "nvidia-smi --query-gpu=index,device_minor --format=csv,noheader,nounits")
    assert (out.returncode, out.stdout) == (2, 'Field "device_minor" is not a valid field to query.\n\n')


def test_driver_not_loaded_prints_the_real_message(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="nodriver"))
    node.set_smi_mode("driver-not-loaded")
    out = sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    expected = (FIXTURES / "error_driver-not-loaded.txt").read_text()
    assert (out.returncode, out.stdout) == (9, expected)
    with pytest.raises(SimError, match="unknown smi_mode"):
        node.set_smi_mode("on-fire")


def test_hung_nvidia_smi_is_ended_by_timeout(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="hang"))
    node.set_smi_mode("hang")
    started = time.monotonic()
    out = sh(node, "timeout 1 nvidia-smi --query-gpu=index --format=csv")
    assert out.returncode == 124
    assert time.monotonic() - started < 20  # timeout's 1 s ended it, not `sh`'s own 30 s
    node.set_smi_mode("ok")
    assert len(smi_memory(node)) == 8


def test_summary_table_lines_have_the_real_layout(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="table", idle_mib=1))
    ours = sh(node, "nvidia-smi").stdout.splitlines()
    real = TABLE_550.read_text().splitlines()
    expected = [re.sub(r"\d+C|\d+W /", _readings_of(ours[i]), line) for i, line in enumerate(real) if i > 0]
    assert ours[1 : len(real)] == expected
    assert "No running processes found" in ours[-2]


def _readings_of(ours: str) -> Callable[[re.Match[str]], str]:
    """Swap a real temperature or power reading for ours at the same columns (readings vary)."""

    def sub(match: re.Match[str]) -> str:
        return ours[match.start() : match.end()]

    return sub


# ---------------------------------------------------------------- systemctl and units


def test_show_unknown_unit_is_inactive_dead(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="show"))
    out = sh(node, "systemctl show --property=ActiveState,SubState,MainPID -- nope.service")
    assert (out.returncode, out.stdout) == (0, "MainPID=0\nActiveState=inactive\nSubState=dead\n")
    out = sh(node, "systemctl show --property=LoadState,ActiveState,SubState,MainPID -- nope.service")
    assert (out.returncode, out.stdout) == (0, "MainPID=0\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n")
    out = sh(node, "systemctl is-active nope")
    assert (out.returncode, out.stdout) == (3, "inactive\n")
    out = sh(node, "systemctl frobnicate nope")
    assert (out.returncode, out.stderr) == (1, "Unknown command verb frobnicate.\n")


def test_show_running_unit(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="running", units=(FAST_UNIT,)))
    pid = node.unit_main_pid("sglang")
    out = sh(node, "systemctl show -p ActiveState -p SubState -p MainPID sglang.service")
    assert out.stdout == f"MainPID={pid}\nActiveState=active\nSubState=running\n"
    assert sh(node, "systemctl show --property=MainPID --value sglang").stdout == f"{pid}\n"


def test_restart_always_unit_comes_back_with_new_pid(make_node: MakeNode) -> None:
    unit = UnitSpec(name="vllm", gpus=(0,), mib=100, restart="always", restart_sec=0.1)
    node = make_node(NodeSpec(name="restart", units=(unit,)))
    old = node.unit_main_pid("vllm")
    os.kill(old, signal.SIGKILL)
    assert soon(lambda: node.unit_main_pid("vllm") not in (0, old))
    new = node.unit_main_pid("vllm")
    assert node.unit_state("vllm") == "active"
    assert soon(lambda: new in node.compute_pids())
    assert {old, new} <= set(node.recorded_pids())


def test_stop_no_block_normal_unit_goes_inactive(make_node: MakeNode) -> None:
    """The stop goes on after `--no-block` returns (that it returns first: the stubborn unit's test below)."""
    node = make_node(NodeSpec(name="stop", units=(FAST_UNIT,)))
    pid = node.unit_main_pid("sglang")
    out = sh(node, "systemctl stop --no-block -- sglang.service")
    assert out.returncode == 0
    assert soon(lambda: node.unit_state("sglang") == "inactive", timeout=30.0)
    assert not node.alive(pid)
    assert sh(node, "systemctl show -p MainPID,ActiveState,SubState sglang").stdout == (
        "MainPID=0\nActiveState=inactive\nSubState=dead\n"
    )


def test_stop_ignore_sigterm_unit_until_killed(make_node: MakeNode) -> None:
    """SIGTERM is ignored: the unit stays deactivating until `systemctl kill` SIGKILLs it. `--no-block` returned
    while the stop had 60 s to go: it does not wait for the stop."""
    stubborn = UnitSpec(name="stubborn", gpus=(7,), mib=500, ignore_sigterm=True, timeout_stop_sec=60.0)
    node = make_node(NodeSpec(name="stubborn", units=(stubborn,)))
    pid = node.unit_main_pid("stubborn")
    assert sh(node, "systemctl stop --no-block -- stubborn").returncode == 0
    time.sleep(0.3)
    assert node.unit_state("stubborn") == "deactivating"
    assert node.alive(pid)
    assert sh(node, "systemctl kill --kill-whom=all --signal=SIGKILL -- stubborn").returncode == 0
    assert soon(lambda: node.unit_state("stubborn") in ("inactive", "failed"), timeout=30.0)
    assert not node.alive(pid)
    assert soon(lambda: not node.alive(state.read_unit(node.root, "stubborn")["supervisor_pid"]))


def test_stop_timeout_sigkills_and_fails(make_node: MakeNode) -> None:
    stubborn = UnitSpec(name="slow", gpus=(0,), mib=10, ignore_sigterm=True, timeout_stop_sec=0.3)
    node = make_node(NodeSpec(name="timeout", units=(stubborn,)))
    out = sh(node, "systemctl stop slow")
    assert out.returncode == 0
    assert sh(node, "systemctl show -p ActiveState,Result slow").stdout == "Result=timeout\nActiveState=failed\n"


def test_restart_always_unit_stops_for_good(make_node: MakeNode) -> None:
    unit = UnitSpec(name="always", gpus=(1,), mib=10, restart="always", restart_sec=0.1)
    node = make_node(NodeSpec(name="always", units=(unit,)))
    assert sh(node, "systemctl stop always && systemctl is-active always").stdout == "inactive\n"
    time.sleep(0.3)
    assert node.unit_state("always") == "inactive"
    assert node.unit_main_pid("always") == 0


def test_start_stopped_unit_again(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="again", units=(FAST_UNIT,)))
    first = node.unit_main_pid("sglang")
    assert sh(node, "systemctl stop sglang").returncode == 0
    assert sh(node, "systemctl start sglang").returncode == 0
    assert node.unit_state("sglang") == "active"
    assert node.unit_main_pid("sglang") not in (0, first)
    out = sh(node, "systemctl start nope")
    assert (out.returncode, out.stderr) == (5, "Failed to start nope.service: Unit nope.service not found.\n")


# ---------------------------------------------------------------- teardown


def test_stop_leaves_no_recorded_pid_alive(tmp_path: Path) -> None:
    unit = UnitSpec(name="always", gpus=(1,), mib=10, restart="always", restart_sec=0.05, ignore_sigterm=True)
    spec = NodeSpec(name="teardown", units=(unit, FAST_UNIT), workers=(WorkerSpec(gpus=(2,), mib=5),))
    node = SimNode(tmp_path / "teardown", spec)
    try:
        node.start()
        pids = node.recorded_pids()
        assert len(pids) >= 6  # daemon, stray worker, two supervisors, two unit workers
    finally:
        node.stop()
    assert [pid for pid in pids if node.alive(pid)] == []
    node.stop()


def test_layout_and_env(tmp_path: Path) -> None:
    node = SimNode(tmp_path / "layout", NodeSpec(name="layout", gpus=2))
    node.setup()
    assert sorted(p.name for p in node.dev_dir.iterdir()) == ["nvidia-uvm", "nvidia0", "nvidia1", "nvidiactl"]
    assert os.access(node.nvidia_smi_path, os.X_OK)
    assert node.env()["PATH"].split(os.pathsep)[0] == str(node.bin_dir)
    assert node.devices_glob == f"{node.root}/dev/nvidia*"
    node.stop()


# ---------------------------------------------------------------- the health gate's small reads

Q_D_PAGE_RETIREMENT = H100_IDLE_ALLFIELDS.parent / "8x-gpu_drv535.86.10_q-d-page-retirement_retired-pages-only.txt"


def test_health_fields_print_what_the_real_h100_prints(make_node: MakeNode) -> None:
    """The health gate's `--query-gpu` fields, with a header: the names and values of the real 590 capture."""
    node = make_node(NodeSpec(name="facts", driver_version="590.48.01"))  # the capture's driver
    out = sh(node, f"nvidia-smi --query-gpu={','.join(health.health_fields())} --format=csv")
    header, *rows = out.stdout.splitlines()
    real = fixture_row(H100_IDLE_ALLFIELDS)
    ours = dict(zip(header.split(", "), rows[0].split(", "), strict=True))  # `power.limit [W]`: with its unit
    assert len(rows) == 8 and [name.split(" [")[0] for name in ours] == list(health.health_fields())
    assert {k: v for k, v in ours.items() if k != "pci.bus_id"} == {k: real[k] for k in ours if k != "pci.bus_id"}


H200_580_FACTS = FIXTURES / "h200_drv580.159.04_1gpu_query-gpu-health-fields_csv-noheader-nounits_idle.csv"


def test_health_fields_print_what_the_real_h200_on_580_prints(make_node: MakeNode) -> None:
    """fleet's own health read (nounits, no header) on a node made like the real H200 (driver 580.159.04): the
    real capture's bytes, its bus id aside; before 590 the application clocks are values, in `-q` too."""
    node = make_node(NodeSpec(name="h200", gpus=1, gpu_name="NVIDIA H200", memory_total_mib=143771,
                              driver_version="580.159.04", vbios_version="96.00.A5.00.1A", fabric="N/A"))
    ours = sh(node, shlex.join(health.facts_argv("nvidia-smi"))).stdout
    real = H200_580_FACTS.read_text()
    assert ours.split(", ", 1)[1] == real.split(", ", 1)[1]
    q = sh(node, "nvidia-smi -q").stdout
    assert re.search(r"    Applications Clocks\n        Graphics +: 1980 MHz\n        Memory +: 3201 MHz\n", q), q


def test_q_d_keeps_the_real_shape_header_then_each_gpu_with_its_section_and_a_blank_line(
    make_node: MakeNode,
) -> None:
    """`-q -d PAGE_RETIREMENT` line for line like the real 8-GPU capture (values and bus ids aside)."""
    node = make_node(NodeSpec(name="display"))
    ours = sh(node, "nvidia-smi -q -d PAGE_RETIREMENT").stdout
    real = Q_D_PAGE_RETIREMENT.read_text()

    def shape(text: str) -> list[str]:
        return [line.split(":")[0].rstrip() if not line.startswith("GPU ") else "GPU" for line in text.split("\n")]

    assert shape(ours) == shape(real)
    remaps = sh(node, "nvidia-smi -q -d ROW_REMAPPER").stdout
    assert [health.GpuHealth.__name__ for _ in health.parse_all_health(remaps)] == ["GpuHealth"] * 8
    assert sh(node, "nvidia-smi -q -d BOGUS").returncode != 0


def test_the_health_reads_of_an_8_gpu_node_are_under_16_kb(make_node: MakeNode) -> None:
    """What verify reads for the health gate, against the whole `-q` it read before."""
    node = make_node(NodeSpec(name="bytes"))
    facts = sh(node, " ".join(health.facts_argv("nvidia-smi"))).stdout
    remaps = sh(node, " ".join(health.remaps_argv("nvidia-smi"))).stdout
    whole = sh(node, "nvidia-smi -q").stdout
    assert len(facts.encode()) + len(remaps.encode()) <= 16 * 1024 < len(whole.encode())
    merged = health.merge_remaps(health.parse_facts(facts) or (), health.parse_all_health(remaps))
    assert merged == tuple(h for h in health.parse_all_health(whole))  # the same facts, whichever way read
