"""Answers a scripted node gives to fleet's process probes, in the shapes the real commands print.

The holder scan says `init` (it saw /proc/1), ps lists pid 1 (it sees every process), the lineage walk
prints `pid ppid starttime comm`, and the identity-checked signal (signal.sh) says per target what it did.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from typing import Any

from fleet.node.probes import fabricmanager, health, kernel_log, procs
from fleet.reset import lock
from fleet.sim.nvidia_smi import displayed
from fleet.transport.scripted import Reply
from support.paths import FIXTURES

INIT_PS = "    1     0 root     /sbin/init\n"
# The holder scan's argv, as a script matches it (`fleet.node.probes.procs.holders_scan_argv`).
SCAN = ("sh", "-c", procs.SCAN_SH, "fleet-scan")
START = 4242  # every scripted process's start time (clock ticks since boot)


def scan(holders: str = "") -> str:
    """A holder scan's output that saw every process: the holder lines, and /proc/1, each record ended by NUL."""
    return "".join(f"hit\t{line}\0" for line in holders.splitlines()) + "init\0"


def exe_reply(exes: dict[int, str]) -> Reply:
    """The exe lookup's answer (GNU stat's %N, C-quoted) for pid -> executable path (plain ASCII)."""
    return Reply(stdout="".join(f'"/proc/{pid}/exe" -> "{path}"\n' for pid, path in exes.items()))


EXE = ("env", "LC_ALL=C", "QUOTING_STYLE=c", "stat")  # the exe lookup's argv, as a script's prefix
LINEAGE = ("env", "LC_ALL=C", "awk")  # the lineage walk's


def ps(rows: str) -> str:
    """ps output for the holders, and pid 1 (ps is always asked about it)."""
    return INIT_PS + rows


def pids_after(argv: Sequence[str], marker: str) -> list[int]:
    return [int(w) for w in argv[list(argv).index(marker) + 1:] if w.isdigit()]


def lineage(argv: Sequence[str], comm: str = "python3") -> Reply:
    """The lineage walk: the probe (pid 900) and every holder asked about are children of init."""
    holders = "".join(f"{pid}\t1\t{START}\t{comm}\n" for pid in pids_after(argv, "self"))
    return Reply(stdout=f"self\t900\n900\t1\t{START}\tawk\n{holders}1\t0\t1\tsystemd\n")


def targets(argv: Sequence[str]) -> tuple[str, list[int]]:
    """(signal, pids) of a signal.sh command: `sh -c PROGRAM fleet-signal SIG PID START EXE USER ...`."""
    at = list(argv).index("fleet-signal")
    words = list(argv[at + 2:])
    return argv[at + 1], [int(words[i]) for i in range(0, len(words), 4)]


def signal(alive_after: Callable[[str, int], bool] = lambda sig, pid: False,
           verdict: Callable[[str, int], str] | None = None) -> Callable[[Sequence[str]], Reply]:
    """signal.sh's answers: `sent` to TERM and KILL; to a look (`-`), `alive` while `alive_after(last signal,
    pid)` says so, else `gone`. `verdict`, when given, decides a signal's verdict instead of `sent`. The other sh
    programs fleet sends: the kernel-log read gets a healthy node's answer (KERNEL_LOG): a script's `("sh", "-c")`
    entry answers them all; put a kernel-log entry of its own before it to answer that otherwise. The lock
    command (sh too) is taken at once (`locked`); put a lock entry of its own before it for a busy one."""
    last: dict[int, str] = {}

    def answer(argv: Sequence[str]) -> Reply:
        if kernel_log.XIDS_AWK in argv:
            return kernel_log_reply()
        if lock.is_lock_argv(argv):
            return Reply(stdout=f"{lock.LOCKED_LINE}\n")
        sig, pids = targets(argv)
        lines = []
        for pid in pids:
            if sig == "-":
                lines.append(f"{'alive' if alive_after(last.get(pid, ''), pid) else 'gone'} {pid}")
            else:
                last[pid] = sig
                lines.append(f"{verdict(sig, pid) if verdict else 'sent'} {pid}")
        return Reply(stdout="".join(f"{line}\n" for line in lines))

    return answer


# A real `nvidia-smi -q` of one healthy GPU (tests/fixtures/nvidia-smi/SOURCES.md) and its bus id.
Q_CAPTURE = FIXTURES / "nvidia-smi" / "h200_drv590.48.01_1gpu_q_idle.txt"
Q_BUS_ID = "00000000:83:00.0"


def healthy_q(bus_id: str) -> str:
    """`nvidia-smi -q` of one healthy GPU at `bus_id`: the real capture, its bus id replaced."""
    return Q_CAPTURE.read_text().replace(Q_BUS_ID, bus_id)


