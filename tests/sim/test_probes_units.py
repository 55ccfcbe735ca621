"""systemd probes: unit state, stop, kill and Restart= argvs and parsers; the unit a process runs in
(cgroups, or the simulator's stand-in); the probes' declarations; round trips on this machine."""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from support.processes import named_child as named_child  # the fixture: children killed after the test

from fleet.node.probe import ANY_EXIT
from fleet.node.probes import units
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.units import (
    SIM_UNIT_VAR,
    UnitState,
    cgroup_argv,
    parse_cgroups,
    parse_sim_units,
    parse_unit_restart,
    parse_unit_state,
    sim_units_argv,
    unit_kill_argv,
    unit_of_cgroup,
    unit_restart_argv,
    unit_state_argv,
    unit_stop_argv,
)
from fleet.sim import unitd
from fleet.transport.base import CommandResult


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


# --- systemd -------------------------------------------------------


def test_unit_argv_shapes() -> None:
    unit = "-weird@1.service"
    assert unit_state_argv(unit) == [
        "systemctl",
        "show",
        "--property=LoadState,ActiveState,SubState,MainPID",
        "--",
        unit,
    ]
    assert unit_stop_argv(unit) == ["systemctl", "stop", "--no-block", "--", unit]
    assert unit_kill_argv(unit) == ["systemctl", "kill", "--kill-who=all", "--signal=SIGKILL", "--", unit]
    assert unit_restart_argv(unit) == ["systemctl", "show", "--property=Restart", "--", unit]


def test_unit_kill_uses_the_spelling_every_systemd_accepts() -> None:
    """`--kill-whom=` is unknown before systemd 252 (Debian 11, Ubuntu 22.04, RHEL 8): `--kill-who=` works on all."""
    argv = unit_kill_argv("sglang.service")
    assert "--kill-who=all" in argv
    assert not [word for word in argv if word.startswith("--kill-whom")]


def test_this_machines_systemctl_accepts_the_kill_option() -> None:
    """systemctl reads its options in order: an unknown one fails before `--help` is reached."""
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl is not installed here")
    options = [w for w in unit_kill_argv("x.service") if w.startswith("--") and w != "--"]
    done = _run(["systemctl", *options, "--help"])
    assert done.returncode == 0, done.stderr
    assert _run(["systemctl", "--kill-no-such-option=all", "--help"]).returncode != 0  # not vacuous


@pytest.mark.parametrize(
    ("text", "restart"),
    [
        ("Restart=always\n", "always"),
        ("Id=x.service\nRestart=on-failure\n", "on-failure"),
        ("Restart=\n", None),
        ("", None),
        ("Failed to get properties: Access denied\n", None),
    ],
)
def test_parse_unit_restart(text: str, restart: str | None) -> None:
    assert parse_unit_restart(text) == restart


@pytest.mark.parametrize("make", [unit_state_argv, unit_stop_argv, unit_kill_argv, unit_restart_argv])
def test_unit_argv_rejects_empty(make: Callable[[str], list[str]]) -> None:
    with pytest.raises(ValueError, match="empty unit"):
        make(" ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ActiveState=active\nSubState=running\nMainPID=1234\n",
         UnitState(active_state="active", sub_state="running", main_pid=1234)),
        ("MainPID=0\nActiveState=inactive\nSubState=dead",
         UnitState(active_state="inactive", sub_state="dead", main_pid=None)),
        ("SubState=failed\nActiveState=failed\nMainPID=0\n",
         UnitState(active_state="failed", sub_state="failed", main_pid=None)),
        (
            "ActiveState=deactivating\nSubState=stop-sigterm\nMainPID=77\nId=x.service\n",
            UnitState(active_state="deactivating", sub_state="stop-sigterm", main_pid=77),
        ),
        ("ActiveState=activating\nSubState=\n", UnitState(active_state="activating", sub_state=None, main_pid=None)),
        # systemd's order: Service's properties, then Unit's (a unit the node does not have is inactive, dead)
        ("MainPID=0\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n",
         UnitState(active_state="inactive", sub_state="dead", main_pid=None, load_state="not-found")),
    ],
)
def test_parse_unit_state(text: str, expected: UnitState) -> None:
    assert parse_unit_state(text) == expected


