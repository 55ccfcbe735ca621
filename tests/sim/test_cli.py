"""The command line as users and cron jobs meet it: one-line usage errors, exit codes, prompts, Ctrl-C."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.demo_run import demo_env
from support.hung_fleet import fleet_commands_on, wait_for_drain
from support.hung_fleet import hung_fleet as hung_fleet  # the fixture: two nodes stuck in drain
from support.paths import REPO

import fleet
from fleet.cli.commands import main
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec

SITE = REPO / "inventory" / "site.yaml"


def run_cli(*args: str, stdin: int | None = subprocess.DEVNULL, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleet", *args], capture_output=True, text=True, stdin=stdin,
                          timeout=timeout, check=False, env=env)


def run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`fleet demo` with its temporary folder under tmp_path; workers a demo cut by the timeout left are ended by
    pid, and the test fails naming them."""
    with demo_env(tmp_path) as env:
        return run_cli("demo", *args, timeout=300, env=env)


def site_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME has the known_hosts files inventory/site.yaml names (empty: nothing connects)."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    for name in ("known_hosts", "known_hosts.rack-a"):
        (ssh / name).touch()
    return {**os.environ, "HOME": str(tmp_path / "home")}


@pytest.mark.parametrize(
    "args",
    [
        ["reset", "-i", str(SITE), "-y"],                       # no target
        ["reset", "-i", str(SITE), "-g", "nosuchgroup", "-y"],  # unknown group
        ["reset", "-i", str(SITE), "gpu-z99", "-y"],            # pattern that matches nothing
        ["reset", "-i", str(SITE), "--no-such-option"],         # typer's own usage error
        ["reset", "-i", "/nonexistent/inv.yaml", "gpu-b01"],    # missing inventory
        ["check", "gpu-b01"],                                   # no -i and no $FLEET_INVENTORY
        ["reset", "-i", str(SITE), "-g", "blackwell", "-j", "0", "-y"],  # bad value
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("fleet: error: ")


def test_version_prints_the_package_version_and_exits_0() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout == f"fleet {fleet.__version__}\n"
    assert importlib.metadata.version("gpu-fleet") == fleet.__version__  # pyproject reads the same declaration


def test_nothing_reads_outside_the_repository() -> None:
    """A fresh clone anywhere must pass: no path of the development machine in code, tests or tooling."""
    outside = re.compile("|".join([r"\.\./shared", "/wo" + "rk/"]))  # split so this line does not match itself
    places = [*REPO.glob("fleet/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("benchmarks/**/*.py"),
              REPO / "Makefile", REPO / ".ci" / "run", REPO / "pyproject.toml"]
    hits = [f"{p.relative_to(REPO)}:{n}" for p in places
            for n, line in enumerate(p.read_text().splitlines(), 1) if outside.search(line)]
    assert hits == []


def test_reset_of_several_hosts_refuses_without_a_terminal_or_yes(tmp_path: Path) -> None:
    proc = run_cli("reset", "-i", str(SITE), "-g", "hopper", env=site_home(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "fleet: error: refusing to reset 5 hosts (gpu-h[01-04,07]) without -y: stdin is not a terminal"
    ]


def test_inventory_json_lists_resolved_variables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "-i", str(SITE), "-g", "blackwell", "--limit", "gpu-b0[1-2]", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["hosts"]) == ["gpu-b01", "gpu-b02"]
    assert doc["hosts"]["gpu-b01"]["services"] == ["sglang.service"]


def test_inventory_table_is_human_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "-i", str(SITE), "gpu-h01"]) == 0
    out = capsys.readouterr().out
    assert "gpu-h01" in out and "address" in out


def test_inventory_table_fits_80_columns_a_host_a_line(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, 80 columns: a cell too wide is cut with an ellipsis, never wrapped; the host names whole."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["inventory", "-i", str(SITE), "-g", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    names = [line.split()[0] for line in lines[1:]]
    assert len(names) == len(set(names)) and all(name.startswith("gpu-") for name in names)
    assert any("…" in line for line in lines)  # something was cut (the groups, the services), not wrapped


@pytest.mark.parametrize(
    "command", [["reset", "-y"], ["reset", "--dry-run"], ["check"]], ids=["reset", "dry-run", "check"]
)
def test_a_missing_key_or_known_hosts_exits_2_before_connecting(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an unreachable host at connect time: one line naming the file and the key, no run folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts
    inventory = tmp_path / "site.yaml"
    inventory.write_text("hosts:\n  gpu-b01: {address: 192.0.2.1, identity_file: /nonexistent/id_fleet}\n"
                         "  gpu-b02: {address: 192.0.2.2}\n")
    logs = tmp_path / "logs"
    base = [command[0], "-i", str(inventory), *command[1:], "--log-dir", str(logs)]
    assert main([*base, "gpu-b01"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"fleet: error: {inventory}: hosts.gpu-b01.identity_file: /nonexistent/id_fleet does not exist\n"
    assert main([*base, "gpu-b02"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"fleet: error: {inventory}: defaults.known_hosts: ~/.ssh/known_hosts (the default, ")
    assert err.endswith("does not exist (host keys are always checked; set known_hosts or run ssh-keyscan)\n")
    assert not logs.exists()


def test_inventory_lists_hosts_whose_files_are_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet inventory` connects to nothing, so it works on a machine without the fleet's keys."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["inventory", "-i", str(SITE), "-g", "all", "--json"]) == 0
    assert "gpu-b01" in json.loads(capsys.readouterr().out)["hosts"]




async def test_ctrl_c_mid_run_exits_130_writes_the_report_and_leaves_nothing_running(
    hung_fleet: SimFleet, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    args = [sys.executable, "-m", "fleet", "reset", "-i", str(hung_fleet.inventory_path), "-g", "sim", "-y",
            "--json", "--log-dir", str(logs)]
    proc = await anyio.open_process(args)
    try:
        await wait_for_drain(logs)
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(40):  # well before the hung drain's 60 s would end the run: the signal ended it
            await proc.wait()
        assert proc.stdout is not None
        out = (await proc.stdout.receive()).decode() if proc.returncode is not None else ""
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130
    (summary,) = logs.glob("*/summary.json")
    doc = json.loads(summary.read_text())
    assert {h["status"] for h in doc["hosts"].values()} == {"failed"}
    assert {h["error"] for h in doc["hosts"].values()} == {"interrupted during drain"}
    assert out.strip().startswith("{")
    await anyio.sleep(0.5)
    assert fleet_commands_on(hung_fleet) == []
    for node in hung_fleet.nodes.values():
        assert node.unit_state("sglang.service") == "deactivating"  # interrupted mid-drain, not escalated




async def test_stalled_host_is_unreachable_within_connect_timeout(tmp_path: Path) -> None:
    specs = [NodeSpec(name=n) for n in ("gpu-b01", "gpu-b02")]
    host_vars: dict[str, dict[str, Any]] = {n: {"connect_timeout": 2} for n in ("gpu-b01", "gpu-b02")}
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        await sim.stall_server("gpu-b01")
        started = time.monotonic()
        result = await anyio.run_process(
            [sys.executable, "-m", "fleet", "check", "-i", str(sim.inventory_path), "-g", "sim", "--json",
             "--log-dir", str(tmp_path / "logs")], check=False)
        elapsed = time.monotonic() - started
    doc = json.loads(result.stdout)
    assert result.returncode == 4  # one host unreachable, none failed
    assert doc["hosts"]["gpu-b01"]["status"] == "unreachable"
    assert "timed out" in doc["hosts"]["gpu-b01"]["error"]
    assert doc["hosts"]["gpu-b02"]["status"] == "clean"
    assert elapsed < 40  # a stalled server never speaks: connect_timeout (2 s) ended it, however loaded the machine


def test_local_connection_resets_this_machine_s_simulated_node(tmp_path: Path) -> None:
    """connection: local runs the same commands as local processes (a node resetting itself from a timer)."""
    from fleet.sim.node import SimNode, WorkerSpec

    node = SimNode(tmp_path / "node", NodeSpec(name="self", linger_s=0.2))
    try:
        node.start()
        stray = node.spawn_worker(WorkerSpec(gpus=(0, 1), mib=5000, name="python3"))
        inventory = tmp_path / "local.yaml"
        inventory.write_text(json.dumps({"hosts": {"self": {
            "connection": "local", "devices": [node.devices_glob], "nvidia_smi": node.nvidia_smi_path,
            "gpus": 8, "kill_grace": 2, "settle_timeout": 10}}}))
        # the node's tools first on PATH, its journalctl among them (this machine's may have no journal to read, and
        # a kernel log fleet cannot read fails the host)
        proc = run_cli("reset", "-i", str(inventory), "self", "--json", "--log-dir", str(tmp_path / "logs"),
                       env=node.env())
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["hosts"]["self"]["status"] == "clean"
        assert not node.alive(stray)
        assert node.gpu_memory() == [0] * 8
        assert os.path.exists(tmp_path / "logs" / doc["run_id"] / "self.jsonl")
    finally:
        node.stop()


async def test_run_deadline_ends_the_run_and_leaves_nothing_running(hung_fleet: SimFleet, tmp_path: Path) -> None:
    """--deadline 8s while both hosts sit in a hung drain (60 s of it): exit 1 soon after, report whole, nothing
    left behind. 8 s: room for both hosts to connect and reach drain on a loaded machine."""
    started = time.monotonic()
    result = await anyio.run_process(
        [sys.executable, "-m", "fleet", "reset", "-i", str(hung_fleet.inventory_path), "-g", "sim", "-y",
         "--deadline", "8s", "--json", "--log-dir", str(tmp_path / "logs")], check=False)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert elapsed < 40  # well before the hung drain's 60 s would end it: the deadline did, however loaded the machine
    doc = json.loads(result.stdout)
    assert {h["error"] for h in doc["hosts"].values()} == {"run deadline of 8 s reached during drain"}
    await anyio.sleep(0.5)
    assert fleet_commands_on(hung_fleet) == []


def test_confirmation_prompt_on_a_terminal_names_count_and_groups(tmp_path: Path) -> None:
    """Without -y, on a terminal: the prompt shows the count, the hosts and their groups; 'n' does nothing."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fleet", "reset", "-i", str(SITE), "-g", "hopper",
                                 "--log-dir", str(tmp_path / "logs")], stdin=follower, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=site_home(tmp_path))
        os.write(leader, b"n\n")
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    assert proc.returncode == 1
    assert out == ""
    assert "Reset 5 hosts gpu-h[01-04,07] (groups: canary, hopper, rack-a)? [y/N]" in err
    assert "nothing done" in err
    assert not (tmp_path / "logs").exists(), "a declined reset writes no run folder"


def test_the_demo_runs_end_to_end_and_ends_as_expected(tmp_path: Path) -> None:
    """`make demo`'s job, small: a simulated fleet reset over SSH, one node failed by its health gate, torn down.
    Its runs go to its own state folder, never the operator's ($FLEET_LOG_DIR and `fleet runs` stay untouched),
    and its nodes' names are no real inventory's."""
    state, real = tmp_path / "state", tmp_path / "real-logs"
    with demo_env(tmp_path) as env:
        proc = run_cli("demo", "--nodes", "2", timeout=300,
                       env={**env, "XDG_STATE_HOME": str(state), "FLEET_LOG_DIR": str(real)})
    assert proc.returncode == 0, proc.stderr
    assert "demo-b01 clean" in proc.stderr
    assert "demo-b02 failed health: gpu 5: Xid 79" in proc.stderr
    assert "simulated fleet torn down" in proc.stderr
    demo_logs = state / "fleet" / "demo"
    assert f"the demo's runs are kept apart from yours: fleet runs --log-dir {demo_logs}" in proc.stderr
    assert (demo_logs / "history.sqlite").is_file() and not real.exists() and not (state / "fleet" / "runs").exists()


def test_the_demo_of_eight_restores_the_settings_left_and_names_the_older_driver(tmp_path: Path) -> None:
    """From eight nodes: demo-b03's locked clocks and demo-b05's lowered power limit given back (each change its own
    event in the node's log), demo-b07's older driver and fabric manager named the odd one out by both."""
    proc = run_demo(tmp_path, "--nodes", "8", "--log-dir", str(tmp_path / "logs"))
    assert proc.returncode == 0, proc.stderr
    assert ("settings: demo-b07 driver 535.183.01 (7 others 550.90.07); demo-b07 fabric manager 535.183.01 (7 others"
            " 550.90.07)") in proc.stderr
    assert "restored and read back" in proc.stderr
    (run,) = [p for p in (tmp_path / "logs").iterdir() if p.is_dir()]

    def changes(host: str) -> list[list[str]]:
        """The nvidia-smi commands that changed a GPU (`nvidia-smi -i N ...`), as the host's log says they ran."""
        lines = [json.loads(line) for line in (run / f"{host}.jsonl").read_text().splitlines()]
        return [e["argv"][1:] for e in lines if e["event"] == "command" and e["argv"][1:2] == ["-i"]]

    assert changes("demo-b03") == [["-i", "2", "-rgc"], ["-i", "2", "-rmc"], ["-i", "2", "-rac"]]
    assert changes("demo-b05") == [["-i", "3", "-pl", "700"]]
    assert changes("demo-b01") == []


# --- Slurm's options and hosts named outright ----------------------------------------------------------


def test_w_without_an_inventory_uses_the_built_in_defaults(tmp_path: Path) -> None:
    """No inventory needed; a missing default known_hosts is exit 2 naming where the value came from."""
    env = {k: v for k, v in os.environ.items() if k != "FLEET_INVENTORY"}
    env["HOME"] = str(tmp_path)
    out = run_cli("reset", "-w", "gpu-x[01-02]", "--dry-run", env=env)
    assert out.returncode == 2
    assert out.stderr.startswith("fleet: error: built-in defaults: defaults.known_hosts: ~/.ssh/known_hosts")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--via", "telnet"], "--via takes ssh or srun, not 'telnet'"),
        (["--drain-wait", "soon", "--slurm"], "--drain-wait takes a duration"),
        (["--partition", "gpu"], "--partition needs --slurm"),
        (["--scheduler", "pbs"], "fleet: error: --scheduler: no scheduler 'pbs' (known: slurm)"),
        (["--drain-wait", "soon", "--scheduler", "slurm"], "--drain-wait takes a duration"),  # --slurm's alias
    ],
)
def test_slurm_options_are_checked_before_anything_runs(args: list[str], message: str) -> None:
    out = run_cli("reset", "-i", str(SITE), "-g", "blackwell", "--dry-run", *args)
    assert out.returncode == 2 and message in out.stderr and out.stdout == ""


def test_node_run_outside_srun_says_how_it_is_meant_to_run() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    out = run_cli("node-run", env=env)
    assert out.returncode == 2 and "run me through srun (--via srun)" in out.stderr


# --- shell completion, examples and exit codes in --help ------------------------------------------------


def test_shell_completion_completes_commands_and_options() -> None:
    env = {**os.environ, "_FLEET_COMPLETE": "complete_bash", "COMP_WORDS": "fleet reset --dr", "COMP_CWORD": "2"}
    out = run_cli(env=env)
    assert out.returncode == 0 and out.stdout.split() == ["--dry-run", "--drain-wait"]
    script = run_cli("--show-completion", "bash")
    assert script.returncode == 0 and "_fleet_completion" in script.stdout


@pytest.mark.parametrize("command", ["reset", "check"])
def test_help_shows_examples_and_exit_codes(command: str) -> None:
    out = run_cli(command, "--help")
    assert out.returncode == 0
    assert "Examples:" in out.stdout and f"fleet {command} " in out.stdout.split("Examples:")[1]
    assert "130  interrupted" in out.stdout and "2    usage or inventory error" in out.stdout
    assert "129  the terminal hung up (SIGHUP)" in out.stdout
