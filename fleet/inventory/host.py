"""A target host with every variable resolved: what every layer above the inventory reads.

Every host variable is declared once, as a field of `Host`: its Python type, its
default, and in its `Var` the check, bounds and one line of help. A plug's own
variables are declared the same way, as the fields of its `VARIABLES` record
(`fleet.model.plugs.Scheduled.variables`: Slurm's `slurm: {node: ...}`). The inventory's
`HostVars` (`fleet.inventory.schema`) and the table of variables in docs/operating.md
(`fleet.inventory.variables`) are both made from these fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NamedTuple, TypeVar

from fleet.inventory import validate
from fleet.model import health_checks, plugs
from fleet.model.gpu_profile import DEFAULT_PROFILE, GpuProfile

V = TypeVar("V")
DEFAULT_DEVICES = ("/dev/nvidia*",)
# The node's reset lock (one reset per host at a time); its owner file is next to it.
DEFAULT_LOCK_FILE = "/run/fleet/reset.lock"
# Where host keys are read from when `known_hosts` is not set, as OpenSSH reads them: the user's files and the
# system's, every one that exists (fleet.transport.ssh; fleet.inventory.files refuses a run when none does).
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


class DefaultKnownHosts(NamedTuple):
    """One default known_hosts file: as written, expanded (`~` is $HOME when asked), and whether it is the system's."""

    written: str
    path: Path
    system: bool


def default_known_hosts() -> tuple[DefaultKnownHosts, ...]:
    """The default known_hosts files, the user's then the system's, existing or not."""
    return tuple(DefaultKnownHosts(written, Path(written).expanduser(), system)
                 for files, system in ((USER_KNOWN_HOSTS, False), (SYSTEM_KNOWN_HOSTS, True)) for written in files)


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
    "nvidia-imex",
    "Xorg",
    "Xwayland",
    "sshd",
    "systemd",
)  # and each scheduler's job daemons, which its plug names (`fleet.node.jobs.JobSide.daemons`: Slurm's slurmstepd)


class Connection(StrEnum):
    """The built-in transports' names (a host's `connection:` may name any in `fleet.model.plugs.TRANSPORTS`)."""

    SSH = "ssh"
    LOCAL = "local"


@dataclass(frozen=True, kw_only=True)
class Var:
    """How one host variable is checked and documented: the metadata of its `Host` field."""

    help: str  # one line: the table's "meaning"
    check: Callable[[str], str] | None = None  # a `validate` function for the string, or each string of a list
    ge: int | None = None  # bounds of a number
    gt: int | None = None
    le: int | None = None
    one_or_more: bool = False  # a list that may be written as one string, and never empty
    fallback: Callable[[str], str | None] | None = None  # the value, from the host's name, when no level sets it
    shown: str = ""  # the default as the table says it, where the value itself would not
    names: Callable[[], tuple[str, ...]] | None = None  # the names a value may be, when a registry says them
    words: str = ""  # the table's type, where the value's type would not say it (a mapping)
    old: str = ""  # a plug's variable: its spelling before it moved under the plug's name (`slurm_node`), still read


def _health_check(name: str) -> str:
    """`health_warn` and `health_ignore` name checks of the health gate's table (`fleet.model.health_checks`)."""
    known = health_checks.names()
    if name not in known:
        raise ValueError(f"unknown health check {name!r} (known: {', '.join(known)})")
    return name


def _transports() -> tuple[str, ...]:
    return tuple(plugs.TRANSPORTS)


def _transport(name: str) -> str:
    """A `connection:` names a registered transport (`fleet.model.plugs.TRANSPORTS`: ssh, local)."""
    if name not in plugs.TRANSPORTS:
        *first, last = (repr(n) for n in _transports())
        raise ValueError(f"expected {' or '.join([', '.join(first), last]) if first else last}, got {name!r}")
    return name


def _host_name(name: str) -> str:
    return name


