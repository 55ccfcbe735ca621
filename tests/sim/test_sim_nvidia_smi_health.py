"""The simulated node's GPU health, probed as fleet probes it: `nvidia-smi -q`, the kernel log through
`journalctl`, and a leaked allocation that only `nvidia-smi -r` frees.

Every command runs as the SSH server runs it: `/bin/sh -c CMD` with `env=node.env()` and
`cwd=node.root`. The output is checked against the real captures in tests/fixtures/nvidia-smi (see its
SOURCES.md); every process a test starts is ended by its pid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from support.paths import FIXTURES
from support.sim_nodes import MakeNode, sh, soon
from support.sim_nodes import make_node as make_node  # the fixture: nodes stopped after the test

from fleet.sim import NodeSpec, SimError, SimNode, UnitSpec, WorkerSpec, state

FIXTURES = FIXTURES / "nvidia-smi"
Q_H200 = FIXTURES / "h200_drv590.48.01_1gpu_q_idle.txt"
Q_8X_BUSY = FIXTURES / "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt"
RESET_IN_USE = FIXTURES / "error_gpu-reset-in-use.txt"
RESET_IN_USE_BUS = "00000000:00:06.0"  # the GPU the captured refusal names
XID_QUESTION = 'journalctl -k -b -o short-unix --no-pager -q --grep "NVRM: Xid"'
FALLEN = "pid=1234, name=python3, GPU has fallen off the bus."
# What the node puts in a GPU's -q section; every other line is the capture's.
SUBSTITUTED = {
    ("Product Name",),
    ("VBIOS Version",),  # the table of GPU facts' simulated value (the H100 capture's)
    ("Persistence Mode",),
    ("MIG Mode", "Current"),
    ("MIG Mode", "Pending"),
    ("Serial Number",),
    ("GPU UUID",),
    ("Minor Number",),
    ("Board ID",),
    ("GSP Firmware Version",),
    ("PCI", "Bus"),
    ("PCI", "Device"),
    ("PCI", "Domain"),
    ("PCI", "Bus Id"),
    ("PCI", "GPU Link Info", "Link Width", "Current"),
    ("FB Memory Usage", "Total"),
    ("FB Memory Usage", "Reserved"),
    ("FB Memory Usage", "Used"),
    ("FB Memory Usage", "Free"),
    ("ECC Errors", "Volatile", "SRAM Correctable"),
    ("ECC Errors", "Volatile", "DRAM Uncorrectable"),
    ("ECC Errors", "Aggregate", "SRAM Correctable"),
    ("ECC Errors", "Aggregate", "DRAM Uncorrectable"),
    ("Remapped Rows", "Pending"),
    ("Remapped Rows", "Remapping Failure Occurred"),
    ("Fabric", "State"),
    ("Fabric", "Status"),
    ("Fabric", "CliqueId"),
    ("Fabric", "ClusterUUID"),
    ("Processes",),
}
HEADER_SUBSTITUTED = {("Timestamp",), ("Driver Version",), ("CUDA Version",), ("Attached GPUs",)}
GPU_FIELDS = "index,pci.bus_id,uuid,serial,name,memory.total,memory.reserved,memory.used,memory.free"

KeyPath = tuple[str, ...]



def query_gpus(node: SimNode) -> list[dict[str, str]]:
    """--query-gpu rows (nounits) as {field: value}, by GPU index."""
    out = sh(node, f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits")
    assert out.returncode == 0, out
    return [dict(zip(GPU_FIELDS.split(","), row.split(", "), strict=True)) for row in out.stdout.splitlines()]


# ---------------------------------------------------------------- reading -q


def split_q(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(header lines, [(the `GPU <bus id>` line, the section's lines)]); a blank line between sections
    belongs to neither."""
    head: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in text.split("\n")[:-1]:
        if line.startswith("GPU "):
            if sections:
                assert sections[-1][1][-1] == "", "no blank line between two GPU sections"
                sections[-1][1].pop()
            sections.append((line, []))
        else:
            (sections[-1][1] if sections else head).append(line)
    return head, sections


