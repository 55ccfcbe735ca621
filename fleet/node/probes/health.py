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

The -q text is read by `fleet.node.probes.q_sections`: only the lines the table asks for are read into values, a
section's other lines are checked for their shape (indentation, `Key : value`) and passed over.
"""

from __future__ import annotations

import functools
import re

from fleet.model.gpu_facts import MAYBE_NOTE, GpuHealth, Unread, reading
from fleet.node.probe import Probe
from fleet.node.probes.asked import Column, Lookup, lookup
from fleet.node.probes.parse import ProbeParseError, lines
from fleet.node.probes.q_sections import INDENT, sections
from fleet.node.probes.smi import SMI_HANG, classify_smi_failure
from fleet.transport.base import CommandResult

__all__ = ["FIELDS_UNKNOWN", "INDENT", "GpuHealth", "Unread", "facts", "facts_argv", "health", "health_argv",
           "health_fields", "merge_remaps", "parse_all_health", "parse_facts", "parse_health", "remaps",
           "remaps_argv"]

_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_ATTACHED = re.compile(r"^Attached GPUs[^\n]*", re.MULTILINE)  # the first line that begins so




# --- nvidia-smi -q ------------------------------------------------------------


def health_argv(nvidia_smi: str) -> list[str]:
    """One `nvidia-smi -q` answers for every GPU."""
    return [nvidia_smi, "-q"]


def parse_health(text: str) -> tuple[GpuHealth, ...]:
    """One `GpuHealth` per `GPU <bus id>` section of `nvidia-smi -q`, in order."""
    return tuple(sections(text, lookup()))


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
    ask = lookup()
    rows: list[GpuHealth] = []
    before = None  # the row before's text after its bus id
    for lineno, line in lines(text):
        bus, _, after = line.partition(",")
        # the same values as the row before (nearly every GPU of a node): its facts and notes, read once
        same = bool(rows) and before == after and _BUS_ID.fullmatch(bus.strip()) is not None
        rows.append(GpuHealth(bus.strip(), dict(rows[-1].facts), rows[-1].unread) if same else
                    _fact_row(lineno, line, ask))
        before = after
    if not rows:
        raise ProbeParseError(1, text[:80], "no GPU listed")
    return tuple(rows)


def _fact_row(lineno: int, line: str, ask: Lookup) -> GpuHealth:
    """One CSV row: a split, the cells stripped, those that may be a note read through `reading` (a search of the
    row for one first), then each value by its column's reader, in one comprehension."""
    bus, *cells = line.split(",")
    if len(cells) != len(ask.columns):
        raise ProbeParseError(lineno, line, f"{len(cells) + 1} values, {len(ask.columns) + 1} fields asked "
                                            "(output cut?)")
    bus_id = bus.strip()
    if not _BUS_ID.fullmatch(bus_id):
        raise ProbeParseError(lineno, line, "no PCI bus id")
    texts: list[str | None] = list(map(str.strip, cells))
    unread = _notes(texts, _maybe_notes(line, texts), ask.columns) if "[" in line or not MAYBE_NOTE.isdisjoint(texts) \
        else ()
    try:
        facts = {name: read(text) for name, read, text in zip(ask.names, ask.readers, texts, strict=True)
                 if text is not None}
    except (ValueError, KeyError):  # a text a builtin reader refuses: read again by the rows' own, for the message
        facts = _read_each(lineno, line, texts, ask.columns)
    return GpuHealth(bus_id, facts, unread)


def _read_each(lineno: int, line: str, texts: list[str | None], columns: tuple[Column, ...]) -> dict[str, object]:
    """A row's values, each by its row's `Reader.parse`: the first it refuses, in the columns' order, is the error."""
    facts: dict[str, object] = {}
    for column, text in zip(columns, texts, strict=True):
        if text is not None:
            try:
                facts[column.name] = column.parse(text)
            except ValueError as exc:
                raise ProbeParseError(lineno, line, str(exc)) from None
    return facts


