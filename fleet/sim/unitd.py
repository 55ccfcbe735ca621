"""The systemd stand-in for one unit: runs its worker, restarts it, stops it.

    python -m fleet.sim.unitd --node ROOT --unit NAME

`systemctl start` launches one per unit in a new session. It opens no device
file itself; its worker runs as its child, with `FLEET_SIM_UNIT=NAME` in its
environment (the simulator's stand-in for the unit's cgroup, which fleet reads
on simulated nodes only), and it alone writes
ROOT/state/units/NAME.service.json (see `state.UnitStatus`):

* running: active/running with MainPID;
* the worker exits, no stop asked: Restart=always -> activating/auto-restart,
  then a new worker after restart_sec; otherwise inactive/dead (clean exit)
  or failed/failed;
* SIGTERM to unitd is a stop: deactivating/stop-sigterm, SIGTERM to the
  worker, SIGKILL after timeout_stop_sec (stop-sigkill, then failed/timeout);
  a clean exit ends inactive/dead. unitd exits once the stop is done.

Restart= may be "no", "always" or "on-failure".

As systemd does, exit 0 and death by SIGHUP, SIGINT, SIGTERM or SIGPIPE count
as clean.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from fleet.node.probes.units import SIM_NODE_VAR, SIM_UNIT_VAR
from fleet.sim import state, worker

# The simulator's stand-in for cgroups: the unit a process belongs to, in its environment. Declared here,
# where it is set; fleet's unit probe (fleet.node.probes.units) reads it on hosts with `simulated: true`.

CLEAN_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE})


def exit_result(returncode: int) -> str:
    """systemd's Result= for a main process that ended with `returncode`."""
    if returncode == 0 or (returncode < 0 and -returncode in CLEAN_SIGNALS):
        return "success"
    return "signal" if returncode < 0 else "exit-code"


def restarts(policy: str, result: str) -> bool:
    """Whether Restart=`policy` starts the worker again after an exit with `result`."""
    return policy == "always" or (policy == "on-failure" and result != "success")


class Supervisor:
    """Runs one unit's worker until a stop, or until it ends for good."""

    def __init__(self, root: Path, unit: state.UnitConfig) -> None:
        self.root = root
        self.unit = unit
        self.name = state.canonical_unit(unit["name"])
        self.stop_requested = False
        self.stop_deadline: float | None = None
        self.timed_out = False
        self.wakeup_r, self.wakeup_w = os.pipe()
        self.status = state.INACTIVE.copy()
        self.status["supervisor_pid"] = os.getpid()

    # ------------------------------------------------------------ plumbing

    def install_signals(self) -> None:
        os.set_blocking(self.wakeup_r, False)
        os.set_blocking(self.wakeup_w, False)
        signal.set_wakeup_fd(self.wakeup_w)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def publish(self, active: str, sub: str, result: str | None = None) -> None:
        self.status["ActiveState"] = active
        self.status["SubState"] = sub
        if result is not None:
            self.status["Result"] = result
        state.write_json(state.unit_path(self.root, self.name), self.status)

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.wakeup_r, 512)

    def worker_argv(self) -> list[str]:
        unit = self.unit
        options = ["--unit", self.name] + (["--ignore-term"] if unit["ignore_sigterm"] else [])
        return worker.command(self.root, unit["process_name"], unit["gpus"], unit["mib"], *options)

    def worker_env(self) -> dict[str, str]:
        """The unit's environment: the simulator's stand-in for the cgroup systemd would put it in."""
        return {**os.environ, SIM_UNIT_VAR: self.name, SIM_NODE_VAR: str(self.root)}

    # ------------------------------------------------------------ lifecycle

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the worker and publish active/running, under the unit lock."""
        with state.locked(state.unit_lock(self.root, self.name)):
            child = subprocess.Popen(self.worker_argv(), stdin=subprocess.DEVNULL, cwd=self.root, env=self.worker_env())
            state.append_pid(self.root, child.pid)
            self.status.update(
                {"MainPID": child.pid, "main_starttime": state.starttime(child.pid), "pids": [child.pid]}
            )
            self.publish("active", "running", "success")
        return child

    def begin_stop(self, child: subprocess.Popen[bytes]) -> None:
        self.stop_deadline = time.monotonic() + self.unit["timeout_stop_sec"]
        self.publish("deactivating", "stop-sigterm")
        child.send_signal(signal.SIGTERM)

    def kill_on_timeout(self, child: subprocess.Popen[bytes]) -> None:
        self.timed_out = True
        self.publish("deactivating", "stop-sigkill")
        child.kill()

    def wait_child(self, child: subprocess.Popen[bytes]) -> int:
        """Wait for the worker to exit, acting on stop requests and the stop timeout."""
        pidfd = os.pidfd_open(child.pid)
        try:
            while True:
                if self.stop_requested and self.stop_deadline is None:
                    self.begin_stop(child)
                timeout = None if self.stop_deadline is None else max(0.0, self.stop_deadline - time.monotonic())
                ready, _, _ = select.select([pidfd, self.wakeup_r], [], [], timeout)
                if pidfd in ready:
                    return child.wait()
                self._drain_wakeup()
                if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline and not self.timed_out:
                    self.kill_on_timeout(child)
        finally:
            os.close(pidfd)

    def pause(self, seconds: float) -> None:
        """Sleep `seconds`, waking early for a stop request."""
        deadline = time.monotonic() + seconds
        while not self.stop_requested and (left := deadline - time.monotonic()) > 0:
            select.select([self.wakeup_r], [], [], left)
            self._drain_wakeup()

    def child_exited(self) -> None:
        self.status.update({"MainPID": 0, "main_starttime": 0, "pids": []})

    def end(self, result: str) -> None:
        if result == "success":
            self.publish("inactive", "dead", result)
        else:
            self.publish("failed", "failed", result)

    def run(self) -> int:
        self.install_signals()
        while not self.stop_requested:
            returncode = self.wait_child(self.spawn())
            self.child_exited()
            result = "timeout" if self.timed_out else exit_result(returncode)
            if self.stop_requested or not restarts(self.unit["restart"], result):
                self.end(result)
                return 0
            self.publish("activating", "auto-restart", result)
            self.pause(self.unit["restart_sec"])
        self.publish("inactive", "dead", "success")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleet.sim.unitd", description=__doc__)
    parser.add_argument("--node", required=True, type=Path)
    parser.add_argument("--unit", required=True)
    args = parser.parse_args(argv)
    root = args.node.resolve()
    unit = state.find_unit(state.load_config(root), args.unit)
    if unit is None:
        print(f"Unit {state.canonical_unit(args.unit)} not found.", file=sys.stderr)
        return 1
    state.append_pid(root, os.getpid())
    return Supervisor(root, unit).run()


if __name__ == "__main__":
    sys.exit(main())
