"""The readers of verify's nvidia-smi reads, built for speed (precomputed columns, a tree of -q key paths, a picker
of a GPU row's fields), against the straightforward reading each replaces, on the real captures
(tests/fixtures/nvidia-smi) and on values made to hit every branch."""

from __future__ import annotations

import csv
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import scripted_node
from support.paths import FIXTURES

from fleet.model import gpu_facts, gpu_profile
from fleet.model.gpu_facts import MAYBE_NOTE, NOT_APPLICABLE, NVML_ERRORS, SETTINGS, GpuHealth, GpuSettings, reading
from fleet.model.gpu_profile import GpuProfile
from fleet.node.probes import health, q_sections, smi
from fleet.node.probes.asked import Key, lookup
from fleet.node.probes.parse import ProbeParseError, lines
from fleet.reset import health_gate
from fleet.reset.health_gate import HealthPolicy, KernelReads, judge

SMI = FIXTURES / "nvidia-smi"
ALL_FIELDS = ("h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv",
              "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_load.csv")
Q_CAPTURES = ("h200_drv590.48.01_1gpu_q_idle.txt", "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt",
              "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt",
              "8x-a100-sxm4-80gb_drv510.73.08_q_excerpt-remap-pending-after-xid63.txt",
              "8x-gpu_drv535.86.10_q-d-page-retirement_retired-pages-only.txt")
NOTES = sorted({*NOT_APPLICABLE, *NVML_ERRORS} | {f"[{n}]" for n in (*NOT_APPLICABLE, *NVML_ERRORS)} | {"[Odd note]"})


def fixture(name: str) -> str:
    return (SMI / name).read_bytes().decode()


def captured_values(name: str) -> dict[str, str]:
    """An all-fields `--format=csv` capture's one row as `nounits` prints it, by field."""
    header, row = (next(csv.reader([line], skipinitialspace=True)) for line in fixture(name).splitlines()[:2])
    return scripted_node.nounits(header, row)


# --- --query-gpu's health fields: a cell at a time, as the table's rows read it ---------------------------------


def facts_one_by_one(text: str) -> tuple[GpuHealth, ...]:
    """`parse_facts` the straightforward way: every cell through `reading`, then its field's reader."""
    asked = lookup().asked
    found = []
    for lineno, line in lines(text):
        bus, *cells = line.split(",")
        facts: dict[str, object] = {}
        unread = []
        for fact, cell in zip(asked, cells, strict=True):
            text_, note = reading(cell)
            if text_ is not None:
                try:
                    facts[fact.name] = fact.read.parse(text_)
                except ValueError as exc:
                    raise ProbeParseError(lineno, line, str(exc)) from None
            elif note is not None and fact.strict and fact.check is not None:
                unread.append(gpu_facts.Unread(fact.check, fact.query, note))
        found.append(GpuHealth(bus.strip(), facts, tuple(unread)))
    return tuple(found)


def health_row(values: dict[str, str]) -> str:
    return ", ".join(values[f] for f in health.health_fields())


@pytest.mark.parametrize("name", ALL_FIELDS)
def test_the_columns_read_the_captures_as_each_row_does(name: str) -> None:
    row = health_row(captured_values(name))
    text = "\n".join(row.replace("00:00.0", f"{bus:02X}:00.0", 1) for bus in range(8)) + "\n"
    assert health.parse_facts(text) == facts_one_by_one(text)


@given(st.lists(st.sampled_from([*NOTES, " ", "x", "[x", "x]", "0", "-1", "Yes", "Enabled", "16", "7.5", " 0 "]),
                min_size=len(health.health_fields()) - 1, max_size=len(health.health_fields()) - 1))
def test_the_columns_read_any_cell_as_each_row_does(cells: list[str]) -> None:
    text = ", ".join(["00000000:19:00.0", *cells]) + "\n"
    try:
        expected: Any = facts_one_by_one(text)
    except ProbeParseError as exc:
        expected = str(exc)
    try:
        got: Any = health.parse_facts(text)
    except ProbeParseError as exc:
        got = str(exc)
    assert got == expected


@pytest.mark.parametrize("text", ["0", "16", "-3", " 7 ", "1_0", "\u0663", "1.5", "700.00", "inf", "nan", "x", "",
                                  "Enabled", "Disabled", "Yes", "No", "Active", "Not Active", "enabled"])