def keyed(lines: list[str], base: int) -> list[tuple[KeyPath, str, str | None]]:
    """(key path by indentation, the key as printed with its padding, the value or None) per line."""
    rows: list[tuple[KeyPath, str, str | None]] = []
    path: list[str] = []
    for line in lines:
        level = max(0, (len(line) - len(line.lstrip(" "))) // 4 - base)
        key, sep, value = line.partition(" : ")
        del path[level:]
        path.append(key.strip())
        rows.append((tuple(path), key, value if sep else None))
    return rows


def values(lines: list[str], base: int = 1) -> dict[KeyPath, str | None]:
    return {path: value for path, _, value in keyed(lines, base)}


def q_of(node: SimNode, options: str = "") -> tuple[dict[KeyPath, str | None], list[tuple[str, list[str]]]]:
    out = sh(node, f"nvidia-smi -q {options}")
    assert (out.returncode, out.stderr) == (0, ""), out
    head, sections = split_q(out.stdout)
    return values(head, 0), sections


# ---------------------------------------------------------------- nvidia-smi -q


def test_q_has_the_real_captures_lines_and_keys_in_every_gpu_section(make_node: MakeNode) -> None:
    """A node on the capture's driver (590.48.01): the header and each of the 8 sections have the capture's lines,
    keys and padding; a line differs only where the node puts its own value."""
    node = make_node(NodeSpec(name="q-default", driver_version="590.48.01"))
    real = Q_H200.read_text()
    out = sh(node, "nvidia-smi -q")
    assert (out.returncode, out.stderr) == (0, "")
    ours = out.stdout
    assert ours.startswith("\n==============NVSMI LOG==============\n\n") and real.startswith(ours[:40])
    assert ours.endswith("\n") and not ours.endswith("\n\n")
    real_head, [(_, real_section)] = split_q(real)
    head, sections = split_q(ours)
    assert [key for _, key, _ in keyed(head, 0)] == [key for _, key, _ in keyed(real_head, 0)]
    changed = {path for (path, _, v), (_, _, w) in zip(keyed(head, 0), keyed(real_head, 0), strict=True) if v != w}
    assert changed <= HEADER_SUBSTITUTED
    assert len(sections) == 8
    for _, section in sections:
        assert [key for _, key, _ in keyed(section, 1)] == [key for _, key, _ in keyed(real_section, 1)]
        for (path, _, value), line, real_line in zip(keyed(section, 1), section, real_section, strict=True):
            assert path in SUBSTITUTED or line == real_line, (path, value)


def test_q_values_are_the_nodes_where_the_real_tool_prints_them(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="q-values", idle_mib=1))
    header, sections = q_of(node)
    real_header = values(split_q(Q_H200.read_text())[0], 0)
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", str(header[("Timestamp",)]))
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", str(real_header[("Timestamp",)]))
    assert header[("Driver Version",)] == "550.90.07"
    assert header[("Attached GPUs",)] == "8"
    for row, (gpu_line, section) in zip(query_gpus(node), sections, strict=True):
        q = values(section)
        assert gpu_line == f"GPU {row['pci.bus_id']}"
        assert q[("Product Name",)] == row["name"] == "NVIDIA H100 80GB HBM3"
        assert q[("GPU UUID",)] == row["uuid"]
        assert q[("Serial Number",)] == row["serial"]
        assert q[("Minor Number",)] == row["index"]
        assert q[("PCI", "Bus Id")] == row["pci.bus_id"]
        assert q[("PCI", "Bus")] == "0x" + row["pci.bus_id"][9:11]
        assert q[("Board ID",)] == "0x" + row["pci.bus_id"][9:11] + "00"
        for key in ("Total", "Reserved", "Used", "Free"):
            assert q[("FB Memory Usage", key)] == f"{row[f'memory.{key.lower()}']} MiB"
        assert q[("FB Memory Usage", "Used")] == "1 MiB"
        assert q[("Persistence Mode",)] == "Enabled"
        assert q[("MIG Mode", "Current")] == "Disabled"
        assert q[("PCI", "GPU Link Info", "Link Width", "Current")] == "16x"
        assert q[("ECC Errors", "Volatile", "SRAM Correctable")] == q[("ECC Errors", "Aggregate", "DRAM Uncorrectable")]
        assert q[("ECC Errors", "Volatile", "SRAM Correctable")] == "0"
        assert (q[("Remapped Rows", "Pending")], q[("Remapped Rows", "Remapping Failure Occurred")]) == ("No", "No")
        assert (q[("Fabric", "State")], q[("Fabric", "Status")]) == ("Completed", "Success")
        assert q[("Processes",)] == "None"


