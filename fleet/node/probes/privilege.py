"""Which remote commands need root: nothing runs through `sudo -n` that does not.

A `become` host runs a command through sudo only when `needs_root(argv)` says
so: signalling other users' processes (`kill`), changing units (`systemctl stop
|kill|start|restart`), reading other users' /proc entries (the holder scan and
the exe lookup, both `find /proc...`) and the reset lock under /run. Queries
stay unprivileged: nvidia-smi, `systemctl show`, `ps`, reading the lock's
owner file.
"""

from __future__ import annotations

from collections.abc import Sequence

# systemctl verbs that change a unit.
ROOT_SYSTEMCTL_VERBS = frozenset({"stop", "kill", "start", "restart"})
# Directories whose lock files belong to root (/var/run and /var/lock are links into /run).
ROOT_LOCK_DIRS = ("/run", "/var/run", "/var/lock")
# flock options that take a value (the lock file is the first word after the options).
_FLOCK_VALUE_OPTIONS = frozenset({"-w", "--wait", "--timeout", "-E", "--conflict-exit-code"})


def needs_root(argv: Sequence[str]) -> bool:
    """Whether argv (unwrapped: no sudo, no timeout) needs root on the node."""
    if not argv:
        return False
    name, args = argv[0], argv[1:]
    if name == "kill":
        return True
    if name == "systemctl":
        return _first_word(args) in ROOT_SYSTEMCTL_VERBS
    if name == "find":
        return bool(args) and _under(args[0], "/proc")
    if name == "flock":
        lock_file = _flock_file(args)
        return lock_file is not None and any(_under(lock_file, d) for d in ROOT_LOCK_DIRS)
    return False


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


def _first_word(args: Sequence[str]) -> str | None:
    """The first argument that is not an option: systemctl's verb."""
    return next((a for a in args if not a.startswith("-")), None)


def _flock_file(args: Sequence[str]) -> str | None:
    """flock's lock file: the first argument that is neither an option nor an option's value."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _FLOCK_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None