@pytest.mark.parametrize(
    ("state", "down"), [("inactive", True), ("failed", True), ("active", False), ("deactivating", False)]
)
def test_unit_is_down(state: str, down: bool) -> None:
    assert UnitState(active_state=state, sub_state=None, main_pid=None).is_down is down


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("SubState=dead\nMainPID=0\n", "line 2: no ActiveState"),
        ("", "line 1: no ActiveState"),
        ("ActiveState=\nMainPID=0", "line 2: no ActiveState"),
        ("ActiveState=active\nMainPID=abc\n", "line 2: MainPID is not an integer"),
        ("ActiveState=active\nFailed to get properties\n", "line 2: expected Key=value"),
    ],
)
def test_parse_unit_state_malformed(text: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=reason):
        parse_unit_state(text)



# --- cgroups -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        ("/system.slice/sglang.service", "sglang.service"),
        ("/system.slice/sglang.service/payload", "sglang.service"),
        ("/system.slice/system-vllm.slice/vllm@1.service", "vllm@1.service"),
        ("/gpu.slice/trainer.service", "trainer.service"),
        ("/user.slice/user-1000.slice/session-3.scope", None),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service", None),
        ("/system.slice/docker-4f1c.scope", None),
        ("/init.scope", None),
        ("/", None),
        ("", None),
        ("/system.slice/foo\\x2dbar.service", None),
        ("/kubepods.slice/kubepods-pod1.slice/cri-containerd-9ab.scope", None),
        # a delegated sub-cgroup: the service's own subgroups may be named *.service; the unit is the top one
        ("/system.slice/containerd.service/kubepods-x.service", "containerd.service"),
        ("/system.slice/docker.service/inner.service/payload", "docker.service"),
        ("/system.slice/user-jobs.service/bad\\x2dname.service", "user-jobs.service"),
    ],
)
def test_unit_of_cgroup(path: str, unit: str | None) -> None:
    assert unit_of_cgroup(path) == unit


def test_cgroup_argv_shape() -> None:
    assert cgroup_argv([1, 4242]) == ["grep", "-s", "-H", "-e", "", "--", "/proc/1/cgroup", "/proc/4242/cgroup"]


def test_parse_cgroups_v2_v1_and_hybrid() -> None:
    text = (
        "/proc/4242/cgroup:0::/system.slice/sglang.service\n"  # cgroup v2
        "/proc/77/cgroup:12:memory:/system.slice/other.service\n"  # v1, not the systemd hierarchy
        "/proc/77/cgroup:1:name=systemd:/system.slice/trainer.service\n"  # v1
        "/proc/88/cgroup:1:name=systemd:/system.slice/old.service\n"  # hybrid: v2 line wins
        "/proc/88/cgroup:0::/system.slice/new.service\n"
        "/proc/99/cgroup:0::/user.slice/user-1000.slice/session-2.scope\n"
        "/proc/1/cgroup:0::/init.scope\n"
    )
    assert parse_cgroups(text) == {4242: "sglang.service", 77: "trainer.service", 88: "new.service"}


def test_parse_cgroups_names_the_unit_of_a_delegated_sub_cgroup() -> None:
    """containerd delegates its cgroup; a pod below it is no unit systemctl could stop: containerd is."""
    text = "/proc/4242/cgroup:0::/system.slice/containerd.service/kubepods-x.service\n"
    assert parse_cgroups(text) == {4242: "containerd.service"}


def test_parse_cgroups_this_machines_literal_lines() -> None:
    """A container's hybrid layout, as this machine printed it: every process in the root cgroup."""
    text = "".join(f"/proc/7/cgroup:{line}\n" for line in (
        "9:name=systemd:/", "8:pids:/", "4:memory:/process_api/4a7a5d7713c82d12643f3941005508e1", "0::/"))
    assert parse_cgroups(text) == {}


