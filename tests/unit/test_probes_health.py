"""Health probes: golden parses of real `nvidia-smi -q` captures and real kernel-log Xid lines, malformed input.

The kernel-log fixtures are `dmesg --ctime`, syslog and bare-message captures; the probe reads
`journalctl -o short-unix`. `short_unix` rebuilds that form by putting a short-unix stamp in place of the
capture's own prefix; every message is the captured one, byte for byte.
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import scripted_node
from support.paths import FIXTURES

from fleet.model import gpu_facts
from fleet.model.errors import StepFailed
from fleet.node.probes import health as probes
from fleet.node.probes.health import (
    GpuHealth,
    Unread,
    health,
    health_argv,
    health_fields,
)
from fleet.node.probes.kernel_log import Xid, parse_xids, pci_of_bus_id
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.smi import SMI_HANG, classify_smi_failure
from fleet.transport.base import CommandResult

SMI = FIXTURES / "nvidia-smi"
KLOG = FIXTURES / "kernel-log"
H200 = "h200_drv590.48.01_1gpu_q_idle.txt"
H100X8 = "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt"
A100_460 = "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt"
A100_510 = "8x-a100-sxm4-80gb_drv510.73.08_q_excerpt-remap-pending-after-xid63.txt"
PAGES_535 = "8x-gpu_drv535.86.10_q-d-page-retirement_retired-pages-only.txt"
XID_119 = "h100-xe9680_dmesg-ctime_xid-119-gsp-rpc-timeout.log"
XID_README = "gpud-readme_dmesg-ctime_xid-13-31-109.log"
NODE_STAMP = 1700000000.25  # the stamp put on captures that carry none of their own


def fixture(path: Path) -> str:
    """A fixture byte for byte: no newline translation."""
    return path.read_bytes().decode()


# The settings facts are read in the same reads; their golden tests are in test_gpu_settings.py.
SETTINGS_ONLY = {f.name for f in gpu_facts.SETTINGS} - {gpu_facts.PERSISTENCE.name}


def health_only(gpu: GpuHealth) -> GpuHealth:
    return GpuHealth(gpu.bus_id, {k: v for k, v in gpu.facts.items() if k not in SETTINGS_ONLY}, gpu.unread)


def parse_health(text: str) -> tuple[GpuHealth, ...]:
    """`probes.parse_health`, its health facts only."""
    return tuple(health_only(g) for g in probes.parse_health(text))


def parse_facts(text: str) -> tuple[GpuHealth, ...] | None:
    """`probes.parse_facts`, its health facts only."""
    found = probes.parse_facts(text)
    return None if found is None else tuple(health_only(g) for g in found)


def clean(bus_id: str, **facts: object) -> GpuHealth:
    """A healthy Hopper GPU as the captures print one, with `facts` changed."""
    healthy = GpuHealth(bus_id).said(persistence=True, ecc_corrected=0, ecc_uncorrected=0, remap_pending=False,
                                     remap_failed=False, fabric_state="Completed", fabric_status="Success",
                                     pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16)
    return healthy.said(**facts)


def unknown(bus_id: str, **facts: object) -> GpuHealth:
    """A GPU section that says nothing about health, with `facts` set."""
    return GpuHealth(bus_id).said(**facts)


def without_elisions(text: str) -> str:
    """The author of the 510 excerpt cut it with `[...]` lines; they are not nvidia-smi's."""
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() != "[...]")


def short_unix(line: str, stamp: float | None = None) -> str:
    """A captured kernel-log line in `journalctl -o short-unix` form: `<epoch> node kernel: <message>`."""
    ctime = re.match(r"\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\] (.*)", line)
    if ctime is not None:  # dmesg --ctime: the stamp is the node's local time; read as UTC here
        stamp = calendar.timegm(time.strptime(ctime.group(1), "%a %b %d %H:%M:%S %Y"))
        line = ctime.group(2)
    message = line.removeprefix("kernel: ")
    return f"{stamp if stamp is not None else NODE_STAMP:.6f} node kernel: {message}"


def journal(name: str) -> str:
    return "".join(short_unix(line) + "\n" for line in fixture(KLOG / name).splitlines())