@pytest.mark.parametrize("fact", gpu_facts.FIELDS, ids=lambda fact: fact.name)
def test_a_rows_builtin_reader_reads_as_its_own(fact: gpu_facts.Field[Any], text: str) -> None:
    """`Reader.fast` (the --query-gpu row's fast path) gives what `parse` gives, and refuses what it refuses."""
    outcomes = []
    for read, refusals in ((fact.read.parse, ValueError), (fact.read.fast, (ValueError, KeyError))):
        try:
            outcomes.append(repr(read(text)))
        except refusals:
            outcomes.append("refused")
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("value", [*NOTES, "", "0", "[0", "0]", "Enabled", " [N/A] "])
def test_what_may_be_a_note_covers_every_text_reading_takes_for_one(value: str) -> None:
    plain = value.strip()[:1] != "[" and value.strip() not in MAYBE_NOTE
    assert not plain or reading(value) == (value.strip(), None)


# --- -q: the tree of key paths ------------------------------------------------------------------------------------


def key_paths(text: str) -> list[tuple[str, ...]]:
    """Every key path inside a GPU section of a -q capture, lower case, as the indentation nests them."""
    found: list[tuple[str, ...]] = []
    stack: list[str] = []
    for _, line in lines(text):
        depth = (len(line) - len(line.lstrip(" "))) // health.INDENT
        if depth == 0:
            stack = []
            continue
        key, colon, _ = line.strip().partition(":")
        del stack[depth - 1:]
        stack.append((key.rstrip() if colon and key else line.strip()).lower())
        found.append(tuple(stack))
    return found


def tree_key(path: tuple[str, ...]) -> Key | None:
    key: Key | None = lookup().top
    for name in path:
        key = None if key is None else key.under.get(name)
    return key


@pytest.mark.parametrize("name", Q_CAPTURES)
def test_the_tree_asks_of_each_key_what_the_table_does(name: str) -> None:
    ask = lookup()
    read = ask.at.keys() | ask.noted.keys()
    sections = {path[:end] for path in read for end in range(1, len(path))}
    for path in key_paths(fixture(name)):
        within = all(path[:end] in sections for end in range(1, len(path)))  # every section above it is asked into
        key = tree_key(path)
        assert (key is not None and key.read) == (within and path in read), path
        assert (key is not None and bool(key.under)) == (within and path in sections), path


def facts_path_by_path(text: str) -> list[dict[str, object]]:
    """`parse_health`'s facts the straightforward way: every line's key path in full (no tree, no line passed over),
    then each fact from the values at its paths (the first, or a total's sum; none where a total has a note)."""
    gpus: list[dict[tuple[str, ...], str]] = []
    header: dict[tuple[str, ...], str] = {}
    stack: list[str] = []
    for _, line in lines(text):
        depth = (len(line) - len(line.lstrip(" "))) // health.INDENT
        key, colon, value = line.strip().partition(":")
        if depth == 0:
            if line.startswith("GPU "):
                gpus.append(dict(header))
            elif colon:
                header[(key.strip().lower(),)] = value
            stack = []
            continue
        del stack[depth - 1:]
        stack.append((key.rstrip() if colon and key else line.strip()).lower())
        if colon and key:
            gpus[-1][tuple(stack)] = value
    return [{fact.name: said for fact in gpu_facts.current()
             if (said := fact_of(fact, [reading(values[p]) for p in lookup().paths[fact.name] if p in values]))
             is not None} for values in gpus]


def fact_of(fact: gpu_facts.Field[Any], printed: list[tuple[str | None, str | None]]) -> object:
    values = [fact.read.parse(text.removesuffix(fact.unit) if fact.unit else text) for text, _ in printed if text]
    if not values or (fact.total and any(note is not None for _, note in printed)):
        return None
    return sum(values) if fact.total else values[0]


@pytest.mark.parametrize("name", [*(n for n in Q_CAPTURES if "excerpt" not in n),
                                  *(f"h200_drv580.159.04_1gpu_{what}.txt"
                                    for what in ("q-d-row-remapper_idle", "q_idle", "q_load-1proc"))])