@pytest.mark.parametrize(
    "line", ["/proc/7/cgroup 0::/", "/proc/self/cgroup:0::/", "0::/system.slice/x.service", "/proc/7/cgroup:x::/"]
)
def test_parse_cgroups_malformed(line: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID/cgroup:ID:CONTROLLERS:PATH"):
        parse_cgroups(line)


def test_cgroup_round_trip_on_this_process() -> None:
    """The real /proc/self/cgroup here gives what the pure reading of its lines gives; a gone pid is skipped."""
    child = subprocess.Popen(["true"])
    child.wait()
    done = _run(cgroup_argv([os.getpid(), child.pid]))
    assert done.returncode == 2 and done.stderr == ""  # -s: a vanished pid is no noise
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    expected = {os.getpid(): u for u in (unit_of_cgroup(line.split(":", 2)[2]) for line in lines) if u}
    found = parse_cgroups(done.stdout)
    assert set(found) <= {os.getpid()}
    assert found.get(os.getpid()) in {*expected.values(), None}
    assert len(done.stdout.splitlines()) == len(lines)


# --- the simulator's stand-in for cgroups ------------------------------------------


def test_sim_units_argv_shape() -> None:
    assert sim_units_argv([5]) == ["grep", "-a", "-z", "-s", "-H", "-e", "^FLEET_SIM_UNIT=", "--", "/proc/5/environ"]


def test_parse_sim_units_golden() -> None:
    text = "/proc/5/environ:FLEET_SIM_UNIT=trainer.service\0/proc/6/environ:FLEET_SIM_UNIT=bad unit\0"
    assert parse_sim_units(text) == {5: "trainer.service"}
    assert parse_sim_units("") == {}


def test_parse_sim_units_malformed() -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID/environ:FLEET_SIM_UNIT=UNIT"):
        parse_sim_units("/proc/5/environ:HOME=/root\0")


def test_sim_units_round_trip_reads_that_variable_and_nothing_else(named_child: Callable[..., int]) -> None:
    env = {**os.environ, SIM_UNIT_VAR: "trainer.service", "API_TOKEN": "s3cret"}
    pid = named_child("trainer", env)
    plain = named_child("stray")
    done = _run(sim_units_argv([pid, plain]))
    assert parse_sim_units(done.stdout) == {pid: "trainer.service"}
    assert "s3cret" not in done.stdout


# --- which reading a host gets, and the variable's one declaration ------------------------------


@pytest.mark.parametrize("pids", [[5], [1, 4242]])
def test_units_of_reads_the_simulators_stand_in_only_on_a_simulated_host(pids: list[int]) -> None:
    assert units.units_of(pids, simulated=True).argv == tuple(sim_units_argv(pids))
    assert units.units_of(pids, simulated=False).argv == tuple(cgroup_argv(pids))
    assert units.units_of(pids, simulated=True).parse("/proc/5/environ:FLEET_SIM_UNIT=a.service\0") == {5: "a.service"}
    assert units.units_of(pids, simulated=False).parse("/proc/5/cgroup:0::/system.slice/a.service\n") == {
        5: "a.service"}


def test_sim_unit_var_is_declared_once_where_it_is_read() -> None:
    """The product declares the name; the simulator's unit supervisor imports it (never the other way round)."""
    assert vars(unitd)["SIM_UNIT_VAR"] is units.SIM_UNIT_VAR == "FLEET_SIM_UNIT"  # imported, not redeclared
    assigned = {t.id for node in ast.parse(inspect.getsource(unitd)).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    assert "SIM_UNIT_VAR" not in assigned


# --- the probes -------------------------------------------------------


def test_the_probes_run_those_argvs_and_say_which_exits_are_answers() -> None:
    unit = "sglang.service"
    assert units.unit_state(unit).argv == tuple(unit_state_argv(unit))
    assert units.unit_state(unit).parse("ActiveState=failed\n") == UnitState(active_state="failed", sub_state=None,
                                                                             main_pid=None)
    assert (units.unit_stop(unit).argv, units.unit_stop(unit).ok_exits) == (tuple(unit_stop_argv(unit)),
                                                                            frozenset({0, 5}))
    kill = units.unit_kill(unit)
    assert (kill.argv, kill.ok_exits, kill.needs_root) == (tuple(unit_kill_argv(unit)), frozenset({0}), True)
    refused = CommandResult(argv=kill.argv, exit_status=1, stdout="",
                            stderr="systemctl: unrecognized option '--kill-whom=all'\n", duration_s=0.01)
    assert not kill.answered(refused)  # a kill systemctl refused is no answer: the step fails with why
    assert kill.failure(refused) == (
        "systemctl kill sglang.service exited 1: systemctl: unrecognized option '--kill-whom=all'")
    restart = units.unit_restart(unit)
    assert (restart.argv, restart.ok_exits, restart.parse("Restart=always\n")) == (
        tuple(unit_restart_argv(unit)), ANY_EXIT, "always")


def test_a_unit_systemd_does_not_know_reads_as_missing_never_as_stopped() -> None:
    state = parse_unit_state("MainPID=0\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n")
    assert state.missing and state.is_down and state.label == "not-found"
    loaded = parse_unit_state("MainPID=0\nLoadState=loaded\nActiveState=inactive\nSubState=dead\n")
    assert not loaded.missing and loaded.label == "inactive"
