"""A simulated GPU process: holds device files and "uses" memory until it dies.

    python -m fleet.sim.worker --node ROOT --gpus 0,1 --mib 30000 [--name sglang]
        [--ignore-term] [--no-compute] [--unit NAME] [--user NAME]
        [--child-name NAME --child-gpus 2 --child-mib 500 [--child-no-compute]]

`command()` starts one under its own name (argv[0] is ROOT/libexec/NAME, see
`state.launcher`). It renames itself (/proc/self/comm, which the kernel cuts to
15 characters), opens ROOT/dev/nvidiactl and ROOT/dev/nvidia<i> for each of its
GPUs, registers in ROOT/state/procs/PID.json, appends its pid to pids.log, then
waits for a signal. SIGTERM or SIGINT records `died_at` and exits 0; with
--ignore-term, SIGTERM is ignored. SIGKILL leaves no trace; nvidia-smi notices
the death. With --child-name it first starts a worker of its own (its child,
as a daemon's helper is), listed in its registration; with --user (root only)
it runs as that user once registered, its device files still open.
Stdlib only: it must start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fleet.sim import state


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fleet.sim.worker", description=__doc__)
    parser.add_argument("--node", required=True, type=Path, help="the node directory ROOT")
    parser.add_argument("--gpus", default="", help="comma-separated GPU indices")
    parser.add_argument("--mib", type=int, default=0, help="MiB used on each of its GPUs")
    parser.add_argument("--name", default="python3", help="process name (comm)")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    parser.add_argument("--no-compute", action="store_true", help="not listed as a compute app")
    parser.add_argument("--unit", default="", help="the unit that started it, if any")
    parser.add_argument("--user", default="", help="run as this user once registered (root only)")
    parser.add_argument("--child-name", default="", help="start a child worker with this name")
    parser.add_argument("--child-gpus", default="", help="the child's GPUs")
    parser.add_argument("--child-mib", type=int, default=0, help="the child's MiB on each of its GPUs")
    parser.add_argument("--child-no-compute", action="store_true", help="the child is no compute app")
    return parser.parse_args(argv)


def command(root: Path, name: str, gpus: Sequence[int], mib: int, *options: str) -> list[str]:
    """The argv that starts a worker called `name` (run it as is: argv[0] is its launcher)."""
    argv = [state.launcher(root, name), "-m", "fleet.sim.worker", "--node", str(root)]
    return [*argv, "--gpus", ",".join(map(str, gpus)), "--mib", str(mib), "--name", name, *options]


def start_child(root: Path, args: argparse.Namespace) -> list[int]:
    """Start the --child-name worker, if asked (before signals are blocked: it starts clean)."""
    if not args.child_name:
        return []
    options = ["--no-compute"] if args.child_no_compute else []
    argv = command(root, args.child_name, parse_gpus(args.child_gpus), args.child_mib, *options)
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=root)
    return [child.pid]


def become(user: str) -> None:
    """Drop to `user` (its uid and gid, no supplementary groups)."""
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)


def parse_gpus(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def set_comm(name: str) -> None:
    """Rename this process as `ps`/`/proc/PID/comm` show it (the kernel keeps 15 bytes)."""
    with open("/proc/self/comm", "w") as comm:
        comm.write(name)


def open_devices(root: Path, gpus: list[int]) -> list[int]:
    """Open (and keep open) dev/nvidiactl plus each GPU's device file (dev/nvidia<minor number>)."""
    config = state.load_config(root)
    names = ["nvidiactl", *(state.device_file(config, gpu) for gpu in gpus)]
    return [os.open(root / "dev" / name, os.O_RDONLY) for name in names]


def registration(args: argparse.Namespace, gpus: list[int]) -> state.Registration:
    pid = os.getpid()
    reg: state.Registration = {
        "pid": pid,
        "starttime": state.starttime(pid),
        "name": args.name,
        "gpus": gpus,
        "mib": args.mib,
        "compute": not args.no_compute,
    }
    if args.unit:
        reg["unit"] = state.canonical_unit(args.unit)
    return reg


def wait_for_end(ignore_term: bool) -> None:
    """Block until a terminating signal; the signals were blocked earlier, so none is lost."""
    wanted = {signal.SIGINT} if ignore_term else {signal.SIGINT, signal.SIGTERM}
    signal.sigwait(wanted)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.node.resolve()
    children = start_child(root, args)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    gpus = parse_gpus(args.gpus)
    set_comm(args.name)
    open_devices(root, gpus)
    reg = registration(args, gpus)
    if children:
        reg["children"] = children
    state.register(root, reg)
    state.append_pid(root, reg["pid"])
    if args.user:
        become(args.user)
    wait_for_end(args.ignore_term)
    with contextlib.suppress(PermissionError):  # as --user it may not write the node's state: no trace, as SIGKILL
        state.mark_died(root, reg["pid"], reg["starttime"], time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
