"""Plain, frozen data shared by every layer: hosts, steps, outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_DEVICES = ("/dev/nvidia*",)
# The node's reset lock (one reset per host at a time); its owner file is next to it.
DEFAULT_LOCK_FILE = "/run/lock/fleet-reset.lock"

# Process names never killed, whatever the inventory says. Matched against the
# full name and against /proc/PID/comm, which the kernel cuts to 15 characters.
BUILTIN_PROTECTED = (
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm-exporter",
    "dcgmi",
    "nv-fabricmanager",
    "nvidia-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "Xorg",
    "Xwayland",
    "sshd",
    "systemd",
)


class Connection(StrEnum):
    SSH = "ssh"
    LOCAL = "local"


@dataclass(frozen=True)
class Host:
    """One target with every variable resolved (defaults < groups < host)."""

    name: str
    address: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    connection: Connection = Connection.SSH
    become: bool = False
    gpus: int | None = None
    services: tuple[str, ...] = ()
    devices: tuple[str, ...] = DEFAULT_DEVICES
    protected: tuple[str, ...] = ()
    kill_users: tuple[str, ...] = ()  # users whose processes may be killed; empty: any user
    nvidia_smi: str = "nvidia-smi"
    memory_threshold_mib: int = 16
    connect_timeout: float = 10.0
    command_timeout: float = 10.0
    drain_timeout: float = 30.0
    kill_grace: float = 5.0
    settle_timeout: float = 60.0
    lock_file: str = DEFAULT_LOCK_FILE
    groups: tuple[str, ...] = ()

    @property
    def protected_names(self) -> tuple[str, ...]:
        return BUILTIN_PROTECTED + self.protected


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


@dataclass(frozen=True)
class StepResult:
    name: StepName
    status: StepStatus
    duration_s: float = 0.0
    detail: str = ""
    error: str | None = None  # one line, set when status is failed/timeout


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    name: str
    user: str
    signal: str  # "SIGTERM" or "SIGKILL": the last signal it needed


@dataclass(frozen=True)
class GpuReport:
    index: int
    memory_used_mib: int | None
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    settle_s: float | None = None  # seconds from settle start until under threshold


@dataclass(frozen=True)
class PlannedProcess:
    """A GPU holder a dry run found: what a reset would do to it and why."""

    pid: int
    user: str
    name: str
    mib: int | None  # GPU memory it uses, from nvidia-smi's compute apps (None: not a compute app)
    kept_because: str | None = None  # set for a protected holder a reset would leave alive


@dataclass(frozen=True)
class HostPlan:
    """What a reset would do on one host, read from the host without changing it."""

    units: tuple[tuple[str, str], ...] = ()  # (unit, ActiveState) for every unit in `services`
    would_kill: tuple[PlannedProcess, ...] = ()
    kept: tuple[PlannedProcess, ...] = ()
    gpu_memory_mib: tuple[int | None, ...] = ()

    @property
    def would_stop(self) -> tuple[str, ...]:
        return tuple(unit for unit, state in self.units if state not in ("inactive", "failed"))


@dataclass(frozen=True)
class HostReport:
    name: str
    status: HostStatus
    duration_s: float = 0.0
    error: str | None = None
    steps: tuple[StepResult, ...] = ()
    killed: tuple[KilledProcess, ...] = ()
    gpus: tuple[GpuReport, ...] = ()
    plan: HostPlan | None = None  # dry run only


@dataclass(frozen=True)
class RunReport:
    run_id: str
    command: str
    started_at: str
    duration_s: float
    hosts: dict[str, HostReport] = field(default_factory=dict)

    def count(self, status: HostStatus) -> int:
        return sum(1 for h in self.hosts.values() if h.status is status)
