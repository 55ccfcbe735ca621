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
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from json.encoder import encode_basestring_ascii
from typing import Any

import structlog

# The per-node log's chain (fleet.engine.run_folder before HostLogger): what a line is.
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
_KEYS: dict[str, str] = {}  # a field's name as it opens its pair: `, "name": `


def _key(name: str) -> str:
    known = _KEYS.get(name)
    if known is None:
        known = _KEYS[name] = f", {encode_basestring_ascii(name)}: "
    return known


def _float(value: float) -> str:
    return float.__repr__(value) if math.isfinite(value) else _ENCODER.encode(value)


def _list(value: list[Any]) -> str:
    """A list of strings (an argv) item by item, a short one remembered; any other list as the encoder writes it."""
    if not _ONLY_STR.issuperset(map(type, value)):  # exact strings only: a tuple of them is the text it encodes
        return _ENCODER.encode(value)
    if sum(map(len, value)) > _REMEMBERED_CHARS:
        return _strings(tuple(value))
    return _remembered(tuple(value))


_ONLY_STR = frozenset({str})


def _strings(items: tuple[str, ...]) -> str:
    return f"[{', '.join(map(encode_basestring_ascii, items))}]"


# A list of strings as JSON, remembered by its exact items: the same argv (a long shell script, a batch's program
# and lines) is logged for every host, most of its text the same for all. At most 256 lists of up to 16 k
# characters each, kept with their JSON: 8 MB at most.
_remembered = lru_cache(maxsize=256)(_strings)
_REMEMBERED_CHARS = 16_384


# How a value of exactly this type is written; any other type (subclasses included: an IntEnum, a StrEnum) by the
# encoder JSONRenderer uses.
_BY_TYPE: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    bool: {True: "true", False: "false"}.__getitem__,
    type(None): lambda _: "null",
    float: _float,
    list: _list,
}


def _value(value: Any) -> str:
    """`value` as JSONRenderer writes it."""
    return _BY_TYPE.get(type(value), _ENCODER.encode)(value)


_SECOND: list[Any] = [None, ""]  # the last whole second stamped, and its `YYYY-MM-DDTHH:MM:SS`


def _stamp() -> str:
    """Now, as TimeStamper(fmt="iso", utc=True) writes it (`datetime.isoformat`: no fraction on a whole second);
    the date and time of day made once a second."""
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    if second != _SECOND[0]:
        _SECOND[:] = second, datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    micros = nanos // 1000
    return f"{_SECOND[1]}.{micros:06d}Z" if micros else f"{_SECOND[1]}Z"


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
        if _RESERVED.isdisjoint(fields):
            text = self._line(level, event, fields)
        else:
            chain = structlog.wrap_logger(structlog.ReturnLogger(), processors=PROCESSORS, host=self._host,
                                          run_id=self._run_id)
            text = f"{getattr(chain, level)(event, **fields)}\n"
        write_text(self._out, text)

    def _line(self, level: str, event: str, fields: dict[str, Any]) -> str:
        """The event's line, its newline included."""
        pairs = [(_KEYS.get(name) or _key(name)) + _BY_TYPE.get(type(value), _ENCODER.encode)(value)
                 for name, value in fields.items()]
        return (f'{self._opening}{"".join(pairs)}, "event": {_value(event)}, "level": "{level}", '
                f'"timestamp": "{_stamp()}"}}\n')


def write_line(out: io.FileIO, line: str) -> None:
    """`line` and its newline in one write(2) (more only if the kernel takes part of it)."""
    write_text(out, f"{line}\n")


def write_text(out: io.FileIO, text: str) -> None:
    """`text` (whole lines) in one write(2); more only if the kernel takes part of it."""
    data = text.encode()
    done = out.write(data)
    while done < len(data):
        data = data[done:]
        done = out.write(data)
