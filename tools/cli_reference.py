"""docs/cli.md, generated from the typer app: every command, its arguments and options with their help.

    python tools/cli_reference.py > docs/cli.md        # write it
    python tools/cli_reference.py --check docs/cli.md  # exit 1, saying so, when the file differs (make check)

It walks the click command tree typer builds from the app that the `fleet` console script's module declares, so
the reference follows the command line wherever the app lives; hidden commands and options are left out.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import typer
from typer.main import get_command

HEADER = (
    "# Command-line reference\n\n"
    "Generated from the typer app by `python tools/cli_reference.py > docs/cli.md`; do not edit it by hand:\n"
    "`make check` fails when it differs from what the script prints. What the options mean in practice is in\n"
    "[operating.md](operating.md); the exit status in [README.md](../README.md#exit-status).\n"
)


def fleet_app() -> typer.Typer:
    """The Typer instance in the module that declares the `fleet` console script's function, or in the module that
    module names as its `COMMAND_LINE` (a console script that sets things up before it imports the app)."""
    (script,) = entry_points(group="console_scripts", name="fleet")
    module = import_module(script.value.split(":")[0])
    main = getattr(module, script.value.split(":")[1])
    home = import_module(getattr(module, "COMMAND_LINE", main.__module__))
    apps = [value for value in vars(home).values() if isinstance(value, typer.Typer)]
    if len(apps) != 1:
        raise SystemExit(f"cli_reference: expected one typer app in {home.__name__}, found {len(apps)}")
    return apps[0]


def oneline(text: str | None) -> str:
    """Help text as one table cell: whitespace folded, pipes escaped."""
    return " ".join((text or "").replace("\b", "").split()).replace("|", "\\|")


def names(param: Any) -> str:
    """`-i, --inventory PATH` for an option, `HOSTS...` for an argument."""
    if param.param_type_name == "argument":
        return f"`{param.metavar or param.name.upper()}{'...' if param.nargs == -1 else ''}`"
    flags = ", ".join([*param.opts, *param.secondary_opts])
    metavar = "" if param.is_flag or param.count else f" {param.metavar or param.type.name.upper()}"
    return f"`{flags}{metavar}`".replace("|", "\\|")  # a pipe splits a table cell, code span or not


def default(param: Any) -> str:
    """The default as the command line shows it; blank where there is none (or it is off)."""
    value = param.default
    if param.param_type_name == "argument" or value is None or value is False or value == () or param.required:
        return "required" if param.required else ""
    if callable(value):
        return ""
    return f"`{value.value if hasattr(value, 'value') else value}`"


def help_of(param: Any) -> str:
    envvar = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar or ())
    text = oneline(getattr(param, "help", None))
    return f"{text} (env: `{envvar}`)" if envvar else text


def table(params: list[Any]) -> Iterator[str]:
    shown = [p for p in params if not getattr(p, "hidden", False)]
    if not shown:
        return
    yield "| argument or option | default | help |"
    yield "| --- | --- | --- |"
    for param in shown:
        yield f"| {names(param)} | {default(param)} | {help_of(param)} |"


def epilog(text: str | None) -> Iterator[str]:
    if text:
        yield "```"
        yield from (line.rstrip() for line in text.replace("\b", "").strip("\n").splitlines())
        yield "```"


def section(path: str, command: Any, ctx: Any) -> Iterator[str]:
    yield f"## `{path}`"
    yield ""
    yield f"`{command.get_usage(ctx).removeprefix('Usage: ').strip()}`"
    yield ""
    if command.help:
        yield command.help.replace("\b", "").strip()
        yield ""
    rows = list(table(command.params))
    if rows:
        yield from rows
        yield ""
    ends = list(epilog(command.epilog))
    if ends:
        yield from ends
        yield ""


def reference() -> str:
    root: Any = get_command(fleet_app())
    ctx = root.context_class(root, info_name="fleet")
    lines = [HEADER]
    lines += list(section("fleet", root, ctx))
    for name in root.list_commands(ctx):  # in the order the app declares them
        command = root.get_command(ctx, name)
        if not command.hidden:
            lines += list(section(f"fleet {name}", command, root.context_class(command, info_name=name, parent=ctx)))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = reference()
    if argv[:1] == ["--check"] and len(argv) == 2:
        if Path(argv[1]).read_text() == text:
            return 0
        sys.stderr.write(f"{argv[1]} differs from the command line: python tools/cli_reference.py > {argv[1]}\n")
        return 1
    if argv:
        sys.stderr.write("usage: cli_reference.py [--check FILE]\n")
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