def test_the_walk_along_the_tree_reads_the_captures_as_every_path_read_in_full(name: str) -> None:
    text = fixture(name)
    assert [dict(gpu.facts) for gpu in health.parse_health(text)] == facts_path_by_path(text)


# --- a GPU row's fields, and a GPU's settings ----------------------------------------------------------------------


def rows_by_name(text: str, fields: tuple[str, ...]) -> tuple[smi.GpuRow, ...]:
    """`parse_gpu_query` the straightforward way: each row's values by field name."""
    rows = []
    for lineno, line in lines(text):
        values = {name: smi.field_value(raw) for name, raw in zip(fields, smi.split_csv(line, lineno, len(fields)),
                                                                   strict=True)}
        rows.append(smi.GpuRow(
            index=int(values["index"] or ""), memory_used_mib=smi.parse_mib(values.get("memory.used")),
            uuid=values.get("uuid"), pci_bus_id=values.get("pci.bus_id"), name=values.get("name"),
            memory_total_mib=smi.parse_mib(values.get("memory.total")),
            ecc_uncorrected=smi._optional_int(values.get("ecc.errors.uncorrected.volatile.total")),
            mig=values.get("mig.mode.current") == "Enabled"))
    return tuple(rows)


@pytest.mark.parametrize("fields", [smi.SETTLE_FIELDS, smi.VERIFY_FIELDS, ("index",), ("memory.used", "index"),
                                    ("index", "uuid", "uuid")])
@pytest.mark.parametrize("name", ALL_FIELDS)
def test_the_picker_reads_the_captures_as_their_names_do(name: str, fields: tuple[str, ...]) -> None:
    values = captured_values(name)
    text = "\n".join(", ".join(str(i) if f == "index" else values[f] for f in fields) for i in range(8))
    read, by_name = smi.parse_gpu_query(text, fields), rows_by_name(text, fields)
    assert read == by_name
    assert [list(vars(row).items()) for row in read] == [list(vars(row).items()) for row in by_name]  # and in order


CELLS = [*sorted(smi.NULL_VALUES), "[x", "x]", " [N/A] ", "a[b]", "0", "7", "12 MiB", "Enabled", "Disabled", "GPU-1",
         "00000000:19:00.0", "-1", " 5 "]


@given(st.lists(st.lists(st.sampled_from(CELLS), min_size=len(smi.VERIFY_FIELDS), max_size=len(smi.VERIFY_FIELDS)),
                min_size=1, max_size=3))
def test_a_row_without_a_marker_reads_as_each_value_through_field_value(rows: list[list[str]]) -> None:
    text = "\n".join(", ".join(cells) for cells in rows) + "\n"
    outcomes: list[object] = []
    for read in (smi.parse_gpu_query, rows_by_name):
        try:
            outcomes.append(read(text, smi.VERIFY_FIELDS))
        except ValueError:  # an index that is no integer (the straightforward reading's int(), not parse_int)
            outcomes.append("unreadable")
    assert outcomes[0] == outcomes[1]


@given(st.one_of(st.integers(-10**6, 10**6).map(str), st.text("0123456789-MiB \u0661\u00b2", max_size=8)))
def test_plain_mib_read_as_the_pattern_reads_them(raw: str) -> None:
    match = smi._MIB.fullmatch(raw.strip())
    assert smi.parse_mib(raw) == (int(match.group(1)) if match else None)


@pytest.mark.parametrize("name", [n for n in Q_CAPTURES if "excerpt" not in n])  # an excerpt does not parse whole
def test_settings_of_a_gpu_are_its_rows_facts(name: str) -> None:
    for gpu in health.parse_health(fixture(name)):
        said, built = GpuSettings.of(gpu), GpuSettings(**{fact.name: gpu[fact] for fact in SETTINGS})
        assert said == built
        assert list(vars(said).items()) == list(vars(built).items())  # the same attributes, in the same order


@pytest.mark.parametrize("name", [n for n in Q_CAPTURES if "excerpt" not in n])
def test_judging_with_the_settings_verify_read_is_judging_without(name: str) -> None:
    gpus = health.parse_health(fixture(name))
    policy = HealthPolicy(profile=GpuProfile(persistence=False, compute_mode="Prohibited", power_limit_w=300.0))
    said = [GpuSettings.of(g) for g in gpus]
    assert judge(gpus, KernelReads(), policy, said=said) == judge(gpus, KernelReads(), policy)
    assert any(f.check == "gpu_settings" for found in judge(gpus, KernelReads(), policy).gpus.values() for f in found)