def test_q_shows_each_gpus_faults_and_processes(make_node: MakeNode) -> None:
    spec = NodeSpec(
        name="q-faults",
        protected_daemon=False,
        mig_gpus=(1,),
        ecc_error_gpus=(2,),
        ecc_corrected_gpus=(3,),
        remap_pending_gpus=(4,),
        remap_failed_gpus=(5,),
        narrow_pcie_gpus=(6,),
        leaked_mib=((7, 1234),),
        fabric="In Progress/N/A",
        units=(UnitSpec(name="sglang", gpus=(0,), mib=3000, process_name="sglang::scheduler"),),
        workers=(WorkerSpec(gpus=(0,), mib=700),),
    )
    node = make_node(spec)
    _, sections = q_of(node)
    q = [values(section) for _, section in sections]
    assert {i for i in range(8) if q[i][("MIG Mode", "Current")] == "Enabled"} == {1}
    assert q[1][("MIG Mode", "Pending")] == "Enabled"
    assert {i for i in range(8) if q[i][("ECC Errors", "Volatile", "DRAM Uncorrectable")] != "0"} == {2}
    assert q[2][("ECC Errors", "Aggregate", "DRAM Uncorrectable")] == "1"
    assert {i for i in range(8) if q[i][("ECC Errors", "Aggregate", "SRAM Correctable")] != "0"} == {3}
    assert q[3][("ECC Errors", "Volatile", "SRAM Correctable")] == "3"
    assert {i for i in range(8) if q[i][("Remapped Rows", "Pending")] == "Yes"} == {4}
    assert {i for i in range(8) if q[i][("Remapped Rows", "Remapping Failure Occurred")] == "Yes"} == {5}
    assert [q[i][("PCI", "GPU Link Info", "Link Width", "Current")] for i in range(8)] == ["16x"] * 6 + ["8x", "16x"]
    assert q[7][("FB Memory Usage", "Used")] == "1234 MiB"
    assert all(q[i][("Persistence Mode",)] == "Disabled" for i in range(8))
    assert all((q[i][("Fabric", "State")], q[i][("Fabric", "Status")]) == ("In Progress", "N/A") for i in range(8))
    assert all(q[i][("Processes",)] == "None" for i in range(1, 8))
    # The Processes entries: the layout (keys, padding, nesting) of a real capture's busy GPU.
    real_section = next(section for _, section in split_q(Q_8X_BUSY.read_text())[1] if "    Processes" in section)
    real_entry = real_section[real_section.index("    Processes") :]
    ours = sections[0][1]
    entries = ours[ours.index("    Processes") : ours.index("    Capabilities")]
    assert [line.partition(" : ")[0] for line in entries] == [line.partition(" : ")[0] for line in real_entry] + [
        line.partition(" : ")[0] for line in real_entry[1:]
    ]
    unit_pid, stray_pid = node.unit_main_pid("sglang"), next(iter(node.compute_pids() - {node.unit_main_pid("sglang")}))
    listed = [(line.split(": ", 1)[1]) for line in entries if line.strip().startswith(("Process ID", "Name", "Used"))]
    assert sorted([listed[0:3], listed[3:6]]) == sorted(
        [[str(unit_pid), "sglang::scheduler", "3000 MiB"], [str(stray_pid), "python3", "700 MiB"]]
    )
    # --query-gpu tells the same.
    fields = "index,remapped_rows.pending,remapped_rows.failure,pcie.link.width.current"
    fields += ",ecc.errors.corrected.volatile.total"
    rows = sh(node, f"nvidia-smi --query-gpu={fields} --format=csv,noheader").stdout.splitlines()
    assert rows[3:7] == ["3, No, No, 16, 3", "4, Yes, No, 16, 0", "5, No, Yes, 16, 0", "6, No, No, 8, 0"]


