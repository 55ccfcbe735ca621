"""Small pure validators for every value that reaches a remote command or a file name.

Each function takes a string and returns it (at most normalised) or raises
`ValueError` with a short human reason. The inventory applies them at load
time; the steps may apply them again right before building an argv, so a value
that passed here is safe to quote once with `shlex.join` and can never turn
into a second word, an option or a shell construct.
"""

from __future__ import annotations

import ipaddress
import os
import re

# Characters a shell treats specially anywhere in a word, plus whitespace.
SHELL_METACHARACTERS = frozenset(";|&$`'\"<>\\(){}!#~*?[] \t\n\r\v\f")

UNIT_SUFFIXES = (
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_UNIT = re.compile(r"[A-Za-z0-9:_.@-]+")
_DEVICE_GLOB = re.compile(r"/[A-Za-z0-9_./*?\[\]-]+")
_EXECUTABLE_PATH = re.compile(r"/[A-Za-z0-9_./-]+")
_COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
_PROCESS_FORBIDDEN = SHELL_METACHARACTERS


def _require_str(s: object) -> str:
    if not isinstance(s, str):
        raise ValueError(f"expected a string, got {s!r}")
    if not s:
        raise ValueError("must not be empty")
    return s


def _name(s: object, what: str, max_len: int = 253) -> str:
    value = _require_str(s)
    if len(value) > max_len:
        raise ValueError(f"{what} longer than {max_len} characters")
    if not _NAME.fullmatch(value):
        rule = "letters, digits, '-', '_' and '.', starting with a letter or digit"
        raise ValueError(f"invalid {what} {value!r}: use {rule}")
    return value


def host_name(s: str) -> str:
    """A host name as written in the inventory; it also names the host's log file."""
    return _name(s, "host name")


def group_name(s: str) -> str:
    """An inventory group name (same characters as a host name)."""
    return _name(s, "group name", max_len=128)


def unit_name(s: str) -> str:
    """A systemd unit name with its type suffix, such as `sglang.service`."""
    value = _require_str(s)
    if len(value) > 256 or not _UNIT.fullmatch(value) or value.startswith("-"):
        raise ValueError(f"invalid unit name {value!r}: use letters, digits and ':_.@-', not starting with '-'")
    suffix = next((x for x in UNIT_SUFFIXES if value.endswith(x)), None)
    if suffix is None:
        raise ValueError(f"unit name {value!r} has no unit type suffix such as '.service'")
    stem = value[: -len(suffix)]
    if not stem or stem.endswith("@"):
        raise ValueError(f"unit name {value!r} names no unit (a template needs an instance)")
    return value


# Why `services` may name only a .service: drain stops each unit, then SIGKILLs what is left in its cgroup.
_NOT_A_SERVICE = {
    ".slice": "a slice: drain's SIGKILL escalation would kill every process in it (fleet's own session included)",
    ".scope": "a scope: drain's SIGKILL escalation would kill every process in it (a login's scope holds fleet's)",
    ".socket": "a socket: stopping it closes a listening socket (ssh.socket would refuse the next SSH login)",
    ".mount": "a mount: stopping it unmounts a file system",
    ".automount": "an automount: stopping it unmounts a file system",
    ".swap": "a swap unit: stopping it turns swap off",
    ".device": "a device unit: it stands for a kernel device, stopping it stops whatever is bound to it",
    ".target": "a target: it owns no processes, and stopping it stops every unit bound to it",
    ".path": "a path unit: it owns no processes (it only starts a service)",
    ".timer": "a timer: it owns no processes (it only starts a service)",
}
_SSH_UNITS = ("ssh", "sshd")  # and sshd-*: sshd-keygen, sshd-session


def unit_stem(unit: str) -> str:
    """The name a unit runs under: `vllm@8000.service` -> `vllm`, `sglang.service` -> `sglang`."""
    return unit.rsplit(".", 1)[0].split("@", 1)[0]


def service_unit(s: str) -> str:
    """A unit drain may stop: a `.service` (a valid `unit_name`) that is not an SSH server's."""
    value = unit_name(s)
    suffix = "." + value.rsplit(".", 1)[1]
    if suffix != ".service":
        why = _NOT_A_SERVICE.get(suffix, "not a service")
        raise ValueError(f"{value} is {why}; name the .service")
    stem = unit_stem(value)
    if stem in _SSH_UNITS or stem.startswith("sshd-"):
        raise ValueError(f"{value} is an SSH server unit: stopping sshd cuts fleet's own connection and every login")
    return value


def _components(value: str, what: str) -> list[str]:
    parts = value.split("/")[1:]
    if ".." in parts:
        raise ValueError(f"{what} {value!r} must not contain '..'")
    return parts


def _has_wildcard(text: str) -> bool:
    return any(c in text for c in "*?[]")


def device_glob(s: str) -> str:
    """An absolute glob of NVIDIA device files, such as `/dev/nvidia*` or `/dev/nvidia-caps/*`.

    Every directory is written out (no wildcard), and the file name starts with `nvidia`
    as written, or the directory holding it with `nvidia-caps` (`nvidia-caps-imex-channels`
    too): the holders of what it matches are killed.
    """
    value = _require_str(s)
    if len(value) > 1024 or not _DEVICE_GLOB.fullmatch(value):
        raise ValueError(f"invalid device glob {value!r}: an absolute path of [A-Za-z0-9_./*?[]-]")
    parts = [p for p in _components(value, "device glob") if p]
    if len(parts) < 2 or any(_has_wildcard(p) for p in parts[:-1]):
        raise ValueError(f"device glob {value!r} is too broad: write out every directory, then the devices")
    if not (parts[-1].startswith("nvidia") or parts[-2].startswith("nvidia-caps")):
        raise ValueError(
            f"device glob {value!r} could match more than NVIDIA device files: the holders of what it matches"
            " are killed; start the file name with 'nvidia' (/dev/nvidia*) or name /dev/nvidia-caps/*"
        )
    return value


def process_name(s: str) -> str:
    """A process name (as matched against the process table), never an option."""
    value = _require_str(s)
    if len(value) > 64:
        raise ValueError(f"process name {value!r} longer than 64 characters")
    bad = [c for c in value if not ("!" <= c <= "~") or c in _PROCESS_FORBIDDEN]
    if bad:
        raise ValueError(f"process name {value!r} contains {bad[0]!r}")
    if value.startswith("-"):
        raise ValueError(f"process name {value!r} must not start with '-'")
    return value


def executable(s: str) -> str:
    """A bare command name (looked up in PATH) or an absolute path to one."""
    value = _require_str(s)
    if value.startswith("/"):
        return _absolute_file(value, "executable")
    if len(value) > 1024:
        raise ValueError("executable path longer than 1024 characters")
    if not _COMMAND.fullmatch(value):
        raise ValueError(f"invalid executable {value!r}: a command name or an absolute path")
    return value


# Where a lock file may live: some directory of the path is one of these (/run, /var/lock, /tmp, <node>/run, ...).
_LOCK_DIRECTORIES = frozenset({"run", "lock", "tmp"})
# Never under these, whatever the rest of the path: devices, kernel files, system configuration (/etc/nologin).
_NO_LOCK_UNDER = frozenset({"dev", "proc", "sys", "etc"})
# Folders that are not fleet's own: every user may write to most (a lock there could be planted, linked or held
# by anyone), the system keeps the others; fleet's lock refuses a folder that is not root's 0700 (lock.sh).
_SHARED_FOLDERS = frozenset({"/tmp", "/var/tmp", "/run/lock", "/var/lock", "/var/run/lock", "/dev/shm", "/run/shm",
                             "/run", "/var/run"})


# Trees another user may create folders in (a world-writable folder, sticky or not, or a user's own): a lock there
# could be blocked for good by whoever creates its folder first (lock.sh then refuses a folder that is not root's).
SHARED_TREES = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock", "/var/lock", "/var/run/lock", "/run/user",
                "/var/run/user", "/home")


