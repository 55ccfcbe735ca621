"""The exception tree of fleet.

Exceptions mean "no answer" or "bad input"; a remote command that ran and
exited non-zero is data (a `CommandResult`), never an exception.

    FleetError
    ├── UsageError            exit 2: bad command line
    │   └── InventoryError    exit 2: bad inventory, names the file and key
    ├── DocumentError         a report document (JSON) fleet cannot read: names the key (also a ValueError)
    └── TransportError        a host did not answer
        ├── ConnectError      refused, unreachable, connect timed out
        ├── AuthError         authentication failed (or sudo wants a password)
        ├── HostKeyError      host key unknown or changed
        ├── ConnectionLost    the session dropped mid-run
        ├── SessionSilent     the session stopped answering (TCP up, nothing answers): no more commands there
        └── CommandTimeout    a command did not finish within its deadline

    StepFailed                a step cannot go on (its status and one-line message);
                              caught at the step boundary, never past the host
"""

from __future__ import annotations

from fleet.model.outcomes import CommandResult, Reason, StepStatus


class FleetError(Exception):
    """Base of every error fleet raises on purpose."""


class UsageError(FleetError):
    """The command line is wrong; nothing was touched (exit 2)."""


class InventoryError(UsageError):
    """The inventory is wrong: `path: key: message` in one line (exit 2)."""

    def __init__(self, path: str, key: str, message: str) -> None:
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {message}")


class DocumentError(FleetError, ValueError):
    """A host's or a run's report document (`fleet.model.codec`) that fleet cannot read: one line naming the key."""


class TransportError(FleetError):
    """A host gave no answer."""

    reason = Reason.CONNECTION_LOST

    def during(self, step: object) -> str:
        """The host's one-line error when this ended it in `step`."""
        return f"{self} (during {step})"


class ConnectError(TransportError):
    """No SSH session: refused, unreachable or timed out while connecting."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        self.reason = Reason.CONNECT_TIMEOUT if timed_out else Reason.CONNECT_REFUSED
        super().__init__(message)


class AuthError(TransportError):
    """The host refused our credentials."""

    reason = Reason.AUTH


class HostKeyError(TransportError):
    """The host key is not in known_hosts (or no known_hosts can be read)."""

    reason = Reason.HOST_KEY


class HostKeyChanged(HostKeyError):
    """known_hosts holds another key for the host: it changed (a reinstalled node, or someone in between)."""

    reason = Reason.HOST_KEY_CHANGED


class ConnectionLost(TransportError):
    """The session dropped while a command was running."""


class SessionSilent(TransportError):
    """The SSH session stopped answering: an SSH keepalive request fleet sent while a wait on it lasted went
    unanswered for the silence bound of the controller's attention (`fleet.transport.liveness`); a session
    that still answers is slow, never silent.

    The TCP connection may still be up (a flaky switch, a wedged node); the
    transport is dead from then on and tries nothing more on the wire.
    """

    reason = Reason.SILENT_SESSION

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        super().__init__(f"ssh session to {host_name} went silent")

    def during(self, step: object) -> str:
        return f"{self} during {step}"


class CommandTimeout(TransportError):
    """A command did not finish within its deadline; it has been ended.

    `result` carries what it printed before it was ended; `bound` names what set the deadline.
    """

    reason = Reason.COMMAND_TIMEOUT

    def __init__(self, result: CommandResult, deadline_s: float, bound: str | None = None) -> None:
        self.result = result
        self.deadline_s = deadline_s
        self.bound = bound  # what set the deadline (`command_timeout`, ...), when the caller knows
        named = f" ({bound})" if bound else ""
        super().__init__(f"{result.argv[0] if result.argv else '?'} did not answer within {deadline_s:g} s{named}")


class StepFailed(Exception):
    """A step cannot go on; `status`, `reason` and the one-line message say why."""

    def __init__(self, message: str, status: StepStatus = StepStatus.FAILED,
                 reason: Reason = Reason.PROBE_FAILED) -> None:
        self.status = status
        self.reason = reason
        super().__init__(message)
