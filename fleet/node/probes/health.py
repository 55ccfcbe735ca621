"""GPU health facts for verify's health gate, read as the table of GPU facts (`fleet.model.gpu_facts`) says.

* `facts` + `remaps`: what verify reads on every driver that knows the fields (captures of 535 and 590):
  one `--query-gpu` of the table's fields (persistence, volatile ECC totals, pending page retirement, fabric
  state and status, PCIe generation and width: about 100 bytes a GPU) and `nvidia-smi -q -d ROW_REMAPPER`
  (the sections of the facts read from `-q -d`, as their rows say: about 400 bytes a GPU), joined by bus id into
  one `GpuHealth` each. About 4 KB for 8 GPUs, where `-q` is 150 KB. `remapped_rows.*` are not asked of
  `--query-gpu`: 535's does not know them, and one unknown field fails the whole query. A driver whose
  `--query-gpu` does not know a field (`Field "fabric.state" is not a valid field to query.`, exit 2: before
  ~525) reads as `FIELDS_UNKNOWN`, and verify reads the full `-q` instead (below), never nothing.
* `health`: one `nvidia-smi -q` for every GPU, read into a `GpuHealth` per `GPU 00000000:83:00.0` section, each
  fact at its row's key paths. The text differs by driver and GPU: ECC counts are `SRAM/DRAM ...` on Ampere and
  newer (`SRAM Uncorrectable` before driver ~535 split it into `Parity` and `SEC-DED`) and `Single Bit` /
  `Double Bit` ... `Total` on Volta and older; `Remapped Rows` is one `: N/A` line where the GPU has no row
  remapper, and `Fabric` is missing before driver ~525. A value or section that is missing, `N/A` or `Not
  Supported` (bracketed or not) is not said: not applicable.
* Unread is not absent: where nvidia-smi prints one of NVML's error strings instead of a value (`[Unknown
  Error]`, `[GPU is lost]`, ...: `fleet.model.gpu_facts.NVML_ERRORS`, or any other bracketed note) in a strict
  field (ECC, retired pages, row remapper, fabric), or on a section above one, the fact was not observed: it is not
  said and the GPU's `unread` names the check, the field and the note (the health gate fails that check).
The kernel log's Xid events are `fleet.node.probes.kernel_log`'s.

Only the lines the table asks for are read into values: a -q section's other lines are checked for their shape
(indentation, `Key : value`) and passed over.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from fleet.model import gpu_facts
from fleet.model.gpu_facts import MAYBE_NOTE, Field, GpuHealth, Path, Unread, reading
from fleet.node.probe import Probe
from fleet.node.probes.parse import ProbeParseError, lines
from fleet.node.probes.smi import SMI_HANG, classify_smi_failure
from fleet.transport.base import CommandResult

__all__ = ["FIELDS_UNKNOWN", "GpuHealth", "Unread", "facts", "facts_argv", "health", "health_argv", "health_fields",
           "joined", "parse_all_health", "parse_facts", "parse_health", "remaps", "remaps_argv"]

# What -q prints, unindented, for a GPU it cannot read (the others' sections may follow).
_UNREADABLE_GPU = ("Unable to determine the device handle", "GPU is lost", "fallen off the bus")

# `-q`'s indentation step.
INDENT = 4

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_KEY_VALUE = re.compile(r"(\S[^:]*?)\s*:(.*)")
_BANNER = re.compile(r"=+NVSMI LOG=+")
_UNINDENTED = re.compile(r"\n\S")  # the end of the line before an unindented one (faster than `^\S`, MULTILINE)
_ATTACHED = re.compile(r"^Attached GPUs[^\n]*", re.MULTILINE)  # the first line that begins so


class _Column(NamedTuple):
    """How one --query-gpu cell after the bus id reads: the fact's name and reader; the check a note in it leaves
    unread (a strict fact's) and the field that check names."""

    name: str
    parse: Callable[[str], Any]
    strict_check: str | None
    query: str


class _Key(NamedTuple):
    """A -q key path the table asks about (every path a fact is read at, and the sections above them), as a tree:
    the keys under it by name in lower case (none: nothing under it is read)."""

    path: Path  # in lower case
    read: bool  # a fact is read here, or a note here leaves one unread (a strict fact's path or a section above it)
    under: dict[str, _Key]


@dataclass(frozen=True)
class _Lookup:
    """What the table asks of nvidia-smi's output, built once per table."""

    asked: tuple[Field[Any], ...]  # the --query-gpu fields after pci.bus_id, in order
    query: str  # the --query-gpu field list: the bus id, then theirs
    columns: tuple[_Column, ...]  # how each of their cells reads
    displays: tuple[str, ...]  # the `-q -d` sections the other facts are read from
    shown: tuple[Field[Any], ...]  # the facts read from those sections
    facts: dict[str, Field[Any]]  # by name
    paths: dict[str, tuple[Path, ...]]  # each fact's -q key paths, lower case, by its name
    at: dict[Path, str]  # every one of them: the name of the fact read there
    noted: dict[Path, tuple[str, ...]]  # a strict fact's path, or a section's above it: the checks a note there
    # leaves unread
    top: _Key  # the tree of the paths, from the top of a GPU's section


def _lookup(table: tuple[Field[Any], ...]) -> _Lookup:
    paths = {fact.name: tuple(tuple(part.lower() for part in printed) for printed in fact.q) for fact in table}
    facts = {fact.name: fact for fact in table}
    noted: dict[Path, set[str]] = {}
    for name, lowered in paths.items():
        for path in lowered if facts[name].strict else ():
            for end in range(1, len(path) + 1):
                noted.setdefault(path[:end], set()).add(facts[name].check or "")
    displays = tuple(dict.fromkeys(f.display for f in table if f.display is not None))
    asked = tuple(f for f in table if f.display is None)
    columns = tuple(_Column(f.name, f.read.parse, f.check if f.strict else None, f.query) for f in asked)
    at = {path: name for name, lowered in paths.items() for path in lowered}
    query = ",".join(("pci.bus_id", *(f.query for f in asked)))
    return _Lookup(asked, query, columns, displays, tuple(f for f in table if f.display is not None), facts, paths, at,
                   {path: tuple(sorted(checks)) for path, checks in noted.items()}, _tree((), at.keys() | noted.keys()))


def _tree(path: Path, read: set[Path]) -> _Key:
    """The key at `path` and those under it, of `read` (every path read, and every section above one)."""
    below = {p[len(path)] for p in read if len(p) > len(path) and p[:len(path)] == path}
    return _Key(path, path in read, {name: _tree((*path, name), read) for name in sorted(below)})


lookup = gpu_facts.derived(_lookup)


# --- nvidia-smi -q ------------------------------------------------------------


def health_argv(nvidia_smi: str) -> list[str]:
    """One `nvidia-smi -q` answers for every GPU."""
    return [nvidia_smi, "-q"]


def parse_health(text: str) -> tuple[GpuHealth, ...]:
    """One `GpuHealth` per `GPU <bus id>` section of `nvidia-smi -q`, in order."""
    return tuple(_sections(text, lookup()))


def parse_all_health(text: str) -> tuple[GpuHealth, ...]:
    """`parse_health`, and the banner's `Attached GPUs : N` must match the sections that follow: output cut
    short (a transport's bound, a tool that died mid-way) is never read as fewer GPUs to judge."""
    found = parse_health(text)
    attached = _ATTACHED.search(text)
    if attached is not None:
        said = attached[0].partition(":")[2].strip()
        if said.isdigit() and int(said) != len(found):
            raise ProbeParseError(text.count("\n", 0, attached.start()) + 1, attached[0].removesuffix("\r"),
                                  f"{said} GPUs attached, {len(found)} GPU sections follow (output cut?)")
    return found


# One value the table asks for, as -q printed it: (line number, line, the value or None, the note or None).
_Got = tuple[int, str, str | None, str | None]
# A section a line is in: its name as printed, and its key in the table's tree (None: the table asks for nothing
# under it, and its lines are checked for their shape only).
_Open = tuple[str, _Key | None]
_PASSED: _Open = ("", None)


class _Section:
    """One GPU's -q section, line by line: the values the table asks for, and the notes that leave a fact unread."""

    def __init__(self, bus_id: str, ask: _Lookup, header: dict[Path, _Got]) -> None:
        self.bus_id = bus_id
        self.ask = ask
        self.got: dict[Path, _Got] = dict(header)  # the header's values hold for every GPU (`Driver Version`)
        self.unread: list[Unread] = []

    def read(self, rows: list[str], lineno: int) -> GpuHealth:
        """The section's lines below its header, the first one line `lineno`: each a `Key : value`, or the header
        of a nested section (blank ones passed over)."""
        stack: list[_Open] = []  # the sections the line is in
        top = self.ask.top
        for at, line in enumerate(rows, lineno):
            stripped = line.lstrip(" ")
            if not stripped or stripped.isspace():
                continue
            indent = len(line) - len(stripped)
            depth = indent // INDENT
            if indent % INDENT or depth == 0 or depth > len(stack) + 1:
                raise ProbeParseError(at, line, f"unexpected indentation ({indent} spaces)")
            del stack[depth - 1:]
            parent = stack[-1][1] if stack else top
            if parent is None:
                stack.append(_PASSED)
                continue
            key, colon, raw = stripped.partition(":")
            name = key.rstrip() if colon and key else stripped.strip()
            asked = parent.under.get(name.lower())
            if asked is None:
                stack.append(_PASSED)
                continue
            if asked.read and colon and key:
                self._value(at, line, asked.path, raw, (stack, name))
            # a key may have lines under it too (`Process ID`); a section's name is kept for a note's label under it
            stack.append((name, asked) if asked.under else _PASSED)
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
        facts = {}
        ask = self.ask
        for name in dict.fromkeys(ask.at[p] for p in self.got if p in ask.at):
            value = _fact(ask.facts[name], [self.got[p] for p in ask.paths[name] if p in self.got])
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


def _sections(text: str, ask: _Lookup) -> Iterator[GpuHealth]:
    """Each GPU section: its header (an unindented line) and the lines below it, up to the next unindented line (a
    search for each of those, not a test of every line), read as the next one (or the end) is reached."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").removesuffix("\r")  # each line without its "\r", as `lines` reads it
    section: _Section | None = None
    seen: set[str] = set()
    header: dict[Path, _Got] = {}
    at, lineno = 0, 1  # where the lines below the last unindented one begin, and the number of the first
    for start in _unindented(text):
        rows = text[at:start].split("\n")
        if section is not None:
            yield section.read(rows, lineno)
        else:
            _nothing_above(rows, lineno)
        lineno += len(rows) - 1
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        bus_id = _top_level(lineno, line, section is not None, seen)
        if bus_id is None:
            _header(lineno, line, ask, header)
        section = None if bus_id is None else _Section(bus_id, ask, header)
        at, lineno = len(text) if end < 0 else end + 1, lineno + 1
    rows = text[at:].split("\n")
    if section is not None:
        yield section.read(rows, lineno)
    else:
        _nothing_above(rows, lineno)


def _unindented(text: str) -> Iterator[int]:
    """Where each unindented line begins."""
    if text[:1] and not text[:1].isspace():
        yield 0
    for found in _UNINDENTED.finditer(text):
        yield found.start() + 1


def _nothing_above(rows: list[str], lineno: int) -> None:
    """Lines before the first GPU section, below an unindented one (the first line `lineno`): blank, or none."""
    for at, line in enumerate(rows, lineno):
        if line and not line.isspace():
            raise ProbeParseError(at, line, "indented line before the first GPU section")


def _header(lineno: int, line: str, ask: _Lookup, header: dict[Path, _Got]) -> None:
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
    if any(needle in line for needle in _UNREADABLE_GPU):
        raise ProbeParseError(lineno, line, "nvidia-smi names a GPU it cannot read")
    if not in_gpu and (_BANNER.fullmatch(line.strip()) or _KEY_VALUE.fullmatch(line)):
        return None
    raise ProbeParseError(lineno, line, "expected a 'GPU <bus id>' section header")


# --- --query-gpu's fields and -q -d ROW_REMAPPER ------------------------------------------------------------

# What `facts` reads when the driver does not know one of the fields: read `-q` instead.
FIELDS_UNKNOWN = None
_UNKNOWN_FIELD = re.compile(r'Field "[^"]+" is not a valid field to query\.')


def health_fields() -> tuple[str, ...]:
    """The --query-gpu fields `facts` asks, in order: the bus id, then the table's."""
    return tuple(lookup().query.split(","))


def facts_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, f"--query-gpu={lookup().query}", "--format=csv,noheader,nounits"]