def test_q_without_nvswitch_and_for_one_gpu(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="q-pcie", fabric="N/A"))
    uuid = sh(node, "nvidia-smi --query-gpu=uuid --format=csv,noheader -i 5").stdout.strip()
    for options in ("-i 5", f"-i {uuid}", f"--id={uuid}"):
        header, [(gpu_line, section)] = q_of(node, options)
        assert header[("Attached GPUs",)] == "8"
        q = values(section)
        assert (q[("Minor Number",)], q[("GPU UUID",)]) == ("5", uuid)
        assert gpu_line == f"GPU {q[('PCI', 'Bus Id')]}"
        fabric = [q[("Fabric", key)] for key in ("State", "Status", "CliqueId", "ClusterUUID")]
        assert fabric == ["N/A"] * 4
    out = sh(node, "nvidia-smi -q -i 9")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")


# ---------------------------------------------------------------- the kernel log (journalctl)


def test_xids_of_the_spec_are_in_the_kernel_log_in_short_unix(make_node: MakeNode) -> None:
    spec = NodeSpec(name="gpu-x01", xids=((1, 79, FALLEN), (6, 48, "pid='<unknown>', name=<unknown>, DBE.")))
    node = make_node(spec)
    assert os.access(node.bin_dir / "journalctl", os.X_OK)
    out = sh(node, XID_QUESTION)
    assert (out.returncode, out.stderr) == (0, "")
    first, second = out.stdout.splitlines()
    assert out.stdout.endswith(".\n")
    # PCI:0000:3b:00 is GPU 1's bus id 00000000:3B:00.0, as the driver writes it (lowercase, no function).
    stamp = r"\d{10}\.\d{6}"
    assert re.fullmatch(rf"{stamp} gpu-x01 kernel: NVRM: Xid \(PCI:0000:3b:00\): 79, {re.escape(FALLEN)}", first)
    assert second.endswith(" gpu-x01 kernel: NVRM: Xid (PCI:0000:cb:00): 48, pid='<unknown>', name=<unknown>, DBE.")
    bus = sh(node, "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 6").stdout.strip()
    assert bus == "00000000:CB:00.0"


def test_an_xid_logged_during_a_run_follows_and_options_go_in_any_order(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="gpu-x02", xids=((0, 13, "pid=77, name=python3, Graphics Exception"),)))
    before = sh(node, XID_QUESTION).stdout.splitlines()
    node.log_xid(4, 79, FALLEN)
    for question in (
        XID_QUESTION,
        "journalctl --no-pager -q --grep 'NVRM: Xid' -o short-unix -b -k",
        "journalctl -kbq --output=short-unix --no-pager --grep='NVRM: Xid'",
        "journalctl --dmesg --boot --quiet --output short-unix --no-pager -g xid",  # all lowercase: any case
    ):
        out = sh(node, question)
        assert out.returncode == 0, (question, out)
        lines = out.stdout.splitlines()
        assert lines[:1] == before and len(lines) == 2, question
        assert lines[1].endswith(f"gpu-x02 kernel: NVRM: Xid (PCI:0000:9b:00): 79, {FALLEN}")
    stamps = [float(line.split()[0]) for line in sh(node, XID_QUESTION).stdout.splitlines()]
    assert stamps == sorted(stamps)
    with pytest.raises(SimError, match="no GPU 8"):
        node.log_xid(8, 79, FALLEN)


def test_journalctl_without_a_match_and_other_questions(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="gpu-x03"))
    out = sh(node, XID_QUESTION)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", "")  # a healthy node: nothing, exit 1
    out = sh(node, 'journalctl -k -b -o short-unix --no-pager --grep "NVRM: Xid"')
    assert (out.returncode, out.stdout) == (1, "-- No entries --\n")  # without -q
    for question, error in (
        ("journalctl -u nvidia-persistenced", "journalctl: invalid option -- 'u'"),
        ("journalctl --follow -k", "journalctl: unrecognized option '--follow'"),
        ("journalctl -k -b -o bogus --grep x", "Unknown output format 'bogus'."),
        ("journalctl -k -b -o json --no-pager -q --grep Xid", None),
        ("journalctl -b -o short-unix --no-pager -q", None),
        ("journalctl -k -b -o short-unix -q --grep", "journalctl: option '--grep' requires an argument"),
        ("journalctl -k -b -o short-unix -q --grep Xid _PID=1", None),
    ):
        out = sh(node, question)
        assert (out.returncode, out.stdout) == (1, ""), question
        assert out.stderr.endswith("\n") and out.stderr.count("\n") == 1, question
        assert error is None or out.stderr == error + "\n", question


