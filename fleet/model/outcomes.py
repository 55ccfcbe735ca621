"""The words every layer shares about how things ended: a host's status, a step's name and status, the reason
a host did not end clean, a verdict, how much a health finding weighs (`Level`), and what one remote command
did (`CommandResult`). A leaf: it imports nothing of fleet, so the lowest layers (errors, transport, node) speak
of outcomes without depending on the report layer (`fleet.model.report` and `fleet.transport.base` re-export
them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ParamSpec


class HostStatus(StrEnum):
    CLEAN = "clean"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"
    PLANNED = "planned"


class StepName(StrEnum):
    DRAIN = "drain"
    KILL = "kill"
    SETTLE = "settle"
    VERIFY = "verify"


class StepStatus(StrEnum):
    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"  # in flight when the run was cut short (a signal, --deadline): its error says which


class Reason(StrEnum):
    """Why a host did not end clean: a stable code for scripts, dashboards and history (docs/report-and-history.md)."""

    MEMORY_HELD = "memory_held"  # GPU memory still used after settle (or at verify)
    MEMORY_LEAKED = "memory_leaked"  # GPU memory no process holds after settle (a complete scan): a leaked context
    MEMORY_HELD_BY_JOB = "memory_held_by_job"  # GPU memory held only by a scheduler's jobs' processes (kept)
    RESPAWNED = "respawned"  # a killed holder came back
    HOLDERS_LEFT = "holders_left"  # a process fleet may kill still holds a device at verify
    KILL_FAILED = "kill_failed"  # a signal was refused, or a holder's identity could not be checked
    DRAIN_FAILED = "drain_failed"  # a service would not stop
    NEEDS_REBOOT = "needs_reboot"  # memory survived a GPU reset (--gpu-reset)
    GPU_MISSING = "gpu_missing"  # fewer GPUs than `gpus`
    NOT_UNIFORM = "not_uniform"  # --uniform: the host's GPU settings differ from the run's other hosts'
    HEALTH = "health"  # the health gate failed (Xid, ECC, remapping, fabric, PCIe...)
    GPU_SETTINGS = "gpu_settings"  # a GPU's settings are not the host's profile, with `health_fail: [gpu_settings]`
    KERNEL_LOG = "kernel_log"  # the kernel log could not be read to its end: the Xid check cannot pass
    BLIND_SCAN = "blind_scan"  # the holder scan could not see every process
    PROBE_FAILED = "probe_failed"  # a command on the node failed or printed what fleet cannot read
    COMMAND_TIMEOUT = "command_timeout"  # a command on the node did not answer in time
    LOCKED = "locked"  # another run holds the node's reset lock
    NOT_PERMITTED = "not_permitted"  # the user fleet runs as may not create the reset lock folder (not root)
    AUTH = "auth"  # SSH authentication, or sudo, refused
    HOST_KEY = "host_key"  # the host key is not in known_hosts
    HOST_KEY_CHANGED = "host_key_changed"  # known_hosts holds another key for the host: it changed
    CONNECT_TIMEOUT = "connect_timeout"  # no SSH session within connect_timeout
    CONNECT_REFUSED = "connect_refused"  # the address refused, or does not resolve
    CONNECTION_LOST = "connection_lost"  # the session dropped during the reset
    SILENT_SESSION = "silent_session"  # the session stopped answering
    # The scheduler's (`--scheduler`): each plug says its outcomes with these words (`fleet.engine.schedulers.Ready`).
    JOBS_RUNNING = "jobs_running"  # the node's jobs still ran after --drain-wait
    SCHEDULER = "scheduler"  # the scheduler refused: a command of its failed, or the node is not its to use now
    SLURM = "slurm"  # the same, said by Slurm: its word since 0.1, which scripts match
    VERSION = "version"  # --via srun: the node runs another fleet version
    NO_REPORT = "no_report"  # --via srun: the node sent no report
    DEADLINE = "deadline"  # --deadline cut the run short
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM/SIGHUP
    STOPPED = "stopped"  # not started: the failure budget was spent or the canary failed
    INTERNAL = "internal"  # a bug in fleet (the host's log has the traceback)


class Level(StrEnum):
    """How much a health finding weighs: `fail` keeps the host from being clean, `warn` is reported only."""

    FAIL = "fail"
    WARN = "warn"


Verdict = tuple[Reason, str]  # why (the code) and in one line (the message) a step or host is not clean
P = ParamSpec("P")


def line_of(decide: Callable[P, Verdict | None]) -> Callable[P, str | None]:
    """A verdict function's message alone (None when it found nothing), for callers that only show it."""

    def line(*args: P.args, **kwargs: P.kwargs) -> str | None:
        verdict = decide(*args, **kwargs)
        return verdict[1] if verdict else None

    line.__doc__ = f"The one-line message of `{decide.__name__}`."
    return line


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    """What one remote command did: exit status or signal, both streams apart."""

    argv: tuple[str, ...]
    exit_status: int | None
    stdout: str
    stderr: str
    duration_s: float
    signal: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0