def parse_facts(text: str) -> tuple[GpuHealth, ...] | None:
    """One `GpuHealth` a CSV row (the facts read from `-q -d` unknown: `remaps` says them); FIELDS_UNKNOWN when
    nvidia-smi says it does not know a field. A row with too few or too many values is unreadable, never a GPU
    less."""
    if _UNKNOWN_FIELD.search(text):
        return FIELDS_UNKNOWN
    columns = lookup().columns
    rows = [_fact_row(lineno, line, columns) for lineno, line in lines(text)]
    if not rows:
        raise ProbeParseError(1, text[:80], "no GPU listed")
    return tuple(rows)


def _fact_row(lineno: int, line: str, columns: tuple[_Column, ...]) -> GpuHealth:
    """One CSV row: a split, then each cell read by its column (a plain value straight to its reader; a cell
    that may be a note through `reading`)."""
    bus, *cells = line.split(",")
    if len(cells) != len(columns):
        raise ProbeParseError(lineno, line, f"{len(cells) + 1} values, {len(columns) + 1} fields asked (output cut?)")
    bus_id = bus.strip()
    if not _BUS_ID.fullmatch(bus_id):
        raise ProbeParseError(lineno, line, "no PCI bus id")
    facts: dict[str, object] = {}
    unread = []
    for (name, parse, strict_check, query), cell in zip(columns, cells, strict=True):
        text = cell.strip()
        if text[:1] == "[" or text in MAYBE_NOTE:
            said, note = reading(text)
            if said is None:
                if note is not None and strict_check is not None:
                    unread.append(Unread(strict_check, query, note))
                continue
            text = said
        try:
            facts[name] = parse(text)
        except ValueError as exc:
            raise ProbeParseError(lineno, line, str(exc)) from None
    return GpuHealth(bus_id, facts, tuple(unread))


