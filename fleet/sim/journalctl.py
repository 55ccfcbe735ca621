"""A fake `journalctl` that answers what fleet asks a node's journal: this boot's kernel messages.

ROOT/bin/journalctl runs `python -m fleet.sim.journalctl --node ROOT ARGS...`. Answered (options in any order,
short or long, `--opt=value` or `--opt value`, short flags bundled):

  journalctl -k -b [-a] -o short-unix [--no-pager] [-q] [--show-cursor] [--after-cursor CURSOR] [--grep PATTERN]

It prints the kernel messages of this boot (ROOT/log/kern.log, see `state.log_kernel`), those after CURSOR only
when given, those PATTERN matches only when given, in journalctl's short-unix form (systemd
src/shared/logs-show.c: `"%10" PRI_USEC ".%06" PRI_USEC`, then the host name, then `kernel: ` and the message):

  1701600000.123456 gpu-a01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.

A message is bytes, as journald keeps what the kernel wrote (a record's message with its non-UTF-8 bytes
surrogate-escaped). With -a each is printed as its bytes; without it, as systemd 252's output_short does, tabs
become eight spaces and ANSI CSI sequences are dropped, and a message that is still not printable UTF-8 (a
control character, a thread name the kernel cut mid-character) is printed `[<N>B blob data]` (N its bytes). A
message's further lines are indented to its first line's prefix.
and what systemd 252 prints around them, as tests/fixtures/journalctl/ captured it (its SOURCES.md names the
source lines): `-- No entries --` when nothing was shown (not under -q); with --show-cursor, `-- cursor: ...` for
the last message read (the cursor's own when nothing came after it), in journalctl's format
(`s=<seqnum id>;i=<seqnum>;b=<boot id>;m=<monotonic>;t=<realtime>;x=<hash>`, hex) and only when there was one.
Exit 0; 1 when there was no kernel message at all, when --grep matched nothing (systemd 243,
systemd/systemd#12581), and on every error. A pattern is a regular expression (Python's here, PCRE2 there),
matched without case when it is all lowercase, as journalctl does.

The node's journal (NodeSpec `journal`, switched with `SimNode.set_journal`): `ok`; `no_pcre`, a journalctl built
without pattern matching (--grep: `Compiled without pattern matching support`); `no_files`, no journal file at all
(`No journal files were found.`); `no_permission`, a user outside the journal's groups who sees only their own
journal (the `Hint: ...` notice); `hang`, a journalctl that never answers. An unknown option is refused as getopt
reports it, one this journal does not model as a refusal naming it: one line on stderr, exit 1. Stdlib only.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.sim import state

XID_GREP = "NVRM: Xid"
OUTPUT = "short-unix"
JOURNAL_MODES = ("ok", "no_pcre", "no_files", "no_permission", "hang")
# option -> (key, takes a value)
OPTIONS = {
    "-k": ("dmesg", False),
    "-a": ("all", False),
    "--all": ("all", False),
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
    "--show-cursor": ("show-cursor", False),
    "--after-cursor": ("after-cursor", True),
}
REQUIRED = ("dmesg", "boot", "output")
OUTPUT_MODES = (
    "short", "short-full", "short-iso", "short-iso-precise", "short-precise", "short-monotonic", "short-unix",
    "short-delta", "with-unit", "verbose", "export", "json", "json-pretty", "json-sse", "json-seq", "cat",
)  # fmt: skip
ANSWERED = f"-k -b [-a] -o {OUTPUT} [--no-pager] [-q] [--show-cursor] [--after-cursor CURSOR] [--grep PATTERN]"
# What systemd 252 says (tests/fixtures/journalctl/SOURCES.md names each one's source).
NO_ENTRIES = "-- No entries --"
NO_PCRE = "Compiled without pattern matching support"
NO_FILES = "No journal files were found."
HINT = ("Hint: You are currently not seeing messages from other users and the system.\n"
        "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
        "      Pass -q to turn off this notice.")
BAD_CURSOR = "Failed to seek to cursor: Invalid argument"
BOOT_USEC = 1_000_000  # the monotonic clock of the first message (µs since the node "booted")


class Usage(Exception):
    """journalctl gave up before reading the journal: one line on stderr, exit 1."""


def boot_messages(driver_version: str) -> list[str]:
    """The kernel messages a simulated node's boot leaves (a real boot leaves hundreds; none is an Xid)."""
    return ["Linux version 6.8.0-49-generic (simulated node)",
            f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {driver_version}"]


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


def check(opts: dict[str, str], mode: str) -> re.Pattern[str] | None:
    """The compiled --grep pattern (None without one), once the options are a question this journal answers."""
    output = opts.get("output", "short")
    if output not in OUTPUT_MODES:
        raise Usage(f"Unknown output format '{output}'.")
    missing = [key for key in REQUIRED if key not in opts]
    if missing or output != OUTPUT:
        raise Usage(f"journalctl (simulated): only `{ANSWERED}` is answered")
    if "grep" not in opts:
        return None
    if mode == "no_pcre":
        raise Usage(NO_PCRE)
    pattern = opts["grep"]
    try:
        return re.compile(pattern, 0 if any(c.isupper() for c in pattern) else re.IGNORECASE)
    except re.error as err:
        raise Usage(f'Bad pattern "{pattern}": {err}') from None


@dataclass(frozen=True)
class Entry:
    """A kernel message as the journal holds it: its sequence number (from 1) and what kern.log recorded."""

    seqnum: int
    record: state.KernelRecord


def _hex_id(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:32]


def cursor(entry: Entry, host: str, boot_usec: int) -> str:
    """journalctl's cursor of an entry: seqnum id, seqnum, boot id, monotonic and realtime µs, a hash; hex."""
    usec = entry.record["usec"]
    x = hashlib.sha256(message_bytes(entry.record)).hexdigest()[:16]
    return (f"s={_hex_id(host, 'seqnum')};i={entry.seqnum:x};b={_hex_id(host, 'boot')};"
            f"m={usec - boot_usec + BOOT_USEC:x};t={usec:x};x={x}")


def position(text: str, entries: list[Entry], host: str) -> int:
    """The seqnum a cursor points at (sd_journal_seek_cursor: by seqnum in this journal, else by realtime); 0
    before the first entry. `Usage` for text that is not a cursor."""
    fields: dict[str, int] = {}
    for part in text.split(";"):
        key, eq, value = part.partition("=")
        if not eq or len(key) != 1 or not re.fullmatch(r"[0-9a-f]+", value):
            raise Usage(BAD_CURSOR)
        fields[key] = int(value, 16)
    if "i" in fields and text.startswith(f"s={_hex_id(host, 'seqnum')};"):
        return fields["i"]
    if "t" in fields:
        return max((e.seqnum for e in entries if e.record["usec"] <= fields["t"]), default=0)
    raise Usage(BAD_CURSOR)


# An ANSI CSI sequence (ESC [, parameter and intermediate bytes, a final byte), as strip_tab_ansi drops it.
_CSI = re.compile(rb"\x1b\[[\x20-\x3f]*[\x40-\x7e]")


def message_bytes(record: state.KernelRecord) -> bytes:
    """A record's message as the journal keeps it: bytes (those not UTF-8 are surrogate-escaped in the record)."""
    return record["message"].encode("utf-8", "surrogateescape")


def printable(message: bytes) -> bool:
    """systemd's utf8_is_printable: valid UTF-8 and no control character but a newline (C0, DEL, C1)."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F for c in text)


def printed(message: bytes, show_all: bool) -> bytes:
    """What journalctl prints of a message: its bytes under -a; else tabs spread, CSI dropped, or blob data."""
    if show_all:
        return message
    message = _CSI.sub(b"", message.replace(b"\t", b" " * 8))
    return message if printable(message) else f"[{len(message)}B blob data]".encode()


def short_unix(record: state.KernelRecord, host: str, show_all: bool = False) -> str:
    """One entry in journalctl's short-unix form (surrogate-escaped where its bytes are not UTF-8)."""
    usec = record["usec"]
    prefix = f"{usec // 1_000_000:10d}.{usec % 1_000_000:06d} {host} kernel: "
    lines = printed(message_bytes(record), show_all).split(b"\n")
    text = (b"\n" + b" " * len(prefix)).join(lines).decode("utf-8", "surrogateescape")
    return f"{prefix}{text}\n"


def answer(root: Path, opts: dict[str, str], pattern: re.Pattern[str] | None) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of journalctl on a journal it can read."""
    host = state.load_config(root)["name"]
    entries = [Entry(n, r) for n, r in enumerate(state.kernel_records(root), start=1)]
    boot_usec = entries[0].record["usec"] if entries else 0
    after = position(opts["after-cursor"], entries, host) if "after-cursor" in opts else None
    read = [e for e in entries if after is None or e.seqnum > after]
    shown = [e for e in read if pattern is None or pattern.search(e.record["message"])]
    out = "".join(short_unix(e.record, host, "all" in opts) for e in shown)
    if not shown and "quiet" not in opts:
        out += f"{NO_ENTRIES}\n"
    last = read[-1] if read else next((e for e in entries if after is not None and e.seqnum == after), None)
    if "show-cursor" in opts and last is not None:
        out += f"-- cursor: {cursor(last, host, boot_usec)}\n"
    failed = last is None or (pattern is not None and not shown)
    return out, "", 1 if failed else 0


def unreadable(mode: str, opts: dict[str, str]) -> tuple[str, str, int]:
    """What journalctl prints when it can open no journal with kernel messages in it: nothing read, exit 1."""
    quiet = "quiet" in opts
    notice = {"no_files": NO_FILES, "no_permission": HINT}[mode]
    return ("" if quiet else f"{NO_ENTRIES}\n"), ("" if quiet else f"{notice}\n"), 1


def run(root: Path, argv: list[str]) -> int:
    """Print what journalctl would for `argv` on the node at `root`; the exit status."""
    mode = state.load_config(root).get("journal", "ok")
    try:
        opts = parse_args(argv)
        pattern = check(opts, mode)
        if mode == "hang":
            time.sleep(3600)
        out, err, status = unreadable(mode, opts) if mode in ("no_files", "no_permission") else \
            answer(root, opts, pattern)
    except Usage as usage:
        sys.stderr.write(f"{usage}\n")
        return 1
    sys.stdout.buffer.write(out.encode("utf-8", "surrogateescape"))
    sys.stderr.write(err)
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["--node"] or len(args) < 2:
        sys.stderr.write("usage: python -m fleet.sim.journalctl --node ROOT ARGS...\n")
        return 2
    return run(Path(args[1]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