def epoch(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


# --- argv and probes ----------------------------------------------------------


def test_one_query_answers_for_every_gpu() -> None:
    assert health_argv("/usr/bin/nvidia-smi") == ["/usr/bin/nvidia-smi", "-q"]
    probe = health("nvidia-smi")
    assert probe.argv == ("nvidia-smi", "-q")
    assert (probe.needs_root, probe.ok_exits, probe.hang) == (False, frozenset({0}), SMI_HANG)


@pytest.mark.parametrize(
    "name",
    ["error_driver-not-loaded.txt", "error_nvml-driver-library-mismatch_rc18.txt", "error_no-devices-found.txt"],
)
def test_failures_are_explained_as_the_other_nvidia_smi_queries(name: str) -> None:
    text = fixture(SMI / name)
    result = CommandResult(argv=("nvidia-smi", "-q"), exit_status=9, stdout="", stderr=text, duration_s=0.2)
    assert health("nvidia-smi").failure(result) == classify_smi_failure(9, "", text)


def test_unreadable_output_fails_the_step_naming_the_line() -> None:
    probe = health("nvidia-smi")
    with pytest.raises(StepFailed, match=r"unreadable nvidia-smi -q output: line 2: unexpected indentation"):
        probe.read(CommandResult(argv=probe.argv, exit_status=0,
                                 stdout="GPU 00000000:83:00.0\n   Persistence Mode : Enabled\n", stderr="",
                                 duration_s=0.1))


# --- nvidia-smi -q: golden parses of real captures ---------------------------------


def test_h200_driver_590() -> None:
    """New driver: SRAM Parity/SEC-DED and DRAM keys, Remapped Rows, Fabric Completed/Success, N/A pages."""
    assert parse_health(fixture(SMI / H200)) == (clean("00000000:83:00.0"),)


def test_eight_h100_driver_535() -> None:
    buses = ["53", "64", "75", "86", "97", "A8", "B9", "CA"]
    assert parse_health(fixture(SMI / H100X8)) == tuple(clean(f"00000000:{b}:00.0") for b in buses)


def test_a100_driver_460_has_no_fabric_section_and_persistence_off() -> None:
    """Older driver: `Ecc Mode`, `SRAM Uncorrectable` not yet split, no Fabric section, PCIe gen 4."""
    a100 = {"persistence": False, "fabric_state": None, "fabric_status": None, "pcie_gen": 4, "pcie_gen_max": 4}
    assert parse_health(fixture(SMI / A100_460)) == (
        clean("00000001:00:00.0", **a100),
        clean("0000000B:00:00.0", **a100),
    )


def test_a100_driver_510_row_remap_pending_with_177_corrected() -> None:
    """The state after an Xid 63: a row marked for remapping, applied at the next reset."""
    assert parse_health(without_elisions(fixture(SMI / A100_510))) == (
        unknown("00000000:10:1C.0", ecc_corrected=177, ecc_uncorrected=0, remap_pending=True, remap_failed=False),
    )


def test_page_retirement_display_only_has_pages() -> None:
    """`-q -d PAGE_RETIREMENT` on driver 535: every other section missing, each fact then None."""
    assert parse_health(fixture(SMI / PAGES_535)) == tuple(
        unknown(f"0000000{i}:00:00.0", retired_pending=False) for i in range(1, 9)
    )


def test_no_output_is_no_gpu() -> None:
    assert parse_health("") == ()
    assert parse_health("\n==============NVSMI LOG==============\n\nTimestamp : Mon Oct 25 22:06:14 2021\n") == ()


# --- derived from a real capture: one line changed, the rest as printed -------------------------


def h200_with(old: str, new: str) -> tuple[GpuHealth, ...]:
    text = fixture(SMI / H200)
    assert text.count(old) == 1, old
    return parse_health(text.replace(old, new))


def line_of(key: str, value: str, indent: int) -> str:
    """A -q line as the H200 capture pads it: the colon in column 56."""
    return " " * indent + key.ljust(55 - indent) + ": " + value + "\n"


@pytest.mark.parametrize("value", ["N/A", "[N/A]", "[Not Supported]", "Unknown Error"])
def test_values_nvidia_smi_leaves_out_read_as_none(value: str) -> None:
    old = line_of("Persistence Mode", "Enabled", 4)
    assert h200_with(old, line_of("Persistence Mode", value, 4)) == (clean("00000000:83:00.0", persistence=None),)


# Each health fact's line in the real H200 capture, its check, and the key path the finding names.
H200_FACTS = [
    (line_of("DRAM Uncorrectable", "0", 12) + " " * 8 + "Aggregate\n", "ecc_uncorrected",
     "ECC Errors / Volatile / DRAM Uncorrectable"),
    (line_of("SRAM Correctable", "0", 12) + line_of("SRAM Uncorrectable Parity", "0", 12)
     + line_of("SRAM Uncorrectable SEC-DED", "0", 12) + line_of("DRAM Correctable", "0", 12)
     + line_of("DRAM Uncorrectable", "0", 12) + " " * 8 + "Aggregate\n", "ecc_corrected",
     "ECC Errors / Volatile / SRAM Correctable"),
    (line_of("Pending Page Blacklist", "N/A", 8), "retired_pending", "Retired Pages / Pending Page Blacklist"),
    (line_of("Pending", "No", 8) + line_of("Remapping Failure Occurred", "No", 8), "remap_pending",
     "Remapped Rows / Pending"),
    (line_of("Remapping Failure Occurred", "No", 8), "remap_failed", "Remapped Rows / Remapping Failure Occurred"),
    (line_of("State", "Completed", 8), "fabric", "Fabric / State"),
    (line_of("Status", "Success", 8), "fabric", "Fabric / Status"),
]
# NVML's error strings as nvidia-smi prints them instead of a value (bare in -q; bracketed in --query-gpu), and the
# notes that mean "does not apply to this GPU".
NOT_OBSERVED = ["Unknown Error", "GPU is lost", "Insufficient Permissions", "GPU requires reset", "Timeout",
                "[Unknown Error]", "[GPU is lost]", "[Requested functionality has been deprecated]"]
NOT_APPLICABLE = ["N/A", "[N/A]", "Not Supported", "[Not Supported]"]


def with_value(line: str, old_line: str, value: str) -> str:
    """`line` (one or several -q lines) with the value of its line `old_line` changed to `value`."""
    key = old_line.partition(":")[0]
    return line.replace(old_line, key + ": " + value + "\n")


@pytest.mark.parametrize("note", NOT_OBSERVED)
@pytest.mark.parametrize(("lines", "check", "field"), H200_FACTS, ids=[f[2] for f in H200_FACTS])
def test_an_error_note_in_a_health_field_is_a_fact_not_observed(lines: str, check: str, field: str,
                                                                  note: str) -> None:
    first = next(line + "\n" for line in lines.splitlines() if field.endswith(line.partition(":")[0].strip()))
    (gpu,) = h200_with(lines, with_value(lines, first, note))
    assert gpu.unread == (Unread(check, field, note),)
    said = {f.name for f in gpu_facts.FIELDS if f.check == check and field.endswith(f.q[0][-1])}
    assert said and not said & set(gpu.facts)  # never a value: neither healthy nor sick, but unread


@pytest.mark.parametrize("note", NOT_APPLICABLE)
@pytest.mark.parametrize(("lines", "check", "field"), H200_FACTS, ids=[f[2] for f in H200_FACTS])
def test_not_applicable_is_absent_not_unread(lines: str, check: str, field: str, note: str) -> None:
    first = next(line + "\n" for line in lines.splitlines() if field.endswith(line.partition(":")[0].strip()))
    (gpu,) = h200_with(lines, with_value(lines, first, note))
    assert gpu.unread == ()


def test_a_section_printed_as_one_error_line_leaves_every_fact_under_it_unread() -> None:
    text = fixture(SMI / H200)
    start, end = text.index("    Remapped Rows\n"), text.index("    Temperature\n")
    (gpu,) = parse_health(text[:start] + line_of("Remapped Rows", "Unknown Error", 4) + text[end:])
    assert gpu.unread == (Unread("remap_failed", "Remapped Rows", "Unknown Error"),
                          Unread("remap_pending", "Remapped Rows", "Unknown Error"))


def h100_health_row() -> tuple[str, list[str]]:
    """The health fields' values in the real 590.48.01 H100 all-fields capture (idle), as one --query-gpu row."""
    header, values = fixture(SMI / "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv").splitlines()[:2]
    by_name = scripted_node.nounits(header.split(", "), values.split(", "))
    return ", ".join(by_name[f] for f in health_fields()), [by_name[f] for f in health_fields()]


@pytest.mark.parametrize("note", [n for n in NOT_OBSERVED if n.startswith("[")])
@pytest.mark.parametrize(("field", "check"), [
    ("ecc.errors.corrected.volatile.total", "ecc_corrected"), ("ecc.errors.uncorrected.volatile.total",
                                                               "ecc_uncorrected"),
    ("retired_pages.pending", "retired_pending"), ("fabric.state", "fabric"), ("fabric.status", "fabric")])
def test_an_error_note_in_a_query_gpu_health_field_is_not_observed(field: str, check: str, note: str) -> None:
    row, values = h100_health_row()
    (healthy,) = parse_facts(row + "\n") or ()
    assert healthy.unread == ()  # the capture as printed: `[N/A]` retired pages on an H100 is not applicable
    values[health_fields().index(field)] = note
    (gpu,) = parse_facts(", ".join(values) + "\n") or ()
    assert gpu.unread == (Unread(check, field, note),)


def test_remapped_rows_on_one_line_as_gpus_without_a_row_remapper_print_it() -> None:
    text = fixture(SMI / H200)
    start = text.index("    Remapped Rows\n")
    end = text.index("    Temperature\n")
    collapsed = text[:start] + line_of("Remapped Rows", "N/A", 4) + text[end:]
    assert parse_health(collapsed) == (clean("00000000:83:00.0", remap_pending=None, remap_failed=None),)


def test_fabric_not_done() -> None:
    changed = h200_with(line_of("State", "Completed", 8), line_of("State", "In Progress", 8))
    assert changed == (clean("00000000:83:00.0", fabric_state="In Progress"),)
    failed = h200_with(line_of("Status", "Success", 8), line_of("Status", "Failure", 8))
    assert failed == (clean("00000000:83:00.0", fabric_status="Failure"),)


def test_narrow_pcie_link() -> None:
    current = " " * 16 + "Current                                : 16x\n"
    assert h200_with(current, current.replace("16x", "8x")) == (clean("00000000:83:00.0", pcie_width=8),)


def test_ecc_counts_are_summed_over_sram_and_dram() -> None:
    volatile = (line_of("SRAM Uncorrectable Parity", "0", 12) + line_of("SRAM Uncorrectable SEC-DED", "0", 12)
                + line_of("DRAM Correctable", "0", 12) + line_of("DRAM Uncorrectable", "0", 12)
                + " " * 8 + "Aggregate\n")
    counted = (line_of("SRAM Uncorrectable Parity", "1", 12) + line_of("SRAM Uncorrectable SEC-DED", "2", 12)
               + line_of("DRAM Correctable", "5", 12) + line_of("DRAM Uncorrectable", "4", 12)
               + " " * 8 + "Aggregate\n")
    assert h200_with(volatile, counted) == (clean("00000000:83:00.0", ecc_corrected=5, ecc_uncorrected=7),)


def test_pending_page_retirement_and_remap_failure() -> None:
    pages = h200_with(line_of("Pending Page Blacklist", "N/A", 8), line_of("Pending Page Blacklist", "Yes", 8))
    assert pages == (clean("00000000:83:00.0", retired_pending=True),)
    remap = h200_with(line_of("Remapping Failure Occurred", "No", 8), line_of("Remapping Failure Occurred", "Yes", 8))
    assert remap == (clean("00000000:83:00.0", remap_failed=True),)


# Volta and older GPUs print ECC counts by kind of memory, as `Single Bit` / `Double Bit` with a Total
# (the header lines end in spaces). No capture of that layout with a known licence is in the fixtures:
# this block is the layout, written here with the counts changed.
VOLTA_ECC = """\
    ECC Errors
        Volatile
            Single Bit            
                Device Memory             : 3
                Register File             : 0
                L1 Cache                  : 0
                L2 Cache                  : 0
                Texture Memory            : N/A
                Texture Shared            : N/A
                CBU                       : N/A
                Total                     : 3
            Double Bit            
                Device Memory             : 1
                Register File             : 0
                L1 Cache                  : 0
                L2 Cache                  : 0
                Texture Memory            : N/A
                Texture Shared            : N/A
                CBU                       : 0
                Total                     : 1
        Aggregate
            Single Bit            
                Total                     : 9
            Double Bit            
                Total                     : 2
    Retired Pages
        Single Bit ECC                    : 1
        Double Bit ECC                    : 0
        Pending Page Blacklist            : Yes
    Remapped Rows                         : N/A
"""  # noqa: W291


def test_single_and_double_bit_totals_of_older_gpus() -> None:
    text = fixture(SMI / H200)
    start, end = text.index("    ECC Errors\n"), text.index("    Temperature\n")
    assert parse_health(text[:start] + VOLTA_ECC + text[end:]) == (
        clean("00000000:83:00.0", ecc_corrected=3, ecc_uncorrected=1, retired_pending=True,
              remap_pending=None, remap_failed=None),
    )


# --- nvidia-smi -q: malformed ---------------------------------------------------


LINK = "GPU 00000000:83:00.0\n    PCI\n        GPU Link Info\n"


@pytest.mark.parametrize(
    ("text", "lineno", "reason"),
    [
        ("    Persistence Mode : Enabled\n", 1, "indented line before the first GPU section"),
        ("GPU 00000000:83:00.0\n      Persistence Mode : Enabled\n", 2, "unexpected indentation"),
        ("GPU 00000000:83:00.0\n    PCI\n            Bus : 0x83\n", 3, "unexpected indentation"),
        ("GPU 00000000:83:00.0\n    Persistence Mode : Maybe\n", 2, "expected 'Enabled' or 'Disabled'"),
        ("GPU 0\n    Persistence Mode : Enabled\n", 1, "without a PCI bus id"),
        ("GPU 00000000:83:00.0\nGPU 00000000:83:00.0\n", 2, "GPU listed twice"),
        ("GPU 00000000:83:00.0\n    Persistence Mode : Enabled\nsomething else\n", 3, "expected a 'GPU <bus id>'"),
        ("hello world\n", 1, "expected a 'GPU <bus id>'"),
        ("GPU 00000000:83:00.0\n    Remapped Rows\n        Pending : Perhaps\n", 3, "expected 'Yes' or 'No'"),
        ("GPU 00000000:83:00.0\n    ECC Errors\n        Volatile\n            DRAM Correctable : many\n", 4,
         "ECC error count is not an integer"),
        (LINK + "            Link Width\n                Current : 16\n", 5, "PCIe link width is not like '16x'"),
        (LINK + "            PCIe Generation\n                Max : five\n", 5, "PCIe generation is not an integer"),
    ],
)
def test_malformed_output_names_the_line(text: str, lineno: int, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=re.escape(reason)) as caught:
        parse_health(text)
    assert caught.value.lineno == lineno


def test_a_gpu_nvidia_smi_cannot_read_is_an_error_not_a_missing_section() -> None:
    """The real message for a GPU fallen off the bus, where the GPU's section would be."""
    lost = fixture(SMI / "error_device-handle-unknown-error_fallen-off-bus.txt")
    for text in (lost + fixture(SMI / H200), fixture(SMI / H200) + lost):
        with pytest.raises(ProbeParseError, match="nvidia-smi names a GPU it cannot read"):
            parse_health(text)


# --- the kernel log's Xids ----------------------------------------------------


def test_xid_119_on_an_h100_node() -> None:
    """dmesg --ctime of a Dell XE9680: five Xid 119 among GSP RPC dumps, a call trace and other NVRM lines."""
    found = parse_xids(journal(XID_119))
    assert [(x.at, x.pci, x.code) for x in found] == [
        (epoch("2025-02-23 16:24:18"), "0000:9b:00", 119),
        (epoch("2025-02-23 16:24:24"), "0000:9b:00", 119),
        (epoch("2025-02-23 16:24:30"), "0000:9b:00", 119),
        (epoch("2025-02-23 16:27:12"), "0000:9b:00", 119),
        (epoch("2025-02-23 16:30:13"), "0000:9b:00", 119),
    ]
    assert found[0].detail == ("pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from "
                               "GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
    assert found[-1].detail.startswith("pid=1240590, name=gpud, Timeout after 6s")


def test_xids_13_109_31_with_unknown_pids() -> None:
    found = parse_xids(journal(XID_README))
    assert [x.code for x in found] == [13, 13, 13, 109, 31, 109]
    assert {x.pci for x in found} == {"0000:cb:00"}
    assert found[0] == Xid(
        at=epoch("2024-08-30 11:43:09"), pci="0000:cb:00", code=13,
        detail="pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): "
               "Illegal Instruction Parameter",
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a100-sxm4-80gb_message_xid-63-row-remapper.log",
         (Xid(at=NODE_STAMP, pci="0000:10:1c", code=63,
              detail="pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."),)),
        ("message_xid-79-fallen-off-the-bus.log",
         (Xid(at=NODE_STAMP, pci="0000:44:00", code=79, detail="GPU has fallen off the bus"),)),
        ("syslog-kernel_xid-45-caused-by-previous-xid.log",
         (Xid(at=NODE_STAMP, pci="0000:dc:00", code=45,
              detail="pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"),
          Xid(at=NODE_STAMP, pci="0000:ed:00", code=45,
              detail="pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145"))),
        ("kmsg_xid-149-netir-domain-0019.log",
         (Xid(at=NODE_STAMP, pci="0019:01:00", code=149,
              detail="NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 "
                                             "0x00000000 0x00000000 0x00000000)"),)),
    ],
)
def test_quoted_xid_lines(name: str, expected: tuple[Xid, ...]) -> None:
    assert parse_xids(journal(name)) == expected


