"""A `systemctl` for simulated nodes: the forms fleet uses, plus start.

    systemctl show [--property=A,B | -p A] [--value] [--] UNIT...
    systemctl [--no-block] stop [--] UNIT...
    systemctl kill [--kill-who=main|all] [--signal=SIGKILL | -s KILL] [--] UNIT...
    systemctl start [--] UNIT...
    systemctl is-active [-q] [--] UNIT...

ROOT/bin/systemctl runs `python -m fleet.sim.systemctl --node ROOT ARGS...`.
`start` launches a `fleet.sim.unitd` supervisor in its own session; `stop`
sends that supervisor SIGTERM (and, without --no-block, waits until the unit
is down); `kill` signals the unit's processes directly, as systemd would.
Output and exit codes follow systemd: unknown units show as inactive/dead,
`is-active` exits 3 unless active, an unknown verb exits 1. `--kill-whom=` (the
newer spelling of `--kill-who=`) is known from systemd 252 on: a node whose
`systemd_version` is older rejects it as real systemd does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fleet.sim import state

# The order systemd prints properties in (Service interface first, then Unit).
PROPERTY_ORDER = ("Type", "Restart", "MainPID", "Result", "Id", "LoadState", "ActiveState", "SubState")
FLAGS = frozenset({"--no-block", "--value", "--quiet", "-q", "--no-pager", "--no-legend", "--system"})
VALUE_OPTIONS = {"--property": "properties", "-p": "properties", "--kill-whom": "kill_whom"}
VALUE_OPTIONS |= {"--kill-who": "kill_whom", "--signal": "signal", "-s": "signal"}
# The first systemd that knows `--kill-whom=` (older ones: Debian 11's 247, Ubuntu 22.04's 249, RHEL 8's 239).
KILL_WHOM_SINCE = 252
START_TIMEOUT_S = 10.0
STOP_ACK_TIMEOUT_S = 2.0


class SystemctlError(Exception):
    """A failure systemctl reports on stderr with exit status `code`."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Invocation:
    """One parsed command line."""

    def __init__(self) -> None:
        self.verb = ""
        self.units: list[str] = []
        self.flags: set[str] = set()
        self.properties: list[str] = []
        self.kill_whom = "all"
        self.signal = "SIGTERM"

    def set_option(self, option: str, value: str) -> None:
        field = VALUE_OPTIONS[option]
        if field == "properties":
            self.properties += [p for p in value.split(",") if p]
        else:
            setattr(self, field, value)


def _split_option(token: str) -> tuple[str, str | None]:
    if token.startswith("--") and "=" in token:
        name, value = token.split("=", 1)
        return name, value
    if token[:2] in ("-p", "-s") and len(token) > 2:
        return token[:2], token[2:]
    return token, None


def parse(argv: list[str], version: int = KILL_WHOM_SINCE) -> Invocation:
    """Options anywhere, `--` ends them; the first positional word is the verb. `version`: the systemd
    this systemctl pretends to be (options newer than it are unrecognized)."""
    inv, positional, tokens = Invocation(), [], iter(argv)
    for token in tokens:
        if token == "--":
            positional += list(tokens)
            break
        name, value = _split_option(token)
        if name == "--kill-whom" and version < KILL_WHOM_SINCE:
            raise SystemctlError(f"systemctl: unrecognized option '{token}'", 1)
        if name in FLAGS:
            inv.flags.add("--quiet" if name == "-q" else name)
        elif name in VALUE_OPTIONS:
            inv.set_option(name, value if value is not None else next(tokens, ""))
        elif token.startswith("-") and token != "-":
            raise SystemctlError(f"systemctl: unrecognized option '{token}'", 1)
        else:
            positional.append(token)
    if not positional:
        raise SystemctlError("Too few arguments.", 1)
    inv.verb, inv.units = positional[0], positional[1:]
    return inv


# ---------------------------------------------------------------- verbs


def _unit_or_error(root: Path, name: str, action: str, code: int) -> state.UnitConfig:
    unit = state.find_unit(state.load_config(root), name)
    if unit is None:
        full = state.canonical_unit(name)
        raise SystemctlError(f"Failed to {action} {full}: Unit {full} not loaded.", code)
    return unit


def _settled(root: Path, name: str) -> bool:
    return state.read_unit(root, name)["ActiveState"] in ("inactive", "failed")


def start_unit(root: Path, name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes] | None:
    """Launch the unit's supervisor and wait until it is up; None if it already ran."""
    if state.find_unit(state.load_config(root), name) is None:
        full = state.canonical_unit(name)
        raise SystemctlError(f"Failed to start {full}: Unit {full} not found.", 5)
    full = state.canonical_unit(name)
    with state.locked(state.units_dir(root) / f"{full}.start.lock"):
        if state.read_unit(root, name)["ActiveState"] in ("active", "activating"):
            return None
        state.wait_for(lambda: _settled(root, name), timeout=float("inf"))
        return _launch_supervisor(root, full, env)


def _launch_supervisor(root: Path, full: str, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "fleet.sim.unitd", "--node", str(root), "--unit", full]
    with open(root / "log" / f"unitd-{full}.log", "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=root, env=env, start_new_session=True
        )
    state.append_pid(root, proc.pid)

    def up() -> bool:
        return proc.poll() is not None or state.read_unit(root, full)["supervisor_pid"] == proc.pid

    state.wait_for(up, START_TIMEOUT_S)
    if proc.poll() is not None and state.read_unit(root, full)["supervisor_pid"] != proc.pid:
        raise SystemctlError(f"Job for {full} failed. See {root / 'log'} for details.", 1)
    return proc


