"""One host's JSONL log as its events are written: `HostLogger`, the `HostLog` the per-node logs hand out.

Each event is the line structlog's chain `add_log_level, TimeStamper(fmt="iso", utc=True), dict_tracebacks,
JSONRenderer()` over a logger bound to `host` and `run_id` writes, byte for byte: the bound fields, the event's
fields in the order given, then `event`, `level` and `timestamp`, as `json.dumps` separates and escapes them
(tests/unit/test_jsonl.py holds the two side by side). It costs a fraction of the chain (no context copy, no bind a
call, keys escaped once, each value encoded by its exact type, an argv logged before written as it was then),
which counts at 10,000 hosts of about 40 events each.
An event the shortcut does not cover (an exception's traceback, a field named like one of those five) goes
through structlog's own processors.

Each line is one write(2) of its own, unbuffered: on disk as soon as it is logged, even if the run dies.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from math import isfinite
from typing import Any

import structlog

# The per-node log's chain (fleet.runlog.folder before HostLogger): what a line is.
PROCESSORS: list[Any] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.dict_tracebacks,
    structlog.processors.JSONRenderer(),
]
# Fields the chain itself sets or reads: an event naming one takes the chain.
_RESERVED = frozenset({"host", "run_id", "event", "level", "timestamp", "exc_info", "exception"})


def _fallback(value: Any) -> Any:
    """What JSONRenderer writes for a value JSON has no type for (structlog's fallback)."""
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


_ENCODER = json.JSONEncoder(default=_fallback)
_ENCODE = _ENCODER.encode


class _Keys(dict[str, str]):
    """A field's name as it opens its pair (`, "name": `), made the first time the name is logged."""

    def __missing__(self, name: str) -> str:
        self[name] = opening = f", {encode_basestring_ascii(name)}: "
        return opening


class _Events(dict[str, str]):
    """An event's name as it closes its line's fields (`, "event": "name"`), made the first time it is logged."""

    def __missing__(self, event: str) -> str:
        self[event] = closing = f', "event": {_value(event)}'
        return closing


_KEYS = _Keys()
_EVENTS = _Events()


def _float(value: float) -> str:
    return repr(value) if isfinite(value) else _ENCODE(value)  # an exact float: its repr, when finite


def _list(value: list[Any]) -> str:
    """A list of strings (an argv) item by item, a short one remembered; any other list as the encoder writes it."""
    items = tuple(value)
    if not _ONLY_STR.issuperset(map(type, items)):  # exact strings only: a tuple of them is the text it encodes
        return _ENCODER.encode(value)
    known = _REMEMBERED.get(items)
    if known is not None:
        return known
    text = f"[{', '.join(map(encode_basestring_ascii, items))}]"
    if sum(map(len, items)) <= _REMEMBERED_CHARS:
        if len(_REMEMBERED) >= _REMEMBERED_LISTS:
            _REMEMBERED.clear()
        _REMEMBERED[items] = text
    return text


_ONLY_STR = frozenset({str})
# Lists of strings as JSON, remembered by their exact items: the same argv (a long shell script, a batch's program
# and lines) is logged for every host, most of its text the same for all. At most 256 lists of up to 16 k
# characters each, kept with their JSON: 8 MB at most (all forgotten when full: a run logs far fewer).
_REMEMBERED: dict[tuple[str, ...], str] = {}
_REMEMBERED_LISTS = 256
_REMEMBERED_CHARS = 16_384


# How a value of exactly this type is written; any other type (subclasses included: an IntEnum, a StrEnum) by the
# encoder JSONRenderer uses.
_BY_TYPE: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: repr,  # an exact int: its repr is its JSON
    bool: {True: "true", False: "false"}.__getitem__,
    type(None): {None: "null"}.__getitem__,
    float: _float,
    list: _list,
}


def _value(value: Any) -> str:
    """`value` as JSONRenderer writes it."""
    return _BY_TYPE.get(type(value), _ENCODER.encode)(value)


_SECOND: list[Any] = [None, ""]  # the last whole second stamped (its digits), and its `YYYY-MM-DDTHH:MM:SS`


def _stamp() -> str:
    """Now, as TimeStamper(fmt="iso", utc=True) writes it (`datetime.isoformat`: no fraction on a whole second);
    the date and time of day made once a second."""
    micros = str(time.time_ns() // 1000)  # microseconds since the epoch: the last six digits are the fraction
    second, fraction = micros[:-6], micros[-6:]
    if second != _SECOND[0]:
        _SECOND[:] = second, datetime.fromtimestamp(int(second), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_SECOND[1]}.{fraction}Z" if fraction != "000000" else f"{_SECOND[1]}Z"


class HostLogger:
    """A `fleet.model.hostlog.HostLog` writing one host's lines to `out` (opened unbuffered, in append mode)."""

    __slots__ = ("_host", "_opening", "_out", "_run_id")

    def __init__(self, out: io.FileIO, host: str, run_id: str) -> None:
        self._out = out
        self._host, self._run_id = host, run_id
        self._opening = f'{{"host": {_value(host)}, "run_id": {_value(run_id)}'

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled, as a structured traceback (`exception`)."""
        fields.setdefault("exc_info", True)
        self._log("error", event, fields)

    def _log(self, level: str, event: str, fields: dict[str, Any]) -> None:
        """The event's line (its newline included) in one write(2)."""
        if not _RESERVED.isdisjoint(fields):
            chain = structlog.wrap_logger(structlog.ReturnLogger(), processors=PROCESSORS, host=self._host,
                                          run_id=self._run_id)
            write_text(self._out, f"{getattr(chain, level)(event, **fields)}\n")
            return
        line = [self._opening]
        for name, value in fields.items():
            line += _KEYS[name], _BY_TYPE.get(type(value), _ENCODE)(value)
        line.append(f'{_EVENTS[event]}, "level": "{level}", "timestamp": "{_stamp()}"}}\n')
        write_text(self._out, "".join(line))


def write_line(out: io.FileIO, line: str) -> None:
    """`line` and its newline in one write(2) (more only if the kernel takes part of it)."""
    write_text(out, f"{line}\n")


def write_text(out: io.FileIO, text: str) -> None:
    """`text` (whole lines) in one write(2); more only if the kernel takes part of it."""
    data = text.encode()
    done = out.write(data)
    while done < len(data):  # the kernel took only part of it: the rest, until all of it is out
        data = data[done:]
        done = out.write(data)
