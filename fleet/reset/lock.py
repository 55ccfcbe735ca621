"""One reset per host at a time: a lock on the node, held for the host's whole reset.

    async with host_lock(node, run_id, held_s=longest_reset_s):
        ...  # drain, kill, settle, verify

The lock is `flock` on `host.lock_file` (default /run/fleet/reset.lock), held by a remote command that started
with its stdin open (`Transport.open_command`):

    timeout -k 1 T sh -c LOCK_SH fleet-lock LOCK WAIT RUN_ID OWNER

`lock.sh` (beside this file) first makes sure no other user can touch the lock: its folder must be a real folder
of the user that takes it (root, with `become`), mode 0700, created so when missing (exit 76 otherwise, with why);
the lock file a regular file of that user, never opened through a link; one owned by another user, or held by
another user's process, fails the host at once naming the file, its owner and the holding pids (exit 77). Then
it flocks the file, writes the run id to the owner file next to it (removed first, then created with O_EXCL),
prints `locked` and waits for EOF on its stdin. Releasing closes stdin. If fleet dies, its SSH session ends,
sshd closes the command's pipes, `cat` sees EOF and the lock goes with it; coreutils' `timeout` (T: the wait and
twice `held_s`, the longest the held reset can take, `fleet.reset.verdict_time`) is the last bound. A second run
reaching a locked host waits up to LOCK_WAIT_S, then fails that host with `locked by run <id>` (`LockBusy`): two
runs never interleave kills on one node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from importlib import resources

import anyio

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, FleetError, TransportError
from fleet.model.report import Reason
from fleet.node.node import Node
from fleet.node.probe import Probe, last_line
from fleet.transport.base import RELEASE_TIMEOUT_S, OpenCommand

# Seconds a run waits for another run's lock on a host before it fails that host.
LOCK_WAIT_S = 10.0
# flock's exit status when the lock was not obtained within the wait.
BUSY_EXIT = 75
# lock.sh's exit status for a lock folder or file fleet must not use (a link, another user's, the wrong mode).
REFUSED_EXIT = 76
# lock.sh's exit status for a lock file another user owns, or another user's process holds.
FOREIGN_EXIT = 77
# lock.sh's exit status for a lock folder the user may not create (its parent is not writable to it).
NOT_PERMITTED_EXIT = 78
NOT_ROOT_REMEDY = "log in as root, or set become: true (fleet's commands through passwordless sudo)"
# What the lock command prints once it holds the lock.
LOCKED_LINE = "locked"
# Seconds added to the lock command's bound for connect, logging and scheduling.
HOLD_MARGIN_S = 60.0
# Directories whose lock files belong to root (/var/run and /var/lock are links into /run): taking a lock
# there needs root, anywhere else (a simulated node's own folder) it does not.
ROOT_LOCK_DIRS = ("/run", "/var/run", "/var/lock")
_RUN_ID = re.compile(r"[A-Za-z0-9T:-]+")
# The lock program, its comment lines dropped (they are for readers, not for the wire).
LOCK_SH = "\n".join(
    line for line in (resources.files("fleet.reset") / "lock.sh").read_text().splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)
PROGRAM_NAME = "fleet-lock"  # the program's $0


class LockError(FleetError):
    """The host's reset lock could not be taken; nothing was changed on the host."""

    def __init__(self, message: str, reason: Reason = Reason.PROBE_FAILED) -> None:
        self.reason = reason
        super().__init__(message)


class LockBusy(LockError):
    """Another run holds the host's reset lock; `owner` is its run id when the node says it, `held_by` the
    holding processes lock.sh found (`held by: pid 1234 (root)`), said when the owner is not known."""

    def __init__(self, owner: str | None, held_by: str = "") -> None:
        self.owner = owner
        unknown = f"locked by another run (owner unknown{'; ' + held_by if held_by else ''})"
        super().__init__(f"locked by run {owner}" if owner else unknown, Reason.LOCKED)


def run_id(value: str) -> str:
    """A run id safe to write into the owner file: [A-Za-z0-9T:-]+ (ValueError otherwise)."""
    if not _RUN_ID.fullmatch(value):
        raise ValueError(f"invalid run id {value!r}: use letters, digits, ':' and '-'")
    return value


def owner_file(lock_file: str) -> str:
    """Where the holder's run id is written: next to the lock file."""
    return f"{lock_file}.owner"


def lock_argv(lock_file: str, run: str, wait_s: float) -> list[str]:
    """The lock command (see the module docstring); quoted once by the transport like any argv."""
    wait = f"{max(wait_s, 0.0):g}"
    return ["sh", "-c", LOCK_SH, PROGRAM_NAME, lock_file, wait, run_id(run), owner_file(lock_file)]


def is_lock_argv(argv: Sequence[str]) -> bool:
    """Whether `argv` is the lock command (`lock_argv`): its run id is `argv[-2]`."""
    return len(argv) > 3 and argv[0] == "sh" and argv[3] == PROGRAM_NAME


def owner_argv(lock_file: str) -> list[str]:
    return ["cat", "--", owner_file(lock_file)]


def in_root_dir(path: str) -> bool:
    """Whether `path` lies under a directory only root may write (ROOT_LOCK_DIRS)."""
    return any(path == d or path.startswith(d + "/") for d in ROOT_LOCK_DIRS)


def lock_probe(lock_file: str, run: str, wait_s: float) -> Probe[str]:
    """The lock command; its first line is all fleet reads (`Node.open_command`)."""
    return Probe(argv=tuple(lock_argv(lock_file, run, wait_s)), what=f"reset lock {lock_file}", parse=str,
                 needs_root=in_root_dir(lock_file))