def shared_tree(path: str) -> str | None:
    """The tree of SHARED_TREES `path` lies under, if any."""
    return next((t for t in SHARED_TREES if path.startswith(t + "/")), None)


def lock_file(s: str) -> str:
    """The absolute path of a lock file on the node, in a lock, run or tmp directory: `/run/fleet/reset.lock`.

    fleet creates it (and `<lock_file>.owner`) on the node, as root with `become`, in a folder of its own: never
    directly in a folder every user may write to (/tmp, /run/lock, ...).
    """
    value = _require_str(s)
    if not value.startswith("/"):
        raise ValueError(f"lock file {value!r} must be an absolute path")
    folders = [p for p in _components(_absolute_file(value, "lock file"), "lock file") if p][:-1]
    if folders and folders[0] in _NO_LOCK_UNDER:
        raise ValueError(f"lock file {value!r} must not be under /{folders[0]}: fleet creates and writes it")
    if not _LOCK_DIRECTORIES.intersection(folders):
        raise ValueError(f"lock file {value!r} must be in a lock, run or tmp directory (/run/fleet, /var/lock/fleet)")
    if value.rsplit("/", 1)[0] in _SHARED_FOLDERS:
        raise ValueError(f"lock file {value!r} must be in a folder of fleet's own (/run/fleet/reset.lock), not right"
                         f" in {value.rsplit('/', 1)[0]}: fleet keeps the lock's folder root's only, mode 0700")
    return value


def _absolute_file(value: str, what: str) -> str:
    """An absolute path of [A-Za-z0-9_./-] naming a file (no '..', no trailing '/')."""
    if len(value) > 1024:
        raise ValueError(f"{what} path longer than 1024 characters")
    if not _EXECUTABLE_PATH.fullmatch(value) or value.endswith("/"):
        raise ValueError(f"invalid {what} {value!r}: an absolute path of [A-Za-z0-9_./-]")
    _components(value, what)
    return value


def user_name(s: str) -> str:
    """A login name: letters, digits, '_', '-', '.', optionally ending in '$'."""
    value = _require_str(s)
    if len(value) > 32 or not _USER.fullmatch(value):
        raise ValueError(f"invalid user name {value!r}")
    return value


def address(s: str) -> str:
    """A host name, or an IPv4 or IPv6 literal (without brackets)."""
    value = _require_str(s)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if _DOTTED_NUMBERS.fullmatch(value):
            raise ValueError(f"invalid IPv4 address {value!r}") from None
        if ":" in value:
            raise ValueError(f"invalid IPv6 address {value!r}") from None
        return _name(value, "address")
    return value


def path(s: str) -> str:
    """A local file path; a leading `~` is expanded."""
    value = _require_str(s)
    if any(c in value for c in "\0\n\r"):
        raise ValueError("a path must not contain NUL or line breaks")
    if len(value) > 4096:
        raise ValueError("path longer than 4096 characters")
    return os.path.expanduser(value)
