"""From fleet's per-node JSONL logs to the other tools' scripts: the wire command lines fleet ran, rebuilt
per host (floor, Ansible) or written once for every host (pdsh), each replay with its own lock owner."""

from __future__ import annotations

import json
import secrets
import shlex
from pathlib import Path
from typing import Any

from fleet.reset.lock import is_lock_argv

from .common import SIM_NODE_VAR, median


def fleet_commands(log_dir: Path) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """host -> the events of its JSONL log that stand for one remote command each, in order (a `batch` with its
    wire argv, a `command` outside any batch; the lock holder is logged when released); and how many hosts took
    the lock without a `command` event for it.

    fleet logs the lock command when its release returns a result; when the release times out
    (RELEASE_TIMEOUT_S, a loaded machine) the holder is killed and no `command` event is written. Such a
    host's lock command is rebuilt from its `lock_acquired` event (fleet.reset.lock.lock_argv, the run id, the
    bound the other hosts' lock commands had) so that every replay runs the same commands.
    """
    from fleet.node.node import is_remote_command
    from fleet.reset.lock import LOCK_WAIT_S, lock_argv
    out: dict[str, list[dict[str, Any]]] = {}
    acquired: dict[str, dict[str, Any]] = {}
    for path in sorted(log_dir.glob("*/*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[path.stem] = [e for e in events if is_remote_command(e)]
        for e in events:  # the host's last `lock_acquired` event, if any
            if e.get("event") == "lock_acquired":
                acquired[path.stem] = e
    bounds = [e["timeout_s"] for evs in out.values() for e in evs if is_lock_argv(e["argv"])]
    missing = [h for h, evs in out.items() if h in acquired and not any(is_lock_argv(e["argv"]) for e in evs)]
    for host in missing:
        event = acquired[host]
        out[host].append({"event": "command", "argv": lock_argv(event["lock_file"], event["run_id"], LOCK_WAIT_S),
                          "timeout_s": median(bounds), "rebuilt": True})
    return out, len(missing)


def lock_argv(argv: list[str], owner: str | None) -> list[str]:
    """The lock command with `owner` written to the lock's owner file instead of fleet's run id: after a
    replay, every node's owner file says which tool's lock command last ran there."""
    return [*argv[:-2], owner, argv[-1]] if owner else list(argv)


def replay_owner(events: list[dict[str, Any]], tool: str, rep: int) -> str:
    """A run id of fleet's shape for a replay: `<fleet's timestamp>-<tool><rep>`."""
    fleet_run = next((e["argv"][-2] for e in events if is_lock_argv(e["argv"])), "run-")
    return f"{fleet_run.split('-', 1)[0]}-{tool}{rep}"


def wire_lines(events: list[dict[str, Any]], owner: str | None = None) -> tuple[str | None, list[str]]:
    """(the lock holder's wire line, the other commands' wire lines), rebuilt as fleet.transport.ssh does."""
    from fleet.transport import reap
    from fleet.transport.base import bounded_argv, command_line
    hold, cmds = None, []
    for e in events:
        if is_lock_argv(e["argv"]):
            hold = command_line(bounded_argv(lock_argv(e["argv"], owner), e["timeout_s"]))
        else:
            line = command_line(bounded_argv(e["argv"], e["timeout_s"], mark=reap.marker(secrets.token_hex(8))))
            cmds.append(tagged(e["argv"], line, secrets.token_hex(8)))
    return hold, cmds


def tagged(argv: list[str], line: str, tag: str) -> str:
    """A batch's wire line fed its frame tag on stdin, as fleet's transport does (a batch reads it there)."""
    from fleet.transport import batch
    return f"printf '%s\\n' {tag} | {line}" if batch.unbatch(argv) is not None else line


def generic_line(events: list[dict[str, Any]], index: int, root: str, owner: str | None = None) -> str:
    """One host's command `index` with its node folder written as "$FLEET_SIM_NODE" (expanded by the node's
    login shell to the same path) and a token (and, for a batch, a frame tag) shared by every host: the same line
    for every host, for pdsh."""
    from fleet.transport import reap
    from fleet.transport.base import bounded_argv
    e = events[index]
    is_hold = is_lock_argv(e["argv"])
    mark = None if is_hold else reap.marker(f"{index + 1:016x}")
    words = []
    argv = lock_argv(e["argv"], owner) if is_hold else list(e["argv"])
    for arg in bounded_argv(argv, e["timeout_s"], mark=mark):
        pieces = arg.split(root)
        if len(pieces) == 1:
            words.append(shlex.quote(arg))
        else:
            words.append(f'"${SIM_NODE_VAR}"'.join(shlex.quote(p) if p else "" for p in pieces))
    line = " ".join(words)
    return f"{line} </dev/null" if is_hold else tagged(argv, line, f"{index + 1:016x}")


def ordered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lock holder first (it is taken before anything else), then the rest in order."""
    return sorted(events, key=lambda e: not is_lock_argv(e["argv"]))