# ---------------------------------------------------------------- a leaked allocation and nvidia-smi -r


def refusal(bus_ids: list[str]) -> str:
    """The real refusal (tests/fixtures/nvidia-smi/error_gpu-reset-in-use.txt) for these GPUs."""
    one = RESET_IN_USE.read_text()
    rows = "".join(f"  GPU {bus}: In use by another client\n" for bus in bus_ids)
    text = one.replace(f"  GPU {RESET_IN_USE_BUS}: In use by another client\n", rows)
    if len(bus_ids) > 1:
        text = text.replace("1 device is", f"{len(bus_ids)} devices are").replace("this device", "these devices")
    return text


def test_leaked_memory_is_used_with_no_process(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="leak", idle_mib=1, leaked_mib=((2, 5000), (6, 70))))
    assert node.gpu_memory() == [1, 1, 5001, 1, 1, 1, 71, 1]
    out = sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    assert out.stdout.splitlines()[2] == "2, 5001"
    assert " 5001MiB /  81559MiB " in sh(node, "nvidia-smi").stdout
    assert sh(node, "nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout == ""
    assert node.compute_pids() == set()


def test_reset_is_refused_while_a_worker_holds_the_gpu_then_clears_the_leak(make_node: MakeNode) -> None:
    spec = NodeSpec(name="reset", linger_s=0.2, leaked_mib=((2, 5000),), remap_pending_gpus=(2, 4))
    node = make_node(spec)
    bus = query_gpus(node)[2]["pci.bus_id"]
    pid = node.spawn_worker(WorkerSpec(gpus=(2,), mib=100))

    out = sh(node, "nvidia-smi -r -i 2")
    assert (out.returncode, out.stdout) == (255, refusal([bus]))
    out = sh(node, "nvidia-smi -r")  # all GPUs at once: none while any is held
    assert (out.returncode, out.stdout) == (255, refusal([bus]))
    assert node.gpu_resets() == []
    assert node.gpu_memory()[2] == 5100

    os.kill(pid, signal.SIGTERM)
    assert soon(lambda: not node.alive(pid))
    assert soon(lambda: node.gpu_memory()[2] == 5000)  # the worker's context is gone, the leak is not
    pending = "nvidia-smi --query-gpu=remapped_rows.pending --format=csv,noheader"
    assert sh(node, pending).stdout.split() == ["No", "No", "Yes", "No", "Yes", "No", "No", "No"]

    out = sh(node, "nvidia-smi -r -i 2")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"GPU {bus} was successfully reset.\nAll done.\n", "")
    assert node.gpu_memory() == [0] * 8
    assert node.gpu_resets() == [2]
    assert sh(node, pending).stdout.split() == ["No", "No", "No", "No", "Yes", "No", "No", "No"]
    assert values(q_of(node, "-i 2")[1][0][1])[("FB Memory Usage", "Used")] == "0 MiB"

    out = sh(node, "nvidia-smi -r")  # nvidia-persistenced holds nvidiactl only: no GPU is in use
    assert out.returncode == 0
    assert out.stdout == "".join(f"GPU {row['pci.bus_id']} was successfully reset.\n" for row in query_gpus(node)) + (
        "All done.\n"
    )
    assert node.gpu_resets() == [2, *range(8)]
    assert sh(node, pending).stdout.split() == ["No"] * 8
    out = sh(node, "nvidia-smi -r -i 8")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")


