"""What a host's log is to the code that writes it: structlog's bound logger, as far as fleet uses it.

Each call writes one event (`event`, plus the fields given) to the host's JSONL log (`fleet.runlog.folder`); a
leaf module, so that the lowest layers (`fleet.node`) can name the type without importing the report layer.
"""

from __future__ import annotations

from typing import Any, Protocol


class HostLog(Protocol):
    def debug(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...

    def error(self, event: str, **fields: Any) -> Any: ...

    def exception(self, event: str, **fields: Any) -> Any: ...


class NoLog:
    """A HostLog that writes nothing: for the end of a host whose log could not be opened (its report still
    says what happened)."""

    def debug(self, event: str, **fields: Any) -> None:
        return None

    info = warning = error = exception = debug