@given(st.text(st.sampled_from(["a", " ", ":", "\t", "\r", "\u00a0", "\x1c", "G"]), max_size=8))  # a line: no "\n"
def test_a_header_key_value_is_what_its_pattern_reads_whole(line: str) -> None:
    assert q_sections._key_value(line) == (re.fullmatch(r"(\S[^:]*?)\s*:(.*)", line) is not None)


@pytest.mark.parametrize("name", [n for n in Q_CAPTURES if "excerpt" not in n])
def test_a_gpus_settings_like_the_one_befores_are_judged_as_its_own(name: str) -> None:
    profile = GpuProfile(persistence=True, compute_mode="Prohibited", power_limit_w=300.0)
    said = [GpuSettings.of(g) for g in health.parse_health(fixture(name))]
    other = [GpuSettings(**{**vars(s), "power_limit_w": 250.0}) for s in said]
    for gpus in (said, [*said, *other, *said], [s for pair in zip(said, other, strict=True) for s in pair]):
        assert health_gate._profiled(profile, gpus) == [gpu_profile.findings(profile, s) for s in gpus]


@pytest.mark.parametrize("name", [n for n in Q_CAPTURES if "excerpt" not in n])
def test_each_gpus_settings_like_the_one_befores_are_its_own(name: str) -> None:
    gpus = health.parse_health(fixture(name))
    other = [g.said(power_limit_w=250.0) for g in gpus]
    for each in (gpus, (*gpus, *other, *gpus), tuple(g for pair in zip(gpus, other, strict=True) for g in pair)):
        said = GpuSettings.of_each(each)
        assert said == [GpuSettings.of(g) for g in each]
        assert [list(vars(s).items()) for s in said] == [list(vars(GpuSettings.of(g)).items()) for g in each]


# --- a GPU like the one before it: its row or section read once -------------------------------------------------


def each_alone(parts: list[str], read: Any) -> list[GpuHealth]:
    """Each GPU read on its own (no GPU before it): the straightforward reading."""
    return [gpu for part in parts for gpu in read(part)]


@pytest.mark.parametrize("order", ["aaaa", "abab", "aabba", "baaab"])
def test_rows_like_the_one_befores_read_as_each_row_alone(order: str) -> None:
    idle, load = (health_row(captured_values(name)) for name in ALL_FIELDS)
    noted = idle.replace(", 0, 0,", ", [Unknown Error], 0,", 1)  # an unread ECC count: a note, read once too
    rows = [f"00000000:{i:02X}:00.0," + (idle if kind == "a" else noted if i % 2 else load).partition(",")[2]
            for i, kind in enumerate(order)]
    assert list(health.parse_facts("\n".join(rows) + "\n") or ()) == each_alone(rows, health.parse_facts)
    bad = "\n".join([*rows, rows[-1].replace("00000000:", "0000:0000:", 1)])  # alike but for a bus id that is none
    with pytest.raises(ProbeParseError, match=f"line {len(rows) + 1}: no PCI bus id"):
        health.parse_facts(bad)


@pytest.mark.parametrize("order", ["aaaa", "abab", "aabba"])
def test_gpu_sections_like_the_one_befores_read_as_each_alone(order: str) -> None:
    text = fixture("h200_drv580.159.04_1gpu_q-d-row-remapper_idle.txt").replace("Attached GPUs", "Attached", 1)
    head, _, section = text.partition("GPU 00000000:00:06.0\n")
    other = section.replace("Pending                                        : No",
                            "Pending                                        : [Unknown Error]", 1)
    sections = [f"GPU 00000000:{i:02X}:00.0\n" + (section if kind == "a" else other) for i, kind in enumerate(order)]
    assert list(health.parse_health(head + "".join(sections))) == each_alone([head + s for s in sections],
                                                                             health.parse_health)
    twice = head + "".join(sections) + sections[-1]  # the same GPU again: refused, not read as the one before
    with pytest.raises(ProbeParseError, match="GPU listed twice"):
        health.parse_health(twice)
