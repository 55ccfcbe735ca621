"""`nvidia-smi -q`'s GPU sections, read as the table of GPU facts asks (`fleet.node.probes.asked`): a
`GpuHealth` per `GPU 00000000:83:00.0` section, each fact at its row's key paths.

The unindented lines (the banner, `Key : value` before the first GPU, each GPU's header) are found by a search,
not a test of every line; a GPU's lines below its header are read one by one along the tree of key paths the table
asks about (`Key`): only the lines it asks for are read into values, the others are checked for their shape
(indentation, `Key : value`) and passed over. A section whose lines below its header are the section before's
(nearly every GPU of a node) is not read again: its facts and notes are that section's. Output that is cut or
malformed is a `ProbeParseError` naming the line, never fewer facts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fleet.model.gpu_facts import Field, GpuHealth, Path, Unread, reading
from fleet.node.probes.asked import Key, Lookup
from fleet.node.probes.parse import ProbeParseError

__all__ = ["INDENT", "sections"]

# What -q prints, unindented, for a GPU it cannot read (the others' sections may follow).
_UNREADABLE_GPU = ("Unable to determine the device handle", "GPU is lost", "fallen off the bus")

# `-q`'s indentation step.
INDENT = 4

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_BANNER = re.compile(r"=+NVSMI LOG=+")
_UNINDENTED = re.compile(r"\n(?=\S)")  # the end of a line before an unindented one (faster than `^\S`, MULTILINE)


# One value the table asks for, as -q printed it: (line number, line, the value or None, the note or None).
_Got = tuple[int, str, str | None, str | None]
# A section a line is in, that the table asks about: its name as printed, and its key in the table's tree.
_Open = tuple[str, Key]


class _Section:
    """One GPU's -q section, line by line: the values the table asks for, and the notes that leave a fact unread."""

    def __init__(self, bus_id: str, ask: Lookup, header: dict[Path, _Got]) -> None:
        self.bus_id = bus_id
        self.ask = ask
        self.got: dict[Path, _Got] = dict(header)  # the header's values hold for every GPU (`Driver Version`)
        self.unread: list[Unread] = []

    def read(self, rows: list[str], lineno: int) -> GpuHealth:
        """The section's lines below its header, the first one line `lineno`: each a `Key : value`, or the header
        of a nested section (blank ones passed over). Below a key the table asks nothing under, a line is checked
        for its indentation only."""
        stack: list[_Open] = []  # the sections the line is in
        top = self.ask.top
        last = 0  # the depth of the line before
        passed = 0  # the depth of the last key the table asks nothing under, while the lines below it follow
        for at, line in enumerate(rows, lineno):
            stripped = line.lstrip(" ")
            if not stripped or stripped.isspace():
                continue
            indent = len(line) - len(stripped)
            depth = indent // INDENT
            if indent % INDENT or depth == 0 or depth > last + 1:
                raise ProbeParseError(at, line, f"unexpected indentation ({indent} spaces)")
            last = depth
            if passed and depth > passed:
                continue
            del stack[depth - 1:]
            key, colon, raw = stripped.partition(":")
            name = key.rstrip() if colon and key else stripped.strip()
            asked = (stack[-1][1] if stack else top).under.get(name.lower())
            if asked is not None and asked.read and colon and key:
                self._value(at, line, asked.path, raw, (stack, name))
            # a key may have lines under it too (`Process ID`); a section's name is kept for a note's label under it
            if asked is not None and asked.under:
                stack.append((name, asked))
                passed = 0
            else:
                passed = depth
        return self.health()

    def _value(self, lineno: int, line: str, path: Path, raw: str, within: tuple[list[_Open], str]) -> None:
        """The value at `path`; `within`: the sections the line is in and its key, as printed (a note's label)."""
        text, note = reading(raw)
        self.got[path] = (lineno, line, text, note)
        if note is not None:
            stack, name = within
            label = " / ".join((*(open_[0] for open_ in stack), name))
            self.unread += [Unread(check, label, note) for check in self.ask.noted.get(path, ())]

    def health(self) -> GpuHealth:
        """Each fact from the values read at its paths, in the order first read: at its one path, that value as its
        row reads it; at several, `_fact` of them."""
        ask, got = self.ask, self.got
        facts = {}
        for name in dict.fromkeys([ask.at[p] for p in got if p in ask.at]):
            paths = ask.paths[name]
            if len(paths) == 1:
                lineno, line, text, _ = got[paths[0]]
                value = None if text is None else _q_value(ask.facts[name], lineno, line, text)
            else:
                value = _fact(ask.facts[name], [got[p] for p in paths if p in got])
            if value is not None:
                facts[name] = value
        return GpuHealth(self.bus_id, facts, tuple(self.unread))


