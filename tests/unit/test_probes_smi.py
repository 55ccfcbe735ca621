"""nvidia-smi probes: argv shapes, golden parses of real nvidia-smi output, failure classification."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.paths import FIXTURES

from fleet.node.probes import smi
from fleet.node.probes.parse import ProbeParseError, lines
from fleet.node.probes.smi import (
    SETTLE_FIELDS,
    SMI_SEPARATOR,
    VERIFY_FIELDS,
    ComputeApp,
    GpuRow,
    classify_smi_failure,
    compute_apps_argv,
    field_value,
    gpu_query_argv,
    parse_compute_apps,
    parse_gpu_query,
    parse_mib,
    split_csv,
)
from fleet.transport.base import CommandResult

FIXTURES = FIXTURES / "nvidia-smi"
MASKED_UUID = "GPU-00000000-0000-0000-0000-000000000000"
H100_IDLE = "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv"
H100_LOAD = "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_load.csv"
P100_NOUNITS = "tesla-p100-pcie-16gb_drv510.47.03_1gpu_query-gpu_csv-nounits.csv"



def parse_gpu_csv_with_header(text: str) -> list[dict[str, str | None]]:
    """Rows of `--format=csv` (header line first), keyed by field name less its ` [unit]`: how the captures with
    a header (the fixtures) are read back here; fleet itself always asks `noheader`."""
    numbered = lines(text)
    first = next(numbered, None)
    if first is None:
        return []
    header = [re.sub(r" \[[^\]]*\]$", "", name.strip()) for name in first[1].split(SMI_SEPARATOR)]
    rows = []
    for lineno, line in numbered:
        columns = split_csv(line, lineno, len(header))
        rows.append({name: field_value(raw) for name, raw in zip(header, columns, strict=True)})
    return rows

def fixture(name: str) -> str:
    """A fixture byte for byte: no newline translation."""
    return (FIXTURES / name).read_bytes().decode()


def project_noheader(text: str, fields: Sequence[str]) -> str:
    """Rebuild `--format=csv,noheader,nounits` output for `fields` from a `--format=csv` capture."""
    header, *rows = [line for line in text.split("\n") if line]
    names = [name.split(" [")[0] for name in header.split(", ")]
    lines = []
    for row in rows:
        raw = dict(zip(names, row.split(", "), strict=True))
        lines.append(", ".join(raw[f].removesuffix(" MiB") for f in fields))
    return "\n".join(lines)


# --- nvidia-smi --query-gpu --------------------------------------------------------


def test_gpu_query_argv_shapes() -> None:
    assert gpu_query_argv("nvidia-smi", SETTLE_FIELDS) == [
        "nvidia-smi",
        "--query-gpu=index,uuid,memory.used,mig.mode.current",
        "--format=csv,noheader,nounits",
    ]
    assert gpu_query_argv("/usr/bin/nvidia-smi", VERIFY_FIELDS) == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,pci.bus_id,name,memory.used,memory.total,"
        "ecc.errors.uncorrected.volatile.total,mig.mode.current",
        "--format=csv,noheader,nounits",
    ]


@pytest.mark.parametrize("fields", [(), ("index", ""), ("index,uuid",), ("memory used",)])
def test_gpu_query_argv_rejects_bad_fields(fields: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="field list"):
        gpu_query_argv("nvidia-smi", fields)


@pytest.mark.parametrize(("name", "used"), [(H100_IDLE, 0), (H100_LOAD, 19818)])
def test_verify_query_on_real_h100_rows(name: str, used: int) -> None:
    """The H100 captures, cut to VERIFY_FIELDS in noheader/nounits form, parse to one exact row."""
    text = project_noheader(fixture(name), VERIFY_FIELDS)
    assert parse_gpu_query(text, VERIFY_FIELDS) == (
        GpuRow(
            index=0,
            memory_used_mib=used,
            uuid=MASKED_UUID,
            pci_bus_id="00000000:00:09.0",
            name="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559,
            ecc_uncorrected=0,
            mig=False,  # the capture says `Disabled`
        ),
    )


def test_settle_query_on_eight_gpus_without_trailing_newline() -> None:
    used = ["1", "1", "0", "1", "9221", "1", "1", "[N/A]"]
    text = "\n".join(f"{i}, GPU-{i}, {mib}, Disabled" for i, mib in enumerate(used))
    rows = parse_gpu_query(text, SETTLE_FIELDS)
    assert [r.index for r in rows] == list(range(8))
    assert [r.memory_used_mib for r in rows] == [1, 1, 0, 1, 9221, 1, 1, None]
    assert [r.uuid for r in rows] == [f"GPU-{i}" for i in range(8)]
    assert rows[0] == GpuRow(index=0, memory_used_mib=1, uuid="GPU-0", mig=False)


@pytest.mark.parametrize(
    ("mode", "mig"), [("Enabled", True), ("Disabled", False), ("[N/A]", False), ("N/A", False), ("", False)]
)
def test_settle_query_reads_the_mig_mode(mode: str, mig: bool) -> None:
    """An idle MIG GPU holds memory with no process: settle and verify allow it more (`Allowance`)."""
    (row,) = parse_gpu_query(f"0, GPU-a, 55, {mode}", SETTLE_FIELDS)
    assert row == GpuRow(index=0, memory_used_mib=55, uuid="GPU-a", mig=mig)


def test_settle_and_verify_fields_both_ask_for_uuid_and_mig_mode() -> None:
    """The allowance needs the GPU (uuid: what kept processes hold on it) and its MIG mode, in both steps."""
    for fields in (SETTLE_FIELDS, VERIFY_FIELDS):
        assert {"index", "uuid", "memory.used", "mig.mode.current"} <= set(fields)
    assert VERIFY_FIELDS[-1] == "mig.mode.current"


@pytest.mark.parametrize(
    "value",
    ["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[GPU is lost]", "", "[Insufficient Permissions]"],
)
def test_unavailable_values_parse_as_none(value: str) -> None:
    (row,) = parse_gpu_query(
        f"0, {value}, {value}, {value}",
        ("index", "memory.used", "uuid", "ecc.errors.uncorrected.volatile.total"),
    )
    assert (row.memory_used_mib, row.uuid, row.ecc_uncorrected) == (None, None, None)


def test_memory_with_units_is_tolerated() -> None:
    text = "0, 19818 MiB, 81559 MiB\n"
    (row,) = parse_gpu_query(text, ("index", "memory.used", "memory.total"))
    assert (row.memory_used_mib, row.memory_total_mib) == (19818, 81559)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("0", 0), (" 42 ", 42), ("123 MiB", 123), ("[N/A]", None), ("1.5", None), (None, None)],
)
def test_parse_mib(raw: str | None, expected: int | None) -> None:
    assert parse_mib(raw) == expected


@pytest.mark.parametrize("text", ["", "\n", "\n\n  \n"])
def test_empty_gpu_query_is_no_rows(text: str) -> None:
    assert parse_gpu_query(text, SETTLE_FIELDS) == ()


def test_wrong_column_count_names_the_line() -> None:
    with pytest.raises(ProbeParseError, match=r"line 2: expected 4 columns, got 3: '1, GPU-b, 5'") as info:
        parse_gpu_query("0, GPU-a, 5, Disabled\n1, GPU-b, 5\n", SETTLE_FIELDS)
    assert (info.value.lineno, info.value.line) == (2, "1, GPU-b, 5")


@pytest.mark.parametrize("index", ["[N/A]", "GPU0", "", "0x1"])
def test_non_integer_index_is_an_error(index: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: GPU index is not an integer"):
        parse_gpu_query(f"{index}, GPU-a, 5, Disabled", SETTLE_FIELDS)


def test_error_text_instead_of_rows_is_an_error() -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected 4 columns, got 1"):
        parse_gpu_query(fixture("error_no-devices-found.txt"), SETTLE_FIELDS)


def test_parse_error_clips_a_long_line() -> None:
    line = "x" * 500
    with pytest.raises(ProbeParseError) as info:
        parse_gpu_query(line, SETTLE_FIELDS)
    message = str(info.value)
    assert len(message) < 200
    assert "x" * 120 + "..." in message
    assert isinstance(info.value, ValueError)


def test_query_without_index_field_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="index"):
        parse_gpu_query("5", ("memory.used",))


# --- --format=csv with header: the real captures -------------------------------------


@pytest.mark.parametrize(
    ("name", "used", "free"), [(H100_IDLE, "0 MiB", "81081 MiB"), (H100_LOAD, "19818 MiB", "61263 MiB")]
)
def test_h100_allfields_capture(name: str, used: str, free: str) -> None:
    (row,) = parse_gpu_csv_with_header(fixture(name))
    assert len(row) == 212
    assert {k: row[k] for k in ("index", "count", "name", "uuid", "pci.bus_id", "driver_version")} == {
        "index": "0",
        "count": "1",
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": MASKED_UUID,
        "pci.bus_id": "00000000:00:09.0",
        "driver_version": "590.48.01",
    }
    assert (row["memory.total"], row["memory.reserved"], row["memory.used"], row["memory.free"]) == (
        "81559 MiB",
        "479 MiB",
        used,
        free,
    )
    assert parse_mib(row["memory.used"]) == int(used.split()[0])
    assert row["ecc.errors.uncorrected.volatile.total"] == "0"
    # [N/A], the deprecation note, bare N/A and an empty value are all None.
    assert row["fan.speed"] is None
    assert row["display_mode"] is None
    assert row["fabric.health.summary"] is None
    assert row["platform.chassis_serial_number"] is None
    assert row["hostname"] is None


def test_p100_nounits_capture() -> None:
    """With nounits the header keeps ` [MiB]` but values are bare; no trailing newline."""
    assert parse_gpu_csv_with_header(fixture(P100_NOUNITS)) == [
        {
            "name": "Tesla P100-PCIE-16GB",
            "uuid": "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6",
            "fan.speed": None,
            "pstate": "P0",
            "memory.reserved": "103",
            "memory.used": "0",
            "memory.free": "16280",
            "utilization.gpu": "0",
            "utilization.memory": "0",
            "temperature.gpu": "37",
            "power.draw": "28.16",
            "clocks.current.graphics": "405",
            "clocks.current.sm": "405",
            "clocks.current.memory": "715",
            "clocks.current.video": "835",
        }
    ]


def test_csv_with_header_rejects_short_row() -> None:
    with pytest.raises(ProbeParseError, match="line 3: expected 2 columns, got 1"):
        parse_gpu_csv_with_header("index, memory.used [MiB]\n0, 1 MiB\n1\n")


def test_csv_with_header_on_nothing() -> None:
    assert parse_gpu_csv_with_header("") == []


# --- compute apps -------------------------------------------------------

APPS_FIXTURES = {
    "h100-80gb-hbm3_drv590.48.01_1gpu_query-compute-apps_csv_load-3procs.csv": (
        ComputeApp(gpu_uuid=MASKED_UUID, pid=11327, process_name="/root/tools/memhog", used_mib=2566),
        ComputeApp(gpu_uuid=MASKED_UUID, pid=11328, process_name="/root/tools/memhog", used_mib=1542),
        ComputeApp(gpu_uuid=MASKED_UUID, pid=11345, process_name="./gpu_burn", used_mib=15690),
    ),
    "h200-mig_drv590.48.01_1gpu_query-compute-apps_csv_load-3procs.csv": (
        ComputeApp(gpu_uuid=MASKED_UUID, pid=12249, process_name="/root/tools/memhog", used_mib=2194),
        ComputeApp(gpu_uuid=MASKED_UUID, pid=12250, process_name="/root/tools/memhog", used_mib=1170),
        ComputeApp(gpu_uuid=MASKED_UUID, pid=12267, process_name="./gpu_burn", used_mib=13526),
    ),
    "geforce-rtx-4080-super_drv595.71.05_1gpu_query-compute-apps_csv_desktop-only-C+G-listed.csv": (
        ComputeApp(gpu_uuid=MASKED_UUID, pid=2165, process_name="/usr/bin/kwin_wayland", used_mib=25),
    ),
    "h100-80gb-hbm3_drv590.48.01_1gpu_query-compute-apps_csv_idle-header-only.csv": (),
}


def test_compute_apps_argv() -> None:
    assert compute_apps_argv("nvidia-smi") == [
        "nvidia-smi",
        "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory",
        "--format=csv,noheader,nounits",
    ]


@pytest.mark.parametrize(("name", "expected"), APPS_FIXTURES.items(), ids=list(APPS_FIXTURES))
def test_compute_apps_real_rows(name: str, expected: tuple[ComputeApp, ...]) -> None:
    """The capture's rows, in the noheader/nounits form fleet asks for, parse exactly."""
    text = project_noheader(fixture(name), ("gpu_uuid", "pid", "process_name", "used_gpu_memory"))
    assert parse_compute_apps(text) == expected


