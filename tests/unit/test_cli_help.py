"""`fleet <command> --help` as a pdsh, clush, Ansible or Slurm user reads it: reset's and check's options in
sections by purpose, metavars in words (no Python types, no `x>=1`), defaults where there is one, plain text that
fits 80 columns when piped; check's help saying only what a read-only check does; `runs -n/--count` with the old
`--limit` still taken; an unknown option's one-line error naming the option meant."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from fleet.cli.commands import app, main
from fleet.cli.options import CHECK_EXIT_CODES, EXIT_CODES, PANELS

COMMANDS = [[], ["reset"], ["check"], ["inventory"], ["runs"], ["show"], ["demo"]]
HEADING = re.compile(r"^(\S[^:]*):$")  # `Targeting:`, `Exit status:`; not `Usage: fleet ...`


def help_text(command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
              columns: int = 80) -> str:
    """The command's --help as printed to a pipe (capsys: not a terminal) `columns` wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main([*command, "--help"]) == 0
    return capsys.readouterr().out


def sections(text: str) -> dict[str, list[str]]:
    """Heading -> the first word of each of its entries (`-j` of `-j, -f, --concurrency N`, `HOST...`)."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if heading := HEADING.match(line):
            current = found.setdefault(heading.group(1), [])
        elif re.match(r"^  \S", line):
            current.append(line.split()[0].rstrip(","))
    return found


def test_reset_help_is_in_sections_by_purpose(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    found = sections(help_text(["reset"], capsys, monkeypatch))
    assert list(found) == [*PANELS, "Options", "Examples", "Exit status"]
    assert PANELS == ("Targeting", "Run control", "Safety and remedies", "Slurm and scheduler", "Output")
    assert found["Targeting"] == ["HOST...", "-i", "-g", "-l", "-x", "-w", "--missing-ok", "--partition",
                                  "--rerun-failed"]
    assert sorted(found["Run control"]) == sorted(["-j", "--batch", "--max-fail", "--canary", "--deadline", "-y",
                                                   "--dry-run"])
    assert found["Safety and remedies"] == ["--stop-units", "--gpu-reset", "--restore-settings", "--uniform"]
    assert sorted(found["Slurm and scheduler"]) == ["--drain-wait", "--scheduler", "--slurm", "--via"]
    assert found["Output"] == ["--json", "-v", "-q", "--metrics-file", "--log-dir", "--keep-days"]
    assert found["Options"] == ["-h"]


def test_check_help_is_in_sections_and_says_only_what_check_does(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(["check"], capsys, monkeypatch)
    found = sections(text)
    assert list(found) == ["Targeting", "Run control", "Slurm and scheduler", "Output", "Options", "Examples",
                           "Exit status"]
    assert sorted(found["Slurm and scheduler"]) == ["--scheduler", "--slurm"]
    for reset_only in ("Drain", "drain", "resume after", "give them back", "--dry-run", "dry run", "--deadline",
                       "--canary", "--max-fail", "skipped", "fleet reset"):
        assert reset_only not in text, reset_only
    assert "read-only" in text
    assert "130  interrupted" in text and "2    usage or inventory error" in text  # tests/sim/test_cli.py's too


def test_check_exit_codes_are_resets_own_codes() -> None:
    """check's exit status, written for a read-only run, lists codes that EXIT_CODES gives the same numbers."""
    def codes(text: str) -> list[str]:
        return re.findall(r"^  (\d+) ", text, re.MULTILINE)

    assert set(codes(CHECK_EXIT_CODES)) <= set(codes(EXIT_CODES))
    assert {"0", "1", "2", "129", "130"} <= set(codes(CHECK_EXIT_CODES))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fleet")
def test_every_help_is_plain_fits_80_columns_and_says_metavars_in_words(
        command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(command, capsys, monkeypatch)
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert too_wide == []
    assert "\x1b" not in text and not re.search("[\u2500-\u257f]", text)  # no ANSI escapes, no box drawing
    for python in ("list[", "<str>", "<int>", "<bool>", "<path>", "x>=", "x<=", "<=x"):
        assert python not in text, python


def test_metavars_and_defaults_read_as_words(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    reset = " ".join(help_text(["reset"], capsys, monkeypatch).split())
    for shown in ("HOST... Host names", "-w, --nodes HOSTLIST", "--deadline DURATION", "--batch N|P%",
                  "--drain-wait DURATION", "[default: 10m]", "--via ssh|srun", "[default: ssh]",
                  "-j, -f, --concurrency N", "(default: every host at once;", "--metrics-file PATH"):
        assert shown in reset, shown
    runs = " ".join(help_text(["runs"], capsys, monkeypatch).split())
    assert "-n, --count N At most N runs, newest first. [default: 20]" in runs
    assert "--limit" not in runs  # the old spelling, hidden
    assert "--nodes N How many simulated nodes (1 to 64). [default: 16]" in " ".join(
        help_text(["demo"], capsys, monkeypatch).split())


def test_a_wide_terminal_gets_the_same_80_column_help(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert help_text(["reset"], capsys, monkeypatch, columns=250) == help_text(["reset"], capsys, monkeypatch)


def test_every_section_a_command_declares_is_a_known_one() -> None:
    """A misspelt `rich_help_panel` would be a section of its own."""
    group: Any = typer.main.get_command(app)
    with group.make_context("fleet", ["reset"]) as parent:
        panels = {getattr(param, "rich_help_panel", None) for name in group.list_commands(parent)
                  for param in group.get_command(parent, name).params}
    assert panels - {None} == set(PANELS)


def runs_count(args: list[str]) -> int:
    """The N `fleet runs` reads from `args`, parsed as the command line parses it."""
    group: Any = typer.main.get_command(app)
    with group.make_context("fleet", ["runs"]) as parent:
        ctx = group.get_command(parent, "runs").make_context("runs", args, parent=parent)
        return int(ctx.params["limit"])


def test_runs_count_and_its_old_spelling_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert [runs_count(a) for a in ([], ["-n", "3"], ["--count", "4"], ["--count", "4", "--limit", "9"])] == [
        20, 3, 4, 4]
    assert capsys.readouterr().err.count("is now `runs -n/--count N`") == 1
    assert runs_count(["--limit", "5"]) == 5  # the old spelling still works, with a warning on stderr
    assert capsys.readouterr().err == "fleet: warning: `runs --limit N` is now `runs -n/--count N`\n"
    assert main(["runs", "--limit", "2", "--log-dir", str(tmp_path)]) == 0
    assert main(["runs", "--limit", "0", "--log-dir", str(tmp_path)]) == 2  # its bound too


def test_an_unknown_option_is_one_line_naming_the_option_meant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reset", "--dryrun"]) == 2
    err = capsys.readouterr().err
    assert "--dry-run" in err and "--dryrun" in err and err.count("\n") == 1 and err.startswith("fleet: error: ")