@dataclass(frozen=True, kw_only=True)
class Host:
    """One target with every variable resolved (defaults < groups < host).

    Every field but `name`, `groups` and `plug_variables` (set by the loader) is a host variable; a plug's own
    variables are declared by the plug (`fleet.model.plugs.Scheduled.variables`).
    A field typed `... | None` may be set to null in the inventory unless it has a fallback.
    """

    name: str
    address: Annotated[
        str, Var(help="where to connect", check=validate.address, fallback=_host_name, shown="the host name")
    ]
    port: Annotated[
        int | None, Var(help="SSH port; unset: ssh_config's `Port`, else 22", ge=1, le=65535, shown="unset")
    ] = None
    user: Annotated[
        str | None,
        Var(help="SSH user; unset: ssh_config's `User`, else the current user", check=validate.user_name,
            shown="unset"),
    ] = None
    identity_file: Annotated[
        str | None,
        Var(
            help="private key; a missing file is an inventory error; one with a passphrase is used through ssh-agent",
            check=validate.path,
            shown="ssh defaults",
        ),
    ] = None
    known_hosts: Annotated[
        str | None,
        Var(
            help='host keys are always checked, never "accept"; a missing file (unset: no default one) is an inventory'
            " error",
            check=validate.path,
            shown="ssh's: `~/.ssh/known_hosts{,2}`, `/etc/ssh/ssh_known_hosts{,2}`",
        ),
    ] = None
    connection: Annotated[
        str,
        Var(help="`ssh`, or `local` (run the same commands as local processes: a node resetting itself from a timer)",
            check=_transport, names=_transports),
    ] = Connection.SSH
    become: Annotated[
        bool, Var(help="run the commands that need root (below) through `sudo -n`; the rest run as `user`")
    ] = False
    gpus: Annotated[
        int | None, Var(help="expected GPU count; verify fails on a mismatch (a GPU fallen off the bus)", ge=0, le=1024)
    ] = None
    services: Annotated[
        tuple[str, ...],
        Var(
            help="systemd services to stop in drain: `.service` units only, never sshd's, never a protected process's",
            check=validate.service_unit,
        ),
    ] = ()
    devices: Annotated[
        tuple[str, ...],
        Var(
            help="globs of NVIDIA device files whose holders are killed: the file name starts with `nvidia`,"
            " or its folder with `nvidia-caps`",
            check=validate.device_glob,
            one_or_more=True,
        ),
    ] = DEFAULT_DEVICES
    protected: Annotated[
        tuple[str, ...],
        Var(help="extra process names never killed, added to the built-in list", check=validate.process_name),
    ] = ()
    kill_users: Annotated[
        tuple[str, ...],
        Var(
            help="when set, only processes of these users are killed; others are kept and named",
            check=validate.user_name,
            shown="none (any user)",
        ),
    ] = ()
    health_warn: Annotated[
        tuple[str, ...],
        Var(help="health checks that only warn on this host instead of failing it", check=_health_check),
    ] = ()
    health_fail: Annotated[
        tuple[str, ...],
        Var(help="health checks that fail this host where they would only warn (`gpu_settings`, `ecc_corrected`...)",
            check=_health_check),
    ] = ()
    health_ignore: Annotated[
        tuple[str, ...],
        Var(help="health checks not judged on this host (reported nowhere)", check=_health_check),
    ] = ()
    gpu_settings: Annotated[
        GpuProfile,
        Var(help="the GPU settings every GPU is expected to have, judged by the health check `gpu_settings` and "
                 "restored by `--restore-settings` "
                 "([GPU settings](#gpu-settings-the-clean-slate-includes-the-gpus-settings))",
            words="mapping: `persistence`, `compute_mode`, `mig`, `power_limit`, `clocks`, `ecc`",
            shown="persistence on, `Default` compute mode, MIG off, default power limit, no locked or application "
                  "clocks, ECC not judged"),
    ] = DEFAULT_PROFILE
    nvidia_smi: Annotated[str, Var(help="the nvidia-smi to run", check=validate.executable)] = "nvidia-smi"
    memory_threshold_mib: Annotated[
        int, Var(help="a GPU at or under this many MiB used is clean", ge=0, le=1_048_576)
    ] = 16
    mig_memory_threshold_mib: Annotated[
        int,
        Var(
            help="the same for a GPU in MIG mode: its GPU instances reserve memory with no process"
            " (an idle H200 with 4 instances: 55 MiB)",
            ge=0,
            le=1_048_576,
        ),
    ] = 256
    connect_timeout: Annotated[float, Var(
        help="seconds to open the SSH session (connect and log in), of the controller's attention (below); the name "
        "lookup has as many again, apart", gt=0, le=300)] = 10.0
    command_timeout: Annotated[float, Var(help="seconds any one remote command may take; nvidia-smi 3 times this",
                                          gt=0, le=3600)] = 10.0
    drain_timeout: Annotated[
        float, Var(help="seconds for the units to stop before they are SIGKILLed", gt=0, le=3600)
    ] = 30.0
    kill_grace: Annotated[float, Var(help="seconds between SIGTERM and SIGKILL", gt=0, le=300)] = 5.0
    settle_timeout: Annotated[float, Var(help="seconds for GPU memory to come back", gt=0, le=3600)] = 60.0
    gpu_reset_timeout: Annotated[
        float,
        Var(
            help="seconds `--gpu-reset`'s `nvidia-smi -r` may take on the host, all its resets together: a whole"
            " NVSwitch baseboard's reset can take minutes, far longer than `command_timeout`",
            gt=0,
            le=3600,
        ),
    ] = 300.0
    lock_file: Annotated[
        str,
        Var(
            help="the node's reset lock: an absolute path in a lock, run or tmp folder (never under /dev, /proc, /sys"
            " or /etc, never directly in /run, /tmp or /run/lock, and for a node that is not `simulated` never under"
            " a tree other users may create folders in: /tmp, /var/tmp, /dev/shm, /run/lock, /var/lock, /run/user,"
            " /home), whose folder fleet keeps as root's own, mode 0700, every folder above it root's and writable by"
            " no one else (checked on the node); the holder's run id goes to `<lock_file>.owner`",
            check=validate.lock_file,
        ),
    ] = DEFAULT_LOCK_FILE
    simulated: Annotated[
        bool,
        Var(
            help="a `fleet.sim` simulated node: fleet reads each process's systemd unit from the simulator's"
            " `FLEET_SIM_UNIT` environment entry instead of `/proc/PID/cgroup`,"
            " since a simulated node has no cgroups of its own"
        ),
    ] = False
    groups: tuple[str, ...] = ()
    # The plugs' own variables (`slurm: {node: gpu01}`), by plug name, for each plug some level wrote them for:
    # each a plug's `VARIABLES` record (`fleet.model.plugs.Scheduled.variables`), read with `variables_of`.
    plug_variables: tuple[tuple[str, object], ...] = ()

    def variables_of(self, plug: str, kind: type[V]) -> V:
        """The named plug's variables for this host, as its `kind` record: what the inventory wrote, else the
        record's defaults."""
        found = next((values for name, values in self.plug_variables if name == plug), None)
        return found if isinstance(found, kind) else kind()

    @property
    def protected_names(self) -> tuple[str, ...]:
        return BUILTIN_PROTECTED + self.protected
