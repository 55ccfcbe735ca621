"""The per-node log's lines are structlog's, byte for byte: `HostLogger` against the chain it stands for."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import pytest
import structlog

from fleet.runlog import jsonl
from fleet.runlog.folder import RunLogs
from fleet.runlog.jsonl import HostLogger

STAMP = re.compile(r'"timestamp": "[^"]*"')
# The per-node log's chain as it was written before HostLogger, spelled out here so that the pin is not the
# code under test.
CHAIN: list[Any] = [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
         structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]


class Colour(StrEnum):
    RED = "red"


class Size(IntEnum):
    BIG = 7


class Odd:
    def __repr__(self) -> str:
        return "<odd \u00e9>"


class Told:
    def __structlog__(self) -> str:
        return "told"


EVENTS: list[tuple[str, str, dict[str, Any]]] = [
    ("debug", "nothing", {}),
    ("info", "host_start", {"command": "reset", "address": "gpu-b01", "port": 22}),
    ("info", "command", {"step": "verify", "batch": 4, "argv": ["sh", "-c", 'a "b"\n\tc\\d', "\u00e9\u2028\U0001f600"],
                         "exit_status": 0, "signal": None, "timed_out": False, "timeout_s": 10.0,
                         "duration_s": 0.0123, "stdout": "GPU 0\x00\x1b[1m\n" * 3, "stderr": ""}),
    ("warning", "odd_values", {"pids": [1, 2], "kept": [], "gpus": (0, 1), "nested": {"a": [None, True, 1.5]},
                               "mixed": ["a", 1], "reason": Colour.RED, "size": Size.BIG, "path": Path("/x/y"),
                               "odd": Odd(), "told": Told(), "nan": float("nan"), "inf": float("inf"),
                               "minus_inf": float("-inf"), "zero": -0.0, "tiny": 1e-300, "big": 2**70,
                               "flag": True, "float_sub": Size.BIG / 2}),
    ("error", "names_the_chain", {"host": "someone-else", "level": "mine", "timestamp": "then", "step": "kill"}),
    ("info", "\u00fcnicode_event", {"\u00e9": "key", "k\"ey": 1}),
    ("info", "long_argv", {"argv": ["sh", "-c", 'printf "%s\\n" \u00e9\n' * 2000, "--", *map(str, range(3000))]}),
]


def expected(method: str, event: str, fields: dict[str, Any]) -> str:
    logger = structlog.wrap_logger(structlog.ReturnLogger(), processors=CHAIN, host="gpu-b01",
                                   run_id="20261204T000000Z-abcdef")
    return str(getattr(logger, method)(event, **fields))


def written(tmp_path: Path, method: str, event: str, fields: dict[str, Any], lines: jsonl.Lines | None = None) -> str:
    """The line a host's logger writes for the event (`lines`: a run's, shared with other loggers)."""
    path = tmp_path / "gpu-b01.jsonl"
    path.unlink(missing_ok=True)
    with io.FileIO(path, "a") as out:
        getattr(HostLogger(out, "gpu-b01", "20261204T000000Z-abcdef", lines), method)(event, **fields)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.count("\n") == 1, "one event is one line"
    return text[:-1]


@pytest.mark.parametrize(("method", "event", "fields"), EVENTS, ids=[e[1] for e in EVENTS])
def test_a_line_is_what_structlog_wrote(tmp_path: Path, method: str, event: str, fields: dict[str, Any]) -> None:
    """Every field kind fleet logs (and the odd ones) is written as the structlog chain writes it, in its order;
    only the timestamp, read at another instant, may differ."""
    ours, theirs = written(tmp_path, method, event, fields), expected(method, event, fields)
    assert STAMP.sub("T", ours) == STAMP.sub("T", theirs)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", json.loads(ours)["timestamp"])


def test_an_argv_logged_again_is_the_same_line(tmp_path: Path) -> None:
    """An argv written before (remembered, as every host logs the same ones) is written as the chain writes it."""
    fields = {"argv": ["sh", "-c", 'a "b"\n\tc\\d', "\u00e9"], "exit_status": 0}
    first, again = written(tmp_path, "info", "command", fields), written(tmp_path, "info", "command", dict(fields))
    assert STAMP.sub("T", first) == STAMP.sub("T", again) == STAMP.sub("T", expected("info", "command", fields))


def test_an_exception_is_logged_with_its_traceback_as_structlog_does(tmp_path: Path) -> None:
    """`exception` writes the exception being handled as structlog's dict_tracebacks does, at level error."""
    try:
        raise ValueError("bad \u00e9 answer")
    except ValueError:
        # One expression: the traceback carries this frame's locals, the same for both.
        ours, theirs = (written(tmp_path, "exception", "internal_error", {"step": "verify"}),
                        expected("exception", "internal_error", {"step": "verify"}))
    assert STAMP.sub("T", ours) == STAMP.sub("T", theirs)
    line = json.loads(ours)
    assert line["level"] == "error" and line["exception"][0]["exc_type"] == "ValueError"


def test_a_run_writes_one_file_a_host_and_relayed_lines_join_it(tmp_path: Path) -> None:
    """`<log-dir>/<run_id>/<host>.jsonl`, one JSON object a line, each on disk when logged (before close), the
    node's own relayed events (`--via srun`) appended to the same file."""
    logs = RunLogs(tmp_path, "run-1")
    logs.create()
    log = logs.host_logger("gpu-b01")
    log.info("step_start", step="drain")
    path = tmp_path / "run-1" / "gpu-b01.jsonl"
    assert json.loads(path.read_text(encoding="utf-8"))["event"] == "step_start"
    logs.relay("gpu-b01", {"event": "slurm_step", "host": "gpu-b01", "job": "4711"})
    logs.host_logger("gpu-b01").warning("late", after_s=1.5)
    logs.close()
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["event"] for line in lines] == ["step_start", "slurm_step", "late"]
    assert {"timestamp", "level", "event", "host", "run_id", "step"} <= lines[0].keys()
    with pytest.raises(ValueError, match="closed file"):
        log.info("after_close")


@pytest.mark.parametrize("nanos", [1_764_806_400_000_000_000, 1_764_806_399_999_999_999, 1_764_806_400_000_001_000])
def test_the_timestamp_is_isoformats(monkeypatch: pytest.MonkeyPatch, nanos: int) -> None:
    """The stamp is TimeStamper's (`datetime.isoformat`, UTC, `Z`): no fraction on a whole second, microseconds
    otherwise; its date made once a second, so two seconds apart never share one."""
    monkeypatch.setattr("fleet.runlog.jsonl.time.time_ns", lambda: nanos)
    when = datetime.fromtimestamp(nanos // 1000 / 1e6, tz=UTC).replace(microsecond=(nanos // 1000) % 1_000_000)
    assert jsonl.Lines().stamp() == when.isoformat().replace("+00:00", "Z")


def test_argvs_past_the_remembered_ones_are_still_written_as_the_chain_writes_them(tmp_path: Path) -> None:
    """More distinct argvs than are remembered (the memory is emptied when full): each line still the chain's."""
    lines = jsonl.Lines()
    for index in range(jsonl.REMEMBERED_LISTS + 5):
        fields = {"argv": ["nvidia-smi", f"--id={index}", "\u00e9"], "exit_status": index}
        assert STAMP.sub("T", written(tmp_path, "info", "command", fields, lines)) == STAMP.sub(
            "T", expected("info", "command", fields))
    assert 0 < len(lines.remembered) <= jsonl.REMEMBERED_LISTS
