"""Probes: argv shapes, golden parses of real nvidia-smi output, and round trips on this machine."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.models import BUILTIN_PROTECTED
from fleet.probes import (
    SETTLE_FIELDS,
    VERIFY_FIELDS,
    ComputeApp,
    GpuRow,
    Holder,
    ProbeParseError,
    PsRow,
    UnitState,
    alive_argv,
    classify_smi_failure,
    compute_apps_argv,
    exe_argv,
    gpu_query_argv,
    holders_scan_argv,
    is_protected,
    kill_argv,
    parse_compute_apps,
    parse_exe,
    parse_gpu_csv_with_header,
    parse_gpu_query,
    parse_holders,
    parse_mib,
    parse_pids,
    parse_ps,
    parse_unit_state,
    ps_argv,
    unit_kill_argv,
    unit_state_argv,
    unit_stop_argv,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "nvidia-smi"
MASKED_UUID = "GPU-00000000-0000-0000-0000-000000000000"
H100_IDLE = "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_idle.csv"
H100_LOAD = "h100-80gb-hbm3_drv590.48.01_1gpu_query-gpu-allfields_csv_load.csv"
P100_NOUNITS = "tesla-p100-pcie-16gb_drv510.47.03_1gpu_query-gpu_csv-nounits.csv"


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
        "--query-gpu=index,memory.used",
        "--format=csv,noheader,nounits",
    ]
    assert gpu_query_argv("/usr/bin/nvidia-smi", VERIFY_FIELDS) == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,pci.bus_id,name,memory.used,memory.total,"
        "ecc.errors.uncorrected.volatile.total",
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
        ),
    )


def test_settle_query_on_eight_gpus_without_trailing_newline() -> None:
    text = "0, 1\n1, 1\n2, 0\n3, 1\n4, 9221\n5, 1\n6, 1\n7, [N/A]"
    rows = parse_gpu_query(text, SETTLE_FIELDS)
    assert [r.index for r in rows] == list(range(8))
    assert [r.memory_used_mib for r in rows] == [1, 1, 0, 1, 9221, 1, 1, None]
    assert rows[0] == GpuRow(index=0, memory_used_mib=1)


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
    with pytest.raises(ProbeParseError, match=r"line 2: expected 2 columns, got 3: '1, 5, 7'") as info:
        parse_gpu_query("0, 5\n1, 5, 7\n", SETTLE_FIELDS)
    assert (info.value.lineno, info.value.line) == (2, "1, 5, 7")


@pytest.mark.parametrize("index", ["[N/A]", "GPU0", "", "0x1"])
def test_non_integer_index_is_an_error(index: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: GPU index is not an integer"):
        parse_gpu_query(f"{index}, 5", SETTLE_FIELDS)


def test_error_text_instead_of_rows_is_an_error() -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected 2 columns, got 1"):
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
        ComputeApp(MASKED_UUID, 11327, "/root/tools/memhog", 2566),
        ComputeApp(MASKED_UUID, 11328, "/root/tools/memhog", 1542),
        ComputeApp(MASKED_UUID, 11345, "./gpu_burn", 15690),
    ),
    "h200-mig_drv590.48.01_1gpu_query-compute-apps_csv_load-3procs.csv": (
        ComputeApp(MASKED_UUID, 12249, "/root/tools/memhog", 2194),
        ComputeApp(MASKED_UUID, 12250, "/root/tools/memhog", 1170),
        ComputeApp(MASKED_UUID, 12267, "./gpu_burn", 13526),
    ),
    "geforce-rtx-4080-super_drv595.71.05_1gpu_query-compute-apps_csv_desktop-only-C+G-listed.csv": (
        ComputeApp(MASKED_UUID, 2165, "/usr/bin/kwin_wayland", 25),
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
        ComputeApp("GPU-abc", 4242, "python train.py --tag a, b", 1234),
        ComputeApp("GPU-abc", 7, "/opt/my app/bin", None),
    )


def test_compute_app_na_uuid() -> None:
    assert parse_compute_apps("[N/A], 10, x, 3") == (ComputeApp(None, 10, "x", 3),)


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
        ComputeApp(MASKED_UUID, pid, name, used),
    )


# --- nvidia-smi failures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status", "expected"),
    [
        (
            "error_driver-not-loaded.txt",
            9,
            "NVIDIA driver not loaded (nvidia-smi exited 9): NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is...",
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


# --- GPU holders -------------------------------------------------------


def test_holders_scan_argv_shape() -> None:
    assert holders_scan_argv(["/dev/nvidia*", "/dev/dri/*"]) == [
        "find", "/proc", "-mindepth", "1", "-maxdepth", "3",
        "(", "-regex", "/proc/[0-9]+/fd/[0-9]+",
        "(", "-lname", "/dev/nvidia*", "-o", "-lname", "/dev/dri/*", ")",
        "-printf", "%u\\t%p\\t%l\\n", ")",
        "-o", "(", "-not", "-regex", "/proc/[0-9]+\\(/fd\\)?", "-prune", ")",
    ]  # fmt: skip


def test_holders_scan_argv_one_glob() -> None:
    argv = holders_scan_argv(["/dev/nvidia*"])
    assert argv[9:13] == ["(", "-lname", "/dev/nvidia*", ")"]


@pytest.mark.parametrize("devices", [[], [""]])
def test_holders_scan_argv_needs_globs(devices: list[str]) -> None:
    with pytest.raises(ValueError, match="device globs"):
        holders_scan_argv(devices)


def test_parse_holders_groups_sorts_and_dedups() -> None:
    text = (
        "alice\t/proc/4242/fd/7\t/dev/nvidia0\n"
        "bob\t/proc/17/fd/3\t/dev/nvidiactl\n"
        "alice\t/proc/4242/fd/9\t/dev/nvidiactl\n"
        "alice\t/proc/4242/fd/8\t/dev/nvidia0\n"
        "\n"
        "1000\t/proc/99/fd/4\t/dev/nvidia-uvm"
    )
    assert parse_holders(text) == (
        Holder(17, "bob", ("/dev/nvidiactl",)),
        Holder(99, "1000", ("/dev/nvidia-uvm",)),
        Holder(4242, "alice", ("/dev/nvidia0", "/dev/nvidiactl")),
    )


def test_parse_holders_empty() -> None:
    assert parse_holders("") == ()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("alice /proc/1/fd/2 /dev/nvidia0", "expected user<TAB>"),
        ("\t/proc/4242/fd/7\t/dev/nvidia0", "expected user<TAB>"),
        ("alice\t/proc/4242/fd/7\t", "expected user<TAB>"),
        ("alice\t/proc/self/fd/7\t/dev/nvidia0", "not a /proc/PID/fd/N path"),
        ("alice\t/proc/4242/fd\t/dev/nvidia0", "not a /proc/PID/fd/N path"),
    ],
)
def test_parse_holders_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 2: {reason}"):
        parse_holders("alice\t/proc/1/fd/1\t/dev/nvidia0\n" + line)


def test_holders_scan_finds_this_process(tmp_path: Path) -> None:
    """The real find argv, run here, finds the fd this test holds open."""
    device = tmp_path / "nvidia0"
    with device.open("w"):
        done = subprocess.run(
            holders_scan_argv([str(tmp_path / "nvidia*")]), capture_output=True, text=True, check=False
        )
    assert done.returncode in (0, 1), done.stderr
    holders = {h.pid: h for h in parse_holders(done.stdout)}
    assert holders == {os.getpid(): Holder(os.getpid(), pwd.getpwuid(os.geteuid()).pw_name, (str(device),))}


# --- process details -------------------------------------------------------


def test_process_argv_shapes() -> None:
    assert ps_argv([1, 2, 3]) == ["ps", "-ww", "-o", "pid=,ppid=,user:32=,comm=", "-p", "1,2,3"]
    assert exe_argv([1, 20]) == [
        "find",
        "/proc/1/exe",
        "/proc/20/exe",
        "-maxdepth",
        "0",
        "-printf",
        "%h\\t%l\\n",
    ]
    assert alive_argv([1, 2]) == ["ps", "-o", "pid=,stat=", "-p", "1,2"]


@pytest.mark.parametrize("make", [ps_argv, exe_argv, alive_argv])
@pytest.mark.parametrize("pids", [[], [0], [5, -1]])
def test_process_argv_rejects_bad_pids(make: Callable[[Sequence[int]], list[str]], pids: list[int]) -> None:
    with pytest.raises(ValueError, match="pid"):
        make(pids)


def test_parse_ps_right_aligned_and_spaces_in_comm() -> None:
    text = (
        "    1     0 root                             systemd\n"
        "  812     1 nvidia-persistenced              nvidia-persiste\n"
        " 4242  4200 alice                            Web Content\n"
        "77777  4242 bob                              python3"
    )
    assert parse_ps(text) == {
        1: PsRow(1, 0, "root", "systemd"),
        812: PsRow(812, 1, "nvidia-persistenced", "nvidia-persiste"),
        4242: PsRow(4242, 4200, "alice", "Web Content"),
        77777: PsRow(77777, 4242, "bob", "python3"),
    }


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("  12    1 root", "expected pid, ppid, user and comm"),
        ("  x    1 root sh", "pid is not"),
        ("1 y root sh", "ppid"),
    ],
)
def test_parse_ps_malformed(line: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=f"line 1: {reason}"):
        parse_ps(line)


def test_parse_exe() -> None:
    text = (
        "/proc/1\t\n"  # permission denied: find prints an empty target
        "/proc/4242\t/usr/bin/python3.11\n"
        "/proc/77\t/opt/my app/train (deleted)\n"
    )
    assert parse_exe(text) == {4242: "/usr/bin/python3.11", 77: "/opt/my app/train"}


@pytest.mark.parametrize(
    "line", ["/proc/4242 /usr/bin/python3", "/proc/self\t/usr/bin/x", "4242\t/usr/bin/x"]
)
def test_parse_exe_malformed(line: str) -> None:
    with pytest.raises(ProbeParseError, match="line 1: expected /proc/PID<TAB>target"):
        parse_exe(line)


def test_parse_pids() -> None:
    assert parse_pids("    1\n 4242\n\n77777") == frozenset({1, 4242, 77777})
    assert parse_pids("") == frozenset()


def test_parse_pids_counts_a_zombie_as_dead() -> None:
    assert parse_pids("    1 Ss\n 4242 Z\n 4243 Sl+\n") == frozenset({1, 4243})


def test_parse_pids_malformed() -> None:
    with pytest.raises(ProbeParseError, match="line 2: pid is not an integer: 'zombie'"):
        parse_pids("1\nzombie\n")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_ps_round_trip_on_this_process() -> None:
    pid = os.getpid()
    done = _run(ps_argv([pid]))
    assert done.returncode == 0, done.stderr
    comm = Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    assert parse_ps(done.stdout) == {pid: PsRow(pid, os.getppid(), pwd.getpwuid(os.geteuid()).pw_name, comm)}


def test_exe_round_trip_on_this_process() -> None:
    pid, dead = os.getpid(), _dead_pid()
    done = _run(exe_argv([pid, dead]))
    assert done.returncode == 1  # the dead pid's link is missing
    assert parse_exe(done.stdout) == {pid: os.readlink(f"/proc/{pid}/exe")}


def test_alive_round_trip() -> None:
    pid, dead = os.getpid(), _dead_pid()
    assert parse_pids(_run(alive_argv([pid, dead])).stdout) == frozenset({pid})
    done = _run(alive_argv([dead]))
    assert (done.returncode, parse_pids(done.stdout)) == (1, frozenset())


# --- signals -------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "name"), [("TERM", "TERM"), ("SIGTERM", "TERM"), ("KILL", "KILL"), ("sigkill", "KILL")]
)
def test_kill_argv(signal: str, name: str) -> None:
    assert kill_argv(signal, [4242, 77]) == ["kill", "-s", name, "--", "4242", "77"]


@pytest.mark.parametrize("signal", ["HUP", "SIGINT", "9", "", "SIGSIGTERM"])
def test_kill_argv_rejects_other_signals(signal: str) -> None:
    with pytest.raises(ValueError, match="only TERM and KILL"):
        kill_argv(signal, [4242])


@pytest.mark.parametrize("pids", [[], [1], [0], [-1], [4242, 1], [-4242]])
def test_kill_argv_never_init_or_groups(pids: list[int]) -> None:
    with pytest.raises(ValueError, match="must be > 1"):
        kill_argv("TERM", pids)


# --- systemd -------------------------------------------------------


def test_unit_argv_shapes() -> None:
    unit = "-weird@1.service"
    assert unit_state_argv(unit) == [
        "systemctl",
        "show",
        "--property=ActiveState,SubState,MainPID",
        "--",
        unit,
    ]
    assert unit_stop_argv(unit) == ["systemctl", "stop", "--no-block", "--", unit]
    assert unit_kill_argv(unit) == ["systemctl", "kill", "--kill-whom=all", "--signal=SIGKILL", "--", unit]


@pytest.mark.parametrize("make", [unit_state_argv, unit_stop_argv, unit_kill_argv])
def test_unit_argv_rejects_empty(make: Callable[[str], list[str]]) -> None:
    with pytest.raises(ValueError, match="empty unit"):
        make(" ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ActiveState=active\nSubState=running\nMainPID=1234\n", UnitState("active", "running", 1234)),
        ("MainPID=0\nActiveState=inactive\nSubState=dead", UnitState("inactive", "dead", None)),
        ("SubState=failed\nActiveState=failed\nMainPID=0\n", UnitState("failed", "failed", None)),
        (
            "ActiveState=deactivating\nSubState=stop-sigterm\nMainPID=77\nId=x.service\n",
            UnitState("deactivating", "stop-sigterm", 77),
        ),
        ("ActiveState=activating\nSubState=\n", UnitState("activating", None, None)),
    ],
)
def test_parse_unit_state(text: str, expected: UnitState) -> None:
    assert parse_unit_state(text) == expected


@pytest.mark.parametrize(
    ("state", "down"), [("inactive", True), ("failed", True), ("active", False), ("deactivating", False)]
)
def test_unit_is_down(state: str, down: bool) -> None:
    assert UnitState(state, None, None).is_down is down


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("SubState=dead\nMainPID=0\n", "line 2: no ActiveState"),
        ("", "line 1: no ActiveState"),
        ("ActiveState=\nMainPID=0", "line 2: no ActiveState"),
        ("ActiveState=active\nMainPID=abc\n", "line 2: MainPID is not an integer"),
        ("ActiveState=active\nFailed to get properties\n", "line 2: expected Key=value"),
    ],
)
def test_parse_unit_state_malformed(text: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=reason):
        parse_unit_state(text)


# --- protection policy -------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_PROTECTED)
def test_builtin_names_match_full_and_kernel_cut_comm(name: str) -> None:
    assert is_protected(name, None, BUILTIN_PROTECTED) == name
    matched = is_protected(name[:15], None, BUILTIN_PROTECTED)
    assert matched is not None
    assert matched[:15] == name[:15]


@pytest.mark.parametrize(
    ("comm", "exe", "names", "expected"),
    [
        ("nvidia-persiste", None, ("nvidia-persistenced",), "nvidia-persistenced"),
        ("nvidia-persiste", None, ("nvidia",), None),
        ("nvidia", None, ("nvidia-persistenced",), None),
        ("nvidia-persist", None, ("nvidia-persistenced",), None),
        ("nvidia-persistenced", None, ("nvidia-persiste",), None),
        ("nv-hostengine", None, ("nv-hostengine",), "nv-hostengine"),
        ("python3", "/usr/bin/python3.11", BUILTIN_PROTECTED, None),
        ("python3", None, BUILTIN_PROTECTED, None),
        ("sshd-session", "/usr/lib/openssh/sshd-session", ("sshd",), None),
        ("exporter", "/usr/bin/dcgm-exporter", BUILTIN_PROTECTED, "dcgm-exporter"),
        ("exporter", "/usr/bin/dcgm-exporter (deleted)", ("dcgm-exporter",), "dcgm-exporter"),
        ("trainer", "", ("trainer-x",), None),
        ("my-daemon", None, ("other", "my-daemon"), "my-daemon"),
    ],
)
def test_is_protected(comm: str, exe: str | None, names: tuple[str, ...], expected: str | None) -> None:
    assert is_protected(comm, exe, names) == expected
