"""contrib/: the systemd units and the cron line parse, and the fleet command they run is one fleet accepts."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import typer
from support.paths import REPO

from fleet.cli.commands import app
from fleet.engine.waves import parse_duration

CONTRIB = REPO / "contrib"
SERVICE = CONTRIB / "fleet-reset.service"
TIMER = CONTRIB / "fleet-reset.timer"
CRON = CONTRIB / "fleet.cron"
REDIRECT = re.compile(r"\d*>>?|\d*>&\d|<")


def unit(path: Path) -> configparser.ConfigParser:
    """A unit file read as INI: case kept, repeated keys allowed (the last wins), no % interpolation."""
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                       comment_prefixes=("#", ";"), empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep case: configparser's documented way
    parser.read_string(path.read_text(), source=str(path))
    return parser


@cache
def reset_help_options() -> frozenset[str]:
    """Every option `fleet reset --help` lists, as a user sees it."""
    out = subprocess.run([sys.executable, "-m", "fleet", "reset", "--help"], capture_output=True, text=True,
                         check=True, timeout=60, env={**os.environ, "COLUMNS": "200"}).stdout
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", out))


def service_argv() -> list[str]:
    return shlex.split(unit(SERVICE)["Service"]["ExecStart"])


def cron_argv() -> list[str]:
    """The fleet command of the cron file's one job line: after the schedule, the user, flock and timeout,
    before the redirections."""
    [line] = [ln for ln in CRON.read_text().splitlines()
              if ln.strip() and not ln.startswith("#") and not re.match(r"^[A-Z_]+=", ln)]
    words = shlex.split(line)
    start = next(i for i, w in enumerate(words) if Path(w).name == "fleet")
    end = next((i for i, w in enumerate(words) if REDIRECT.fullmatch(w)), len(words))
    return words[start:end]


def assert_fleet_accepts(argv: list[str]) -> None:
    """Every option is one `fleet reset --help` lists, and fleet's own parser takes the whole line (option
    names, arity, types and bounds) without running it; the durations parse as fleet parses them."""
    assert Path(argv[0]).name == "fleet" and argv[1] == "reset", argv
    args = argv[2:]
    used = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    assert used - reset_help_options() == set(), f"not options of `fleet reset`: {used - reset_help_options()}"
    group = typer.main.get_command(app)
    with group.make_context("fleet", ["reset"]) as parent:
        command = group.get_command(parent, "reset")  # type: ignore[attr-defined]  # fleet's app is a click Group
        assert command is not None
        with command.make_context("reset", list(args), parent=parent) as ctx:
            params = ctx.params
    if params.get("deadline"):
        assert parse_duration(params["deadline"]) > 0


def test_the_service_is_a_oneshot_with_fleets_log_dir() -> None:
    service = unit(SERVICE)["Service"]
    assert service["Type"] == "oneshot"
    assert "FLEET_LOG_DIR=/var/log/fleet" in shlex.split(service["Environment"])
    assert "%" not in service["ExecStart"]  # systemd would read it as a specifier


def test_the_services_fleet_command_is_accepted_by_fleet() -> None:
    argv = service_argv()
    assert argv[0].startswith("/")  # systemd wants an absolute path (or searches its own fixed PATH)
    assert_fleet_accepts(argv)
    for required in ("-y", "--json", "--deadline", "--metrics-file"):
        assert required in argv


def systemd_seconds(span: str) -> float:
    """A systemd time span (`55min`, `1h 5min`, `3300`) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and "".join(n + u for n, u in parts) == span.replace(" ", ""), span
    return sum(float(n) * units[u] for n, u in parts)


def test_systemd_gives_the_run_more_time_than_its_deadline() -> None:
    """fleet's own --deadline ends the run (report written, Slurm released); systemd's SIGTERM comes later."""
    argv = service_argv()
    deadline = parse_duration(argv[argv.index("--deadline") + 1])
    assert systemd_seconds(unit(SERVICE)["Service"]["TimeoutStartSec"]) > deadline


def test_the_timer_starts_the_service_nightly_and_catches_up() -> None:
    timer = unit(TIMER)
    assert timer["Timer"]["Unit"] == SERVICE.name and SERVICE.exists()
    assert timer["Timer"]["OnCalendar"]
    assert timer["Timer"]["Persistent"] == "true"
    assert systemd_seconds(timer["Timer"]["RandomizedDelaySec"]) > 0
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_the_cron_line_runs_the_same_command_under_flock() -> None:
    text = CRON.read_text()
    job = next(ln for ln in text.splitlines() if re.match(r"^[\d*]", ln))
    assert len(job.split()) > 6 and job.split()[5] == "root"  # /etc/cron.d format: the user field
    assert " flock -n " in job and ">>" in job and "%" not in job  # cron turns % into a newline
    assert "FLEET_LOG_DIR=/var/log/fleet" in text.splitlines()
    assert cron_argv()[1:] == service_argv()[1:]
    assert_fleet_accepts(cron_argv())


@pytest.mark.parametrize(("bad", "error"), [(["--no-such-option"], AssertionError),  # not in --help
                                             (["-j", "0"], typer.TyperException),  # out of bounds
                                             (["-y", "--deadline"], typer.TyperException)])  # value missing
def test_the_check_itself_rejects_what_fleet_rejects(bad: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        assert_fleet_accepts(["fleet", "reset", *bad])