def owner_probe(lock_file: str) -> Probe[str | None]:
    """Read the holder's run id; a missing or unreadable owner file is no owner (any exit is an answer)."""
    return Probe(argv=tuple(owner_argv(lock_file)), what=f"owner of {lock_file}", parse=parse_owner, ok_exits=None)


def parse_owner(text: str) -> str | None:
    """The run id in an owner file's text; None when it holds none (empty, garbled)."""
    first = text.strip().split("\n", 1)[0].strip()
    return first if _RUN_ID.fullmatch(first) else None


def hold_bound_s(wait_s: float, held_s: float) -> float:
    """The lock command's own bound on the node: the wait, twice the longest the held work can take, a margin."""
    return wait_s + 2 * held_s + HOLD_MARGIN_S


def take_bound_s(host: Host, wait_s: float) -> float:
    """The longest taking the lock waits for its answer: the lock's wait and a command's room."""
    return wait_s + host.command_timeout


def longest_take_s(host: Host) -> float:
    """The longest taking the lock can cost a host: the wait for another run's lock, then the read of its owner."""
    return take_bound_s(host, LOCK_WAIT_S) + host.command_timeout


def host_lock(node: Node, run: str, *, held_s: float, wait_s: float | None = None) -> HostLock:
    """Hold the host's reset lock for the block (`held_s`: the longest the block can take); LockBusy or LockError
    when it cannot be taken.

    The lock is released when the block ends, whatever way (shielded, bounded).
    """
    return HostLock(node, run, LOCK_WAIT_S if wait_s is None else wait_s, held_s)


class HostLock:
    """`host_lock`'s block: the lock taken as it begins (the held command, `as`), released as it ends. A class, not
    an async generator: one a host, entered once (no generator for the loop to track and finalize)."""

    def __init__(self, node: Node, run: str, wait_s: float, held_s: float) -> None:
        self.node, self.run, self.wait_s, self.held_s = node, run, wait_s, held_s
        self._held: OpenCommand | None = None
        self._taken = 0.0

    async def __aenter__(self) -> OpenCommand:
        node, started = self.node, time.monotonic()
        try:
            held = await _acquire(node, self.run, self.wait_s, self.held_s)
        except LockBusy:
            raise
        except LockError as exc:
            node.log.warning("lock_failed", lock_file=node.host.lock_file, error=str(exc))
            raise
        node.log.info("lock_acquired", lock_file=node.host.lock_file, waited_s=_since(started))
        self._held, self._taken = held, time.monotonic()
        return held

    async def __aexit__(self, *exc_info: object) -> None:
        if self._held is not None:
            await _release(self.node, self._held, self._taken)


async def _acquire(node: Node, run: str, wait_s: float, held_s: float) -> OpenCommand:
    """Start the lock command and wait for its answer (bounded by the wait plus command_timeout)."""
    host = node.host
    bound = take_bound_s(host, wait_s)
    held: OpenCommand | None = None
    try:
        with anyio.move_on_after(bound):
            probe = lock_probe(host.lock_file, run, wait_s)
            held = await node.open_command(probe, timeout=hold_bound_s(wait_s, held_s))
        if held is None:
            raise LockError(f"reset lock {host.lock_file}: no answer within {bound:g} s", Reason.COMMAND_TIMEOUT)
        if held.running and held.first_line == LOCKED_LINE:
            return held
        await held.release()
        raise await _refusal(node, held)
    except TransportError as exc:
        raise LockError(f"cannot take the reset lock: {exc}", exc.reason) from exc


async def _refusal(node: Node, held: OpenCommand) -> LockError:
    """Why the lock command did not hold: another run (LockBusy), or the lock could not be used."""
    result = held.result
    if result is not None and result.exit_status == BUSY_EXIT:
        owner = await _owner(node)
        said_last = last_line(result.stderr, 400)  # lock.sh's own line comes last, after anything the login printed
        held_by = said_last if said_last.startswith("held by:") else ""
        node.log.warning("lock_busy", lock_file=node.host.lock_file, owner=owner, held_by=held_by)
        return LockBusy(owner, held_by)
    if result is None:
        return LockError(f"reset lock {node.host.lock_file}: unexpected answer {held.first_line[:80]!r}")
    said = last_line(result.stderr, 400) if result.stderr.strip() else ""
    if result.exit_status == NOT_PERMITTED_EXIT and said:  # with become, root itself could not: said as it is
        return LockError(said if node.host.become else f"{said}: {NOT_ROOT_REMEDY}", Reason.NOT_PERMITTED)
    if said and result.exit_status in (REFUSED_EXIT, FOREIGN_EXIT):
        return LockError(said, Reason.LOCKED if result.exit_status == FOREIGN_EXIT else Reason.PROBE_FAILED)
    reason = said or f"exit status {result.exit_status}"
    return LockError(f"cannot take the reset lock {node.host.lock_file}: {reason}")


async def _owner(node: Node) -> str | None:
    """The run id of the lock's holder, as its owner file says; None when it cannot be read."""
    try:
        probe = owner_probe(node.host.lock_file)
        result = await node.run(probe)
    except CommandTimeout:
        return None
    return probe.parse(result.stdout) if result.ok else None


async def _release(node: Node, held: OpenCommand, taken: float) -> None:
    """Release the lock (EOF for its holder), shielded and bounded; log how it ended."""
    result = None
    with anyio.move_on_after(RELEASE_TIMEOUT_S + 1.0, shield=True):
        try:
            result = await held.release()
        except TransportError as exc:  # the session is gone: so is the holder's stdin
            node.log.warning("lock_release_error", error=str(exc))
    status = result.exit_status if result is not None else None
    level = node.log.info if status == 0 else node.log.warning
    level("lock_released", lock_file=node.host.lock_file, held_s=_since(taken), exit_status=status)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