def test_older_drivers_omit_pci_and_some_xids_have_no_text() -> None:
    text = ("1700000000.5 node kernel: NVRM: Xid (0000:03:00): 14, Channel 00000001\n"
            "1700000001 node kernel: NVRM: Xid (PCI:0000:01:00.0): 79\n")
    assert parse_xids(text) == (
        Xid(at=1700000000.5, pci="0000:03:00", code=14, detail="Channel 00000001"),
        Xid(at=1700000001.0, pci="0000:01:00", code=79, detail=""),
    )


def test_lines_without_an_xid_are_ignored() -> None:
    assert parse_xids("") == ()
    assert parse_xids("1700000000.1 node kernel: NVRM: GPU at PCI:0000:9b:00: GPU-509665ad\n") == ()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("node kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=1\n", "no short-unix timestamp"),
        ("1700000000.1 node kernel: NVRM: Xid (PCI:0000:9b:00) 119\n", "Xid line without"),
        ("1700000000.1 node kernel: NVRM: Xid error: xyz, invalid data\n", "Xid line without"),
    ],
)
def test_malformed_xid_line_names_the_line(text: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=reason) as caught:
        parse_xids("1700000000.0 node kernel: unrelated\n" + text)
    assert caught.value.lineno == 2


# --- joining -q's bus id with an Xid's PCI address ------------------------------------------