@pytest.mark.parametrize(("name", "expected"), APPS_FIXTURES.items(), ids=list(APPS_FIXTURES))
def test_compute_apps_captures_with_header(name: str, expected: tuple[ComputeApp, ...]) -> None:
    rows = parse_gpu_csv_with_header(fixture(name))
    assert [(r["gpu_uuid"], r["pid"], r["process_name"], parse_mib(r["used_gpu_memory"])) for r in rows] == [
        (a.gpu_uuid, str(a.pid), a.process_name, a.used_mib) for a in expected
    ]


def test_desktop_capture_has_na_serial() -> None:
    name = "geforce-rtx-4080-super_drv595.71.05_1gpu_query-compute-apps_csv_desktop-only-C+G-listed.csv"
    (row,) = parse_gpu_csv_with_header(fixture(name))
    assert row["gpu_serial"] is None
    assert row["gpu_name"] == "NVIDIA GeForce RTX 4080 SUPER"


def test_compute_app_name_with_comma_and_spaces() -> None:
    text = "GPU-abc, 4242, python train.py --tag a, b, 1234\nGPU-abc, 7, /opt/my app/bin, [N/A]"
    assert parse_compute_apps(text) == (
        ComputeApp(gpu_uuid="GPU-abc", pid=4242, process_name="python train.py --tag a, b", used_mib=1234),
        ComputeApp(gpu_uuid="GPU-abc", pid=7, process_name="/opt/my app/bin", used_mib=None),
    )


