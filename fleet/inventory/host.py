"""A target host with every variable resolved: what every layer above the inventory reads."""

from __future__ import annotations

from dataclasses import dataclass
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