@pytest.mark.parametrize(
    ("bus_id", "pci"),
    [("00000000:1B:00.0", "0000:1b:00"), ("0000000B:00:00.0", "000b:00:00"), ("00000000:10:1C.0", "0000:10:1c"),
     ("0000:9b:00.0", "0000:9b:00")],
)
def test_pci_of_bus_id(bus_id: str, pci: str) -> None:
    assert pci_of_bus_id(bus_id) == pci


@pytest.mark.parametrize("bad", ["", "GPU 00000000:1B:00.0", "00000000:1B:00", "0:1B:00.0"])
def test_pci_of_bus_id_rejects_what_is_not_one(bad: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        pci_of_bus_id(bad)


def test_the_real_xid_63_joins_the_real_gpu_it_names() -> None:
    (gpu,) = parse_health(without_elisions(fixture(SMI / A100_510)))
    (xid,) = parse_xids(journal("a100-sxm4-80gb_message_xid-63-row-remapper.log"))
    assert pci_of_bus_id(gpu.bus_id) == xid.pci


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F))
def test_any_bus_id_joins_the_xid_line_naming_it(domain: int, bus: int, device: int) -> None:
    bus_id = f"{domain:08X}:{bus:02X}:{device:02X}.0"
    (xid,) = parse_xids(f"1700000000.0 node kernel: NVRM: Xid (PCI:{domain:04x}:{bus:02x}:{device:02x}): 79, x\n")
    assert pci_of_bus_id(bus_id) == xid.pci


def test_the_probe_refuses_output_cut_short() -> None:
    """A -q whose banner says more GPUs than the sections that follow (a bound, a tool that died) is no answer."""
    text = (SMI / H200).read_text()
    whole = health("nvidia-smi").parse(text)
    assert len(whole) == 1
    cut = text.replace("Attached GPUs                                          : 1",
                       "Attached GPUs                                          : 2")
    with pytest.raises(ProbeParseError, match="2 GPUs attached, 1 GPU sections follow"):
        health("nvidia-smi").parse(cut)