def remaps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "-q", "-d", ",".join(lookup().displays)]


def joined(facts: tuple[GpuHealth, ...], remaps: tuple[GpuHealth, ...]) -> tuple[GpuHealth, ...]:
    """Each GPU's facts with those read from `-q -d` (its row remapper's state); the two reads must list the same
    GPUs (by bus id)."""
    by_bus = {r.bus_id.upper(): r for r in remaps}
    if set(by_bus) != {f.bus_id.upper() for f in facts}:
        raise ProbeParseError(1, "", f"--query-gpu and -q -d ROW_REMAPPER list other GPUs ({len(facts)} and "
                                     f"{len(remaps)}; output cut?)")
    shown = lookup().shown
    names, checks = {f.name for f in shown}, {f.check for f in shown}
    return tuple(_with_shown(f, by_bus[f.bus_id.upper()], names, checks) for f in facts)


def _with_shown(facts: GpuHealth, section: GpuHealth, names: set[str], checks: set[str | None]) -> GpuHealth:
    said = {name: value for name, value in section.facts.items() if name in names}
    unread = tuple(u for u in section.unread if u.check in checks)
    return GpuHealth(facts.bus_id, {**facts.facts, **said}, (*facts.unread, *unread))


# --- the probes -------------------------------------------------------------


def _explain(result: CommandResult) -> str:
    return classify_smi_failure(result.exit_status, result.stdout, result.stderr)


def facts(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...] | None]:
    """Exit 2 is an answer only with nvidia-smi's "not a valid field" line (FIELDS_UNKNOWN); any other exit
    2 is unreadable output, not a missing field."""
    return Probe(tuple(facts_argv(nvidia_smi)), "nvidia-smi --query-gpu", parse_facts,
                 ok_exits=frozenset({0, 2}), reads="nvidia-smi health fields", hang=SMI_HANG, explain=_explain,
                 driver=True)


def remaps(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(tuple(remaps_argv(nvidia_smi)), f"nvidia-smi -q -d {','.join(lookup().displays)}", parse_all_health,
                 reads=f"nvidia-smi -q -d {','.join(lookup().displays)} output", hang=SMI_HANG, explain=_explain,
                 driver=True)


def health(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(tuple(health_argv(nvidia_smi)), "nvidia-smi -q", parse_all_health, reads="nvidia-smi -q output",
                 hang=SMI_HANG, explain=_explain, driver=True)