def test_compute_app_na_uuid() -> None:
    assert parse_compute_apps("[N/A], 10, x, 3") == (ComputeApp(gpu_uuid=None, pid=10, process_name="x", used_mib=3),)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("GPU-abc, 10, 3", "expected 4 columns"),
        ("GPU-abc, ten, x, 3", "pid is not an integer"),
        ("junk", "expected 4"),
    ],
)
def test_compute_apps_malformed(text: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_compute_apps("GPU-abc, 1, ok, 1\n" + text)


@given(
    name=st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1).filter(
        lambda s: s.strip() == s and s
    ),
    pid=st.integers(1, 4_194_304),
    used=st.integers(0, 200_000),
)
def test_compute_apps_any_printable_name_round_trips(name: str, pid: int, used: int) -> None:
    assert parse_compute_apps(f"{MASKED_UUID}, {pid}, {name}, {used}\n") == (
        ComputeApp(gpu_uuid=MASKED_UUID, pid=pid, process_name=name, used_mib=used),
    )


# --- nvidia-smi failures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status", "expected"),
    [
        (
            "error_driver-not-loaded.txt",
            9,
            "NVIDIA driver not loaded (nvidia-smi exited 9): NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is... [23 characters cut]",
        ),
        (
            "error_no-devices-found.txt",
            6,
            "no NVIDIA devices found (nvidia-smi exited 6): No devices were found",
        ),
        (
            "error_device-handle-unknown-error_fallen-off-bus.txt",
            15,
            "GPU fallen off the bus (nvidia-smi exited 15): "
            "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error",
        ),
        (
            "error_nvml-driver-library-mismatch_rc18.txt",
            18,
            "NVML driver/library version mismatch (reboot or reload needed) (nvidia-smi exited 18): "
            "Failed to initialize NVML: Driver/library version mismatch",
        ),
        (
            "error_nvml-no-supported-gpus_rc255.txt",
            255,
            "no supported NVIDIA GPUs found (nvidia-smi exited 255): "
            "Failed to initialize NVML: No supported GPUs were found",
        ),
        (
            "error_gpu-reset-in-use.txt",
            255,
            "GPU reset refused (nvidia-smi exited 255): GPU 00000000:00:06.0: In use by another client",
        ),
    ],
)
def test_classify_real_error_messages(name: str, status: int, expected: str) -> None:
    text = fixture(name)
    assert classify_smi_failure(status, text, "") == expected
    assert classify_smi_failure(status, "", text) == expected