def stop_unit(root: Path, name: str, block: bool = True) -> None:
    """SIGTERM the unit's supervisor; wait for the stop to begin, and with `block` to end."""
    _unit_or_error(root, name, "stop", 5)
    status = state.read_unit(root, name)
    supervisor = status["supervisor_pid"]
    if status["ActiveState"] in ("inactive", "failed") or not _is_unitd(supervisor):
        return
    os.kill(supervisor, signal.SIGTERM)
    state.wait_for(lambda: state.read_unit(root, name)["ActiveState"] != "active", STOP_ACK_TIMEOUT_S)
    if block:
        state.wait_for(lambda: _settled(root, name), timeout=float("inf"))


def _is_unitd(pid: int) -> bool:
    return pid > 0 and state.pid_alive(pid) and "fleet.sim.unitd" in state.cmdline(pid)


def kill_unit(root: Path, name: str, whom: str = "all", signame: str = "SIGTERM") -> None:
    """Send `signame` to the unit's main process (whom=main) or all its processes."""
    _unit_or_error(root, name, "kill unit", 1)
    signum = parse_signal(signame)
    with state.locked(state.unit_lock(root, name)):
        status = state.read_unit(root, name)
        pids = [status["MainPID"]] if whom == "main" else status["pids"]
        for pid in pids:
            start = status["main_starttime"] if pid == status["MainPID"] else None
            if pid > 0 and state.pid_alive(pid, start):
                os.kill(pid, signum)


def parse_signal(name: str) -> signal.Signals:
    """`SIGKILL`, `KILL`, `kill` or `9`, as systemctl accepts them."""
    if name.isdigit():
        return signal.Signals(int(name))
    upper = name.upper()
    try:
        return signal.Signals[upper if upper.startswith("SIG") else f"SIG{upper}"]
    except KeyError:
        raise SystemctlError(f"Failed to parse signal string {name}.", 1) from None


def properties(root: Path, name: str) -> dict[str, str]:
    """Every property `show` knows for `name`, in systemd's order."""
    unit = state.find_unit(state.load_config(root), name)
    status = state.read_unit(root, name)
    values = {
        "Type": "simple",
        "Restart": unit["restart"] if unit else "no",
        "MainPID": str(status["MainPID"]),
        "Result": status["Result"],
        "Id": state.canonical_unit(name),
        "LoadState": "loaded" if unit else "not-found",
        "ActiveState": status["ActiveState"],
        "SubState": status["SubState"],
    }
    return {key: values[key] for key in PROPERTY_ORDER}


def show(root: Path, inv: Invocation) -> str:
    blocks = []
    for name in inv.units:
        props = properties(root, name)
        wanted = [k for k in props if not inv.properties or k in inv.properties]
        lines = [props[k] if "--value" in inv.flags else f"{k}={props[k]}" for k in wanted]
        blocks.append("".join(f"{line}\n" for line in lines))
    return "\n".join(blocks)


# ---------------------------------------------------------------- dispatch


def _need_units(inv: Invocation) -> None:
    if not inv.units:
        raise SystemctlError("Too few arguments.", 1)


def _cmd_show(root: Path, inv: Invocation) -> int:
    _need_units(inv)
    sys.stdout.write(show(root, inv))
    return 0


def _cmd_is_active(root: Path, inv: Invocation) -> int:
    _need_units(inv)
    states = [state.read_unit(root, name)["ActiveState"] for name in inv.units]
    if "--quiet" not in inv.flags:
        sys.stdout.write("".join(f"{s}\n" for s in states))
    return 0 if "active" in states else 3


def _cmd_start(root: Path, inv: Invocation) -> int:
    _need_units(inv)
    for name in inv.units:
        start_unit(root, name)
    return 0


def _cmd_stop(root: Path, inv: Invocation) -> int:
    _need_units(inv)
    for name in inv.units:
        stop_unit(root, name, block="--no-block" not in inv.flags)
    return 0


def _cmd_kill(root: Path, inv: Invocation) -> int:
    _need_units(inv)
    for name in inv.units:
        kill_unit(root, name, inv.kill_whom, inv.signal)
    return 0


COMMANDS: dict[str, Callable[[Path, Invocation], int]] = {
    "show": _cmd_show,
    "is-active": _cmd_is_active,
    "start": _cmd_start,
    "stop": _cmd_stop,
    "kill": _cmd_kill,
}


def run(root: Path, argv: list[str]) -> int:
    """Execute one systemctl command line against the node at `root`; the exit status."""
    try:
        inv = parse(argv, state.load_config(root)["systemd_version"])
        command = COMMANDS.get(inv.verb)
        if command is None:
            raise SystemctlError(f"Unknown command verb {inv.verb}.", 1)
        return command(root, inv)
    except SystemctlError as err:
        sys.stderr.write(f"{err}\n")
        return err.code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["--node"] or len(args) < 2:
        sys.stderr.write("usage: python -m fleet.sim.systemctl --node ROOT ARGS...\n")
        return 1
    return run(Path(args[1]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
