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


_ENCODE = json.JSONEncoder(default=_fallback).encode


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


def _float(value: float) -> str:
    return repr(value) if isfinite(value) else _ENCODE(value)  # an exact float: its repr, when finite


_ONLY_STR = frozenset({str})
# Lists of strings as JSON, remembered by their exact items: the same argv (a long shell script, a batch's program
# and lines) is logged for every host of a run, most of its text the same for all. At most REMEMBERED_LISTS lists
# of up to REMEMBERED_CHARS characters each, kept with their JSON: 8 MB at most a run (all forgotten when full: a
# run logs far fewer), and gone with the run's `Lines`.
REMEMBERED_LISTS = 256
REMEMBERED_CHARS = 16_384

# How a value of exactly this type is written; any other type (subclasses included: an IntEnum, a StrEnum) by the
# encoder JSONRenderer uses. A list of strings: `Lines.value`.
_BY_TYPE: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: repr,  # an exact int: its repr is its JSON
    bool: {True: "true", False: "false"}.__getitem__,
    type(None): {None: "null"}.__getitem__,
    float: _float,
}


def _value(value: Any) -> str:
    """`value` as JSONRenderer writes it (a list as the encoder writes it)."""
    return _BY_TYPE.get(type(value), _ENCODE)(value)


class Lines:
    """What the lines of one run's logs have in common, made once for all its hosts' loggers: the fields' and
    events' names as JSON, the argvs logged (each host logs the same ones), and the second the last stamp fell in.
    A run's `RunLogs` holds one; it goes with the run."""

    __slots__ = ("events", "keys", "remembered", "second")

    def __init__(self) -> None:
        self.keys, self.events = _Keys(), _Events()
        self.remembered: dict[tuple[str, ...], str] = {}
        self.second: tuple[str, str] = ("", "")  # the last whole second stamped (its digits), `YYYY-MM-DDTHH:MM:SS`

    def value(self, value: Any) -> str:
        """`value` as JSONRenderer writes it; a list of strings item by item, a short one remembered."""
        if type(value) is not list:
            return _BY_TYPE.get(type(value), _ENCODE)(value)
        items = tuple(value)
        if not _ONLY_STR.issuperset(map(type, items)):  # exact strings only: a tuple of them is the text it encodes
            return _ENCODE(value)
        known = self.remembered.get(items)
        if known is not None:
            return known
        text = f"[{', '.join(map(encode_basestring_ascii, items))}]"
        if sum(map(len, items)) <= REMEMBERED_CHARS:
            if len(self.remembered) >= REMEMBERED_LISTS:
                self.remembered.clear()
            self.remembered[items] = text
        return text

    def stamp(self) -> str:
        """Now, as TimeStamper(fmt="iso", utc=True) writes it (`datetime.isoformat`: no fraction on a whole
        second); the date and time of day made once a second."""
        micros = str(time.time_ns() // 1000)  # microseconds since the epoch: the last six digits are the fraction
        second, fraction = micros[:-6], micros[-6:]
        if second != self.second[0]:
            self.second = second, datetime.fromtimestamp(int(second), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self.second[1]}.{fraction}Z" if fraction != "000000" else f"{self.second[1]}Z"


class HostLogger:
    """A `fleet.model.hostlog.HostLog` writing one host's lines to `out` (opened unbuffered, in append mode)."""

    __slots__ = ("_host", "_lines", "_opening", "_out", "_run_id")

    def __init__(self, out: io.FileIO, host: str, run_id: str, lines: Lines | None = None) -> None:
        """`lines`: the run's (`RunLogs` hands every host's logger the same), else one of its own."""
        self._out, self._lines = out, lines if lines is not None else Lines()
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
        lines = self._lines
        keys, value = lines.keys, lines.value
        line = [self._opening]
        for name, given in fields.items():
            line += keys[name], value(given)
        line.append(f'{lines.events[event]}, "level": "{level}", "timestamp": "{lines.stamp()}"}}\n')
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