# A real `--query-gpu` of every field on one idle H100 (590.48.01; tests/fixtures/nvidia-smi/SOURCES.md).
ALL_FIELDS_CAPTURE = (FIXTURES / "nvidia-smi"
                      / "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv")


def nounits(header: list[str], row: list[str]) -> dict[str, str]:
    """A `--format=csv` capture's row as `nounits` prints it, by field: `power.limit [W]`'s `700.00 W` is
    `power.limit`'s `700.00` (a note keeps its brackets and never had a unit)."""
    values = {}
    for name, value in zip(header, row, strict=True):
        field, _, unit = name.partition(" [")
        values[field] = value.removesuffix(" " + unit.rstrip("]")) if unit else value
    return values


def healthy_facts(bus_id: str) -> str:
    """The health gate's `--query-gpu` line of one healthy GPU at `bus_id`: the capture's values of those fields
    as `--format=csv,noheader,nounits` prints them, its bus id replaced."""
    header, row = (next(csv.reader([line], skipinitialspace=True))
                   for line in ALL_FIELDS_CAPTURE.read_text().splitlines()[:2])
    values = nounits(header, row)
    values["pci.bus_id"] = bus_id
    return ", ".join(values[field] for field in health.health_fields()) + "\n"


def healthy_remaps(bus_id: str) -> str:
    """`nvidia-smi -q -d ROW_REMAPPER` of one healthy GPU: the real -q capture kept to that section, as the
    simulated nvidia-smi keeps it (its shape checked against a real `-q -d` capture in test_sim_node.py)."""
    return displayed(healthy_q(bus_id), "ROW_REMAPPER")


# A journal cursor of journalctl's form (tests/fixtures/journalctl): where the kernel log's reads end.
CURSOR = "s=60435406595b49c2ad6597c8b8ca1832;i=b;b=0f1e2d3c4b5a69788796a5b4c3d2e1f0;m=130a77c500;t=620f6da9c8b80;x=1"
KERNEL_LOG = ("sh", "-c", kernel_log.KERNEL_LOG_SH)  # the kernel-log read's argv starts so


def kernel_log_reply(*lines: str, cursor: str = CURSOR, status: int = 0, stderr: str = "") -> Reply:
    """What the kernel-log read prints (xids.awk's summary) for journalctl's short-unix `lines` that name Xids,
    each its own group: a whole read ending at `cursor`; `status` and `stderr` are journalctl's."""
    groups = "".join(f"first 1 - {line}\n" for line in lines)
    end = f"-- cursor: {cursor}\n" if cursor and status == 0 else ""
    return Reply(stdout=f"{groups}{end}end {status} {len(lines)} 0 0\n", stderr=stderr, exit_status=status)


# The health gate's reads on a healthy one-GPU node: its health fields and row remapper, and a kernel log read
# whole with no Xid. Put them before any catch-all `--query-gpu=` answer (the first match wins).
# The GPU memory read as the reset begins (the report's memory_before_mib): one idle GPU.
BEFORE = (("nvidia-smi", "--query-gpu=index,uuid,memory.used,mig.mode.current"),
          Reply(stdout="0, GPU-aaaa, 0, Disabled\n"))
# The compute apps read with it (which GPU each process held: no process).
APPS_BEFORE = (("nvidia-smi", "--query-compute-apps="), Reply(stdout=""))
# verify's last section on a node without a fabric manager (no NVSwitch): the real `timeout` line, exit 127
# (tests/fixtures/fabricmanager/not-installed_stderr.txt).
NOT_INSTALLED = (FIXTURES / "fabricmanager" / "not-installed_stderr.txt").read_text()
NO_FABRIC_MANAGER = (fabricmanager.ARGV, Reply(stdout="", stderr=NOT_INSTALLED, exit_status=fabricmanager.NOT_FOUND))


def healthy(bus_id: str) -> list[tuple[tuple[str, ...], Reply]]:
    """The health gate's nvidia-smi reads of one healthy GPU at `bus_id` (`-q` too: an older driver's), and the
    fabric manager's version read with them (none: `NO_FABRIC_MANAGER`)."""
    return [
        (tuple(health.facts_argv("nvidia-smi")), Reply(stdout=healthy_facts(bus_id))),
        (tuple(health.remaps_argv("nvidia-smi")), Reply(stdout=healthy_remaps(bus_id))),
        (("nvidia-smi", "-q"), Reply(stdout=healthy_q(bus_id))),
        NO_FABRIC_MANAGER,
    ]


HEALTH = [*healthy("00000000:18:00.0"), (KERNEL_LOG, kernel_log_reply())]


class Log:
    """A HostLog that records every event a step logs, as (event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    debug = warning = error = exception = info  # every level is one event here

    def names(self) -> list[str]:
        return [event for event, _ in self.events]

    def first(self, name: str) -> dict[str, Any]:
        return next(fields for event, fields in self.events if event == name)