def test_classify_one_line_always() -> None:
    for name in sorted(FIXTURES.glob("error_*.txt")):
        assert "\n" not in classify_smi_failure(None, "", name.read_text())


@pytest.mark.parametrize(
    ("status", "stdout", "stderr", "expected"),
    [
        (3, "", "\n  weird thing  \nmore", "nvidia-smi exited 3: weird thing"),
        (3, "first out\n", "", "nvidia-smi exited 3: first out"),
        (3, "", "", "nvidia-smi exited 3: no output"),
        (None, "", "", "nvidia-smi was ended by a signal: no output"),
        (
            127,
            "",
            "bash: line 1: nvidia-smi: command not found",
            "nvidia-smi not found (exit 127): bash: line 1: nvidia-smi: command not found",
        ),
        (
            15,
            "",
            "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system",
            "GPU fallen off the bus (nvidia-smi exited 15): "
            "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system",
        ),
    ],
)
def test_classify_generic(status: int | None, stdout: str, stderr: str, expected: str) -> None:
    assert classify_smi_failure(status, stdout, stderr) == expected


# --- the probes ---------------------------------------------------------------------


def test_the_probes_run_those_argvs_read_their_output_and_explain_a_failure() -> None:
    query = smi.gpu_query("/usr/bin/nvidia-smi", SETTLE_FIELDS)
    assert query.argv == tuple(gpu_query_argv("/usr/bin/nvidia-smi", SETTLE_FIELDS))
    assert query.parse("0, GPU-a, 5, Enabled\n1, GPU-b, [N/A], [N/A]") == (
        GpuRow(index=0, memory_used_mib=5, uuid="GPU-a", mig=True), GpuRow(index=1, memory_used_mib=None, uuid="GPU-b"))
    apps = smi.compute_apps("nvidia-smi")
    assert apps.argv == tuple(compute_apps_argv("nvidia-smi"))
    assert apps.parse("GPU-a, 7, x, 3") == (ComputeApp(gpu_uuid="GPU-a", pid=7, process_name="x", used_mib=3),)
    text = fixture("error_no-devices-found.txt")
    for probe in (query, apps):
        assert probe.failure(CommandResult(argv=probe.argv, exit_status=6, stdout=text, stderr="",
                                           duration_s=0.1)) == classify_smi_failure(6, text, "")