def _maybe_notes(line: str, texts: list[str | None]) -> list[int]:
    """Which of a row's cells (after the bus id) may be a note, in order: those `MAYBE_NOTE` holds, and those that
    begin with "[" (found by a search of the row for "[": a cell's index is the commas before it, less the bus id's)."""
    found = MAYBE_NOTE.intersection(texts)
    maybe = {i for i, text in enumerate(texts) if text in found} if found else set()
    at = line.find("[")
    while at >= 0:
        i = line.count(",", 0, at) - 1
        if i >= 0 and (texts[i] or "")[:1] == "[":
            maybe.add(i)
        at = line.find("[", at + 1)
    return sorted(maybe)


def _notes(texts: list[str | None], maybe: list[int], columns: tuple[Column, ...]) -> tuple[Unread, ...]:
    """Each cell that may be a note (`maybe`) through `reading`: replaced in `texts` by the value it says (None:
    none); a note in a strict column is a fact unread."""
    unread = []
    for i in maybe:
        texts[i], note = reading(texts[i] or "")
        check = columns[i].strict_check
        if note is not None and check is not None:
            unread.append(Unread(check, columns[i].query, note))
    return tuple(unread)


def remaps_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "-q", "-d", ",".join(lookup().displays)]


def merge_remaps(facts: tuple[GpuHealth, ...], remaps: tuple[GpuHealth, ...]) -> tuple[GpuHealth, ...]:
    """Each GPU's facts with those read from `-q -d` (its row remapper's state); the two reads must list the same
    GPUs (by bus id)."""
    by_bus = {r.bus_id.upper(): r for r in remaps}
    if set(by_bus) != {f.bus_id.upper() for f in facts}:
        raise ProbeParseError(1, "", f"--query-gpu and -q -d ROW_REMAPPER list other GPUs ({len(facts)} and "
                                     f"{len(remaps)}; output cut?)")
    displayed = lookup().displayed
    names, checks = {f.name for f in displayed}, {f.check for f in displayed}
    return tuple(_with_displayed(f, by_bus[f.bus_id.upper()], names, checks) for f in facts)


def _with_displayed(facts: GpuHealth, section: GpuHealth, names: set[str], checks: set[str | None]) -> GpuHealth:
    merged = dict(facts.facts)
    for name, value in section.facts.items():
        if name in names:
            merged[name] = value
    unread = (*facts.unread, *(u for u in section.unread if u.check in checks)) if section.unread else facts.unread
    return GpuHealth(facts.bus_id, merged, unread)


# --- the probes -------------------------------------------------------------


def _explain(result: CommandResult) -> str:
    return classify_smi_failure(result.exit_status, result.stdout, result.stderr)


# Each probe made once for every host that asks the same nvidia-smi under the same table (a probe is a value: frozen,
# no answer), not once a host (the table's lookup, by identity: one per table, `fleet.model.gpu_facts.derived`).
_MADE = 256


def facts(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...] | None]:
    """Exit 2 is an answer only with nvidia-smi's "not a valid field" line (FIELDS_UNKNOWN); any other exit
    2 is unreadable output, not a missing field."""
    return _facts(nvidia_smi, lookup())


@functools.lru_cache(maxsize=_MADE)
def _facts(nvidia_smi: str, _: Lookup) -> Probe[tuple[GpuHealth, ...] | None]:
    return Probe(argv=tuple(facts_argv(nvidia_smi)), what="nvidia-smi --query-gpu", parse=parse_facts,
                 ok_exits=frozenset({0, 2}), reads="nvidia-smi health fields", hang=SMI_HANG, explain=_explain,
                 driver=True)


def remaps(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return _remaps(nvidia_smi, lookup())


@functools.lru_cache(maxsize=_MADE)
def _remaps(nvidia_smi: str, _: Lookup) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(argv=tuple(remaps_argv(nvidia_smi)), what=f"nvidia-smi -q -d {','.join(lookup().displays)}",
                 parse=parse_all_health,
                 reads=f"nvidia-smi -q -d {','.join(lookup().displays)} output", hang=SMI_HANG, explain=_explain,
                 driver=True)


def health(nvidia_smi: str) -> Probe[tuple[GpuHealth, ...]]:
    return Probe(argv=tuple(health_argv(nvidia_smi)), what="nvidia-smi -q", parse=parse_all_health,
                 reads="nvidia-smi -q output",
                 hang=SMI_HANG, explain=_explain, driver=True)
