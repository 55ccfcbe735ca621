"""The `fleet` console script (and `python -m fleet`): libraries' warnings quieted first, then the command line
imported and run, so that nothing a library raises while it is imported reaches the operator's terminal."""

from __future__ import annotations

from fleet.cli.library_warnings import quiet_libraries

COMMAND_LINE = "fleet.cli.commands"  # the typer app and its `main`, imported by `main` below once quieted


def main() -> int:
    quiet_libraries()
    from fleet.cli.commands import main as command_line

    return command_line()