# --- device minor numbers (nvidia-smi -q) -------------------------------------------------------------


def test_minor_numbers_of_real_q_captures() -> None:
    """Each GPU section's `Minor Number` (/dev/nvidiaN's N), keyed to its PCI bus id as --query-gpu prints it."""
    eight = smi.parse_minor_numbers((FIXTURES / "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt").read_text())
    assert eight == {0: "00000000:53:00.0", 1: "00000000:64:00.0", 2: "00000000:75:00.0", 3: "00000000:86:00.0",
                     4: "00000000:97:00.0", 5: "00000000:A8:00.0", 6: "00000000:B9:00.0", 7: "00000000:CA:00.0"}
    azure = "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt"
    assert smi.parse_minor_numbers((FIXTURES / azure).read_text()) == {0: "00000001:00:00.0", 4: "0000000B:00:00.0"}
    assert smi.parse_minor_numbers((FIXTURES / "h200_drv590.48.01_1gpu_q_idle.txt").read_text()) == {
        0: "00000000:83:00.0"}


def test_minor_numbers_that_cannot_be_trusted_are_left_out() -> None:
    """`N/A` (no device file), a section without one, a number two sections claim; lower-case bus ids upper-cased."""
    text = ("GPU 00000000:1b:00.0\n    Minor Number                          : 3\n"
            "GPU 00000000:2B:00.0\n    Minor Number                          : N/A\n"
            "GPU 00000000:3B:00.0\n    Product Name                          : X\n"
            "GPU 00000000:4B:00.0\n    Minor Number                          : 5\n"
            "GPU 00000000:5B:00.0\n    Minor Number                          : 5\n")
    assert smi.parse_minor_numbers(text) == {3: "00000000:1B:00.0"}


@pytest.mark.parametrize(("path", "minor"), [("/dev/nvidia0", 0), ("/dev/nvidia12", 12), ("/x/dev/nvidia7", 7),
                                            ("/dev/nvidiactl", None), ("/dev/nvidia-uvm", None),
                                            ("/dev/nvidia-caps/nvidia-cap1", None), ("/dev/nvidia3x", None)])
def test_device_minor(path: str, minor: int | None) -> None:
    assert smi.device_minor(path) == minor