def _fact(fact: Field[Any], printed: list[_Got]) -> object:
    """The fact from the values -q printed at its paths: the first, or (a total) their sum; None when none was
    printed, or (a total) one of them is a note."""
    if not printed or (fact.total and any(note is not None for *_, note in printed)):
        return None
    values = [_q_value(fact, lineno, line, text) for lineno, line, text, _ in printed if text is not None]
    if not values:
        return None
    return sum(values) if fact.total else values[0]


def _q_value(fact: Field[Any], lineno: int, line: str, text: str) -> Any:
    """A -q value as its row reads it, after the unit -q prints (`16x`)."""
    if fact.unit:
        if not text.endswith(fact.unit):
            raise ProbeParseError(lineno, line, f"{fact.read.what} is not like {fact.like!r}")
        text = text[:-len(fact.unit)]
    try:
        return fact.read.parse(text)
    except ValueError as exc:
        raise ProbeParseError(lineno, line, str(exc)) from None


def sections(text: str, ask: Lookup) -> Iterator[GpuHealth]:
    """Each GPU section: its header (an unindented line) and the lines below it, up to the next unindented line (the
    text cut before each of those in one split, not a test of every line), read in turn."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").removesuffix("\r")  # each line without its "\r", as `lines` reads it
    chunks = _UNINDENTED.split(text)  # each an unindented line and the lines below it; the first maybe none
    lineno = 1
    if not chunks[0][:1] or chunks[0][:1].isspace():  # lines before the first unindented one
        above = chunks.pop(0).split("\n")
        _nothing_above(above, lineno)
        lineno += len(above)
    section: _Section | None = None
    seen: set[str] = set()
    header: dict[Path, _Got] = {}
    before: tuple[str, GpuHealth] | None = None  # the GPU section before: its lines below its header, and its facts
    for chunk in chunks:
        line, *rows = chunk.split("\n")
        bus_id = _top_level(lineno, line, section is not None, seen)
        if bus_id is None:
            _header(lineno, line, ask, header)
            _nothing_above(rows, lineno + 1)
        else:
            below = chunk[len(line):]
            if before is not None and before[0] == below:  # lines below its header the same as the GPU section's
                # before (nearly every GPU of a node): the same facts and notes, read once; only the bus id differs
                read = GpuHealth(bus_id, dict(before[1].facts), before[1].unread)
            else:
                section = _Section(bus_id, ask, header)
                read = section.read(rows, lineno + 1)
            before = below, read
            yield read
        lineno += len(rows) + 1


def _nothing_above(rows: list[str], lineno: int) -> None:
    """Lines before the first GPU section, below an unindented one (the first line `lineno`): blank, or none."""
    for at, line in enumerate(rows, lineno):
        if line and not line.isspace():
            raise ProbeParseError(at, line, "indented line before the first GPU section")


def _header(lineno: int, line: str, ask: Lookup, header: dict[Path, _Got]) -> None:
    """A `Key : value` line before the first GPU whose key a fact is read at."""
    key, colon, raw = line.partition(":")
    path = (key.strip().lower(),)
    if colon and path in ask.at:
        header[path] = (lineno, line, *reading(raw))


def _top_level(lineno: int, line: str, in_gpu: bool, seen: set[str]) -> str | None:
    """An unindented line: a GPU section's header, or (before the first one) the banner and `Key : value`."""
    header = _GPU_HEADER.fullmatch(line.rstrip())
    if header is not None:
        if header.group(1) in seen:
            raise ProbeParseError(lineno, line, "GPU listed twice")
        seen.add(header.group(1))
        return header.group(1)
    if line.startswith("GPU "):
        raise ProbeParseError(lineno, line, "GPU section header without a PCI bus id")
    if any(map(line.__contains__, _UNREADABLE_GPU)):
        raise ProbeParseError(lineno, line, "nvidia-smi names a GPU it cannot read")
    if not in_gpu and (_BANNER.fullmatch(line.strip()) or _key_value(line)):
        return None
    raise ProbeParseError(lineno, line, "expected a 'GPU <bus id>' section header")


def _key_value(line: str) -> bool:
    r"""A `Key : value` line: it begins with other than a space-like character, and a colon follows (what the pattern
    `(\S[^:]*?)\s*:(.*)` matches whole, without that pattern's search for the colon a character at a time)."""
    return line[:1] != "" and not line[:1].isspace() and ":" in line[1:]
