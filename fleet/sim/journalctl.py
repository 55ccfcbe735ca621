"""A fake `journalctl` that answers the one question fleet asks a node's journal: this boot's Xids.

ROOT/bin/journalctl runs `python -m fleet.sim.journalctl --node ROOT ARGS...`. Answered (options in
any order, short or long, `--opt=value` or `--opt value`):

  journalctl -k -b -o short-unix --no-pager -q --grep "NVRM: Xid"

It prints every kernel message of this boot (ROOT/log/kern.log, see `state.log_kernel`) that the
pattern matches, in journalctl's short-unix form (systemd src/shared/logs-show.c:
`"%10" PRI_USEC ".%06" PRI_USEC`, then the host name, then `kernel: ` and the message):

  1701600000.123456 gpu-a01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.

Exit 0 when something matched; 1 when nothing did (journalctl --grep's rule since systemd 243, PR #12581),
with no output under -q (else `-- No entries --`). The pattern is a regular expression, matched without
case when it is all lowercase, as journalctl does. Anything else exits 1 with one line on stderr: an
unknown option as getopt reports it, an option this journal does not model as a refusal naming it.
Stdlib only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fleet.sim import state

XID_GREP = "NVRM: Xid"
OUTPUT = "short-unix"
# option -> (key, takes a value)
OPTIONS = {
    "-k": ("dmesg", False),
    "--dmesg": ("dmesg", False),
    "-b": ("boot", False),
    "--boot": ("boot", False),
    "-o": ("output", True),
    "--output": ("output", True),
    "--no-pager": ("no-pager", False),
    "-q": ("quiet", False),
    "--quiet": ("quiet", False),
    "-g": ("grep", True),
    "--grep": ("grep", True),
}
REQUIRED = ("dmesg", "boot", "output", "grep")
OUTPUT_MODES = (
    "short", "short-full", "short-iso", "short-iso-precise", "short-precise", "short-monotonic", "short-unix",
    "short-delta", "with-unit", "verbose", "export", "json", "json-pretty", "json-sse", "json-seq", "cat",
)  # fmt: skip
ANSWERED = f"-k -b -o {OUTPUT} --no-pager -q --grep PATTERN"


class Usage(Exception):
    """journalctl gave up before reading the journal: one line on stderr, exit 1."""


def pci_address(bus_id: str) -> str:
    """The GPU's PCI address as the driver writes it in an Xid: `00000000:1B:00.0` -> `0000:1b:00`."""
    domain, bus, device_fn = bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{device_fn.split('.')[0]}".lower()


def xid_message(bus_id: str, code: int, text: str) -> str:
    """The kernel message of Xid `code` on the GPU at `bus_id`; `text` is what follows the code, as the
    driver prints it (e.g. "pid=1234, name=python3, GPU has fallen off the bus.")."""
    return f"NVRM: Xid (PCI:{pci_address(bus_id)}): {code}, {text}"


def parse_args(argv: list[str]) -> dict[str, str]:
    """{key: value} for the options given (flags map to ""); `Usage` for anything else. Short flags
    may be bundled (`-kbq`), a short option's value attached (`-oshort-unix`), as getopt allows."""
    opts: dict[str, str] = {}
    tokens = iter(argv)

    def take(name: str, attached: str | None) -> None:
        key, takes_value = OPTIONS[name]
        if not takes_value:
            if attached is not None:
                raise Usage(f"journalctl: option '{name}' doesn't allow an argument")
            opts[key] = ""
            return
        value = attached if attached is not None else next(tokens, None)
        if value is None:
            raise Usage(f"journalctl: option '{name}' requires an argument")
        opts[key] = value

    for token in tokens:
        if token.startswith("--"):
            name, has_value, value = token.partition("=")
            if name not in OPTIONS:
                raise Usage(f"journalctl: unrecognized option '{name}'")
            take(name, value if has_value else None)
        elif token.startswith("-") and len(token) > 1:
            for at, letter in enumerate(token[1:], start=2):
                name = f"-{letter}"
                if name not in OPTIONS:
                    raise Usage(f"journalctl: invalid option -- '{letter}'")
                if OPTIONS[name][1]:
                    take(name, token[at:] or None)
                    break
                take(name, None)
        else:
            raise Usage(f"journalctl (simulated): matches are not modelled, only `{ANSWERED}`: {token}")
    return opts


def check(opts: dict[str, str]) -> re.Pattern[str]:
    """The compiled --grep pattern, once the options are the question this journal answers."""
    output = opts.get("output", "short")
    if output not in OUTPUT_MODES:
        raise Usage(f"Unknown output format '{output}'.")
    missing = [key for key in REQUIRED if key not in opts]
    if missing or output != OUTPUT:
        raise Usage(f"journalctl (simulated): only `{ANSWERED}` is answered")
    pattern = opts["grep"]
    try:
        return re.compile(pattern, 0 if any(c.isupper() for c in pattern) else re.IGNORECASE)
    except re.error as err:
        raise Usage(f'Failed to compile pattern "{pattern}": {err}') from None


def short_unix(record: state.KernelRecord, host: str) -> str:
    usec = record["usec"]
    return f"{usec // 1_000_000:10d}.{usec % 1_000_000:06d} {host} kernel: {record['message']}\n"


def run(root: Path, argv: list[str]) -> int:
    """Print what journalctl would for `argv` on the node at `root`; the exit status."""
    try:
        opts = parse_args(argv)
        pattern = check(opts)
    except Usage as usage:
        sys.stderr.write(f"{usage}\n")
        return 1
    host = state.load_config(root)["name"]
    lines = [short_unix(r, host) for r in state.kernel_records(root) if pattern.search(r["message"])]
    if not lines:
        if "quiet" not in opts:
            sys.stdout.write("-- No entries --\n")
        return 1
    sys.stdout.write("".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["--node"] or len(args) < 2:
        sys.stderr.write("usage: python -m fleet.sim.journalctl --node ROOT ARGS...\n")
        return 2
    return run(Path(args[1]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
