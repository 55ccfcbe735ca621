"""Finding and ending fleet's own commands on a node by the marker each one carries.

With OpenSSH, closing a channel does not end the command it started, so when a
run is interrupted the SSH transport finds the interrupted command's processes
by the `FLEET_CMD=<token>` entry it put in their environment (`env` before the
command, inside `sudo`) and SIGKILLs them by pid. The token is unique per
command, so nothing else on the node can match it.
"""

from __future__ import annotations

import re

MARKER_VAR = "FLEET_CMD"
_TOKEN = re.compile(r"^[0-9a-f]{8,64}$")
_ENVIRON = re.compile(r"^/proc/(\d+)/environ$")


def marker(token: str) -> str:
    if not _TOKEN.match(token):
        raise ValueError(f"bad command token {token!r}")
    return f"{MARKER_VAR}={token}"


def find_marked_argv(token: str) -> list[str]:
    """Every /proc/PID/environ holding exactly FLEET_CMD=token, one path a line."""
    return [
        "find", "/proc", "-mindepth", "2", "-maxdepth", "2", "-regex", "/proc/[0-9]+/environ",
        "-exec", "grep", "-l", "-z", "-x", "-F", marker(token), "{}", "+",
    ]


def parse_marked(text: str) -> list[int]:
    """Pids from find_marked_argv's output; anything else on a line is ignored."""
    pids = []
    for line in text.splitlines():
        match = _ENVIRON.match(line.strip())
        if match:
            pids.append(int(match.group(1)))
    return sorted(pids)