def test_reset_is_refused_for_any_holder_of_the_device_file(make_node: MakeNode) -> None:
    """A process with dev/nvidiaN open and no registration (found as fuser finds it), and a unit's worker."""
    unit = UnitSpec(name="vllm", gpus=(3,), mib=10, restart_sec=0.1, timeout_stop_sec=5.0)
    node = make_node(NodeSpec(name="holders", units=(unit,), leaked_mib=((5, 40),)))
    buses = [row["pci.bus_id"] for row in query_gpus(node)]
    with open(node.dev_dir / "nvidia5", "rb") as device:
        holder = subprocess.Popen(["sleep", "60"], stdin=device)
    try:
        out = sh(node, "nvidia-smi -r")
        assert (out.returncode, out.stdout) == (255, refusal([buses[3], buses[5]]))
        out = sh(node, "nvidia-smi -r -i 5")
        assert (out.returncode, out.stdout) == (255, refusal([buses[5]]))
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=5)
    out = sh(node, "nvidia-smi -r -i 5")
    assert (out.returncode, out.stdout) == (0, f"GPU {buses[5]} was successfully reset.\nAll done.\n")
    assert node.gpu_memory()[5] == 0
    assert sh(node, "nvidia-smi -r -i 3").returncode == 255
    assert node.gpu_resets() == [5]


# ---------------------------------------------------------------- device minor numbers and how long a reset takes

# A DGX-like numbering: device files in the driver's probe order, not nvidia-smi's (PCI) index order.
MINORS = (2, 3, 0, 1, 6, 7, 4, 5)


def test_device_files_are_named_by_minor_number_which_q_prints(make_node: MakeNode) -> None:
    """GPU index 0's device file is dev/nvidia2 (`Minor Number : 2` in its -q section), and a worker on GPU 0
    holds dev/nvidia2: what fleet finds open is a minor number, never an index."""
    node = make_node(NodeSpec(name="minors", minor_numbers=MINORS, workers=(WorkerSpec(gpus=(0,), mib=100),)))
    _, sections = q_of(node)
    assert [values(lines)[("Minor Number",)] for _, lines in sections] == [str(m) for m in MINORS]
    assert sorted(p.name for p in node.dev_dir.iterdir()) == sorted(
        [f"nvidia{m}" for m in MINORS] + ["nvidiactl", "nvidia-uvm"])
    pid = next(r["pid"] for r in state.registrations(node.root) if r["gpus"] == [0])
    opened = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert str(node.dev_dir.resolve() / "nvidia2") in opened
    assert str(node.dev_dir.resolve() / "nvidia0") not in opened


def test_a_reset_is_refused_for_the_gpu_whose_device_file_is_held(make_node: MakeNode) -> None:
    """dev/nvidia0 is GPU 2's (MINORS): holding it blocks a reset of GPU 2, not of GPU 0; -i takes a bus id."""
    node = make_node(NodeSpec(name="minor-reset", minor_numbers=MINORS, leaked_mib=((0, 100), (2, 100)),
                              protected_daemon=False))
    buses = [row["pci.bus_id"] for row in query_gpus(node)]
    with open(node.dev_dir / "nvidia0", "rb") as device:
        holder = subprocess.Popen(["sleep", "60"], stdin=device)
    try:
        out = sh(node, "nvidia-smi -r -i 2")
        assert (out.returncode, out.stdout) == (255, refusal([buses[2]]))
        out = sh(node, f"nvidia-smi -r -i {buses[0]}")
        assert (out.returncode, out.stdout) == (0, f"GPU {buses[0]} was successfully reset.\nAll done.\n")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=5)
    assert node.gpu_resets() == [0]


def test_minor_numbers_must_be_one_per_gpu() -> None:
    with pytest.raises(SimError, match="minor_numbers"):
        NodeSpec(name="bad", gpus=2, minor_numbers=(0, 0))


def test_a_reset_takes_gpu_reset_s(make_node: MakeNode) -> None:
    node = make_node(NodeSpec(name="slow-reset", gpu_reset_s=0.6, leaked_mib=((1, 100),), protected_daemon=False))
    started = time.monotonic()
    out = sh(node, "nvidia-smi -r -i 1")
    assert out.returncode == 0, out
    assert time.monotonic() - started >= 0.6
    assert node.gpu_resets() == [1]
