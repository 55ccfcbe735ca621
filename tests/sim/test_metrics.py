"""`--metrics-file`: the run as Prometheus text, read back with prometheus_client's own parser, and written
atomically (node_exporter's textfile collector may read it at any moment)."""

from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fleet
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    HostReport,
    HostStatus,
    KilledProcess,
    Level,
    Reason,
    RunReport,
)
from fleet.report import metrics
from fleet.report.metrics import render_metrics, write_metrics
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec

MIB = 1024 * 1024
FINISHED = 1796209509.25
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def mixed_run() -> RunReport:
    """A clean host (a warn finding, one GPU settled), a failed one (reason, findings, settle times, killed
    processes, a GPU whose memory nvidia-smi did not give), an unreachable and a skipped one."""
    clean = HostReport(
        name="gpu-a01", status=HostStatus.CLEAN, duration_s=6.5,
        killed=(KilledProcess(pid=100, name="python3", user="root", signal="SIGTERM"),
                KilledProcess(pid=101, name="python3", user="root", signal="SIGKILL")),
        gpus=(GpuReport(index=0, memory_used_mib=0, settle_s=0.4),
              GpuReport(index=1, memory_used_mib=3,
                        health=(Finding("persistence", Level.WARN, "persistence mode off"),))),
    )
    failed = HostReport(
        name="gpu-a02", status=HostStatus.FAILED, duration_s=61.25,
        error="gpu 0: Xid 79 at 11:02:13: GPU has fallen off the bus",
        killed=(KilledProcess(pid=200, name="vllm", user="svc", signal="SIGKILL"),),
        gpus=(GpuReport(index=0, memory_used_mib=1523,
                        health=(Finding("xid", Level.FAIL, "Xid 79 at 11:02:13: GPU has fallen off the bus"),
                                          Finding("ecc_corrected", Level.WARN, "12 corrected"))),
              GpuReport(index=1, memory_used_mib=0, settle_s=2.5),
              GpuReport(index=2, memory_used_mib=None, settle_s=1.0,
                        health=(Finding("pcie_width", Level.FAIL, "x8 of x16"),))),
        reason=Reason.HEALTH,
        health=(HostFinding(check="xid", level=Level.FAIL, detail="Xid 74 at 11:02:13: NVLink Error", pci="0000:05:00"),
                ),
    )
    unreachable = HostReport(name="gpu-a03", status=HostStatus.UNREACHABLE, duration_s=10.0, error="connect timed out",
                             reason=Reason.CONNECT_TIMEOUT)
    skipped = HostReport(name="gpu-a04", status=HostStatus.SKIPPED, duration_s=0.0,
                         error="not started: failure budget spent",
                         reason=Reason.STOPPED)
    hosts = {h.name: h for h in (failed, skipped, clean, unreachable)}  # out of order on purpose
    return RunReport(run_id="20261202T110501Z-3f9c2a", command="reset", started_at="2026-12-02T11:05:01+00:00",
                     duration_s=78.5, hosts=hosts)


def parse(text: str) -> tuple[dict[str, tuple[str, str]], Series]:
    """The families (name -> (type, help)) and every sample (name, labels) -> value, as Prometheus reads them."""
    families: dict[str, tuple[str, str]] = {}
    series: Series = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"{family.name} appears twice"
        families[family.name] = (family.type, family.documentation)
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in series, f"duplicate series {key}"
            assert sample.timestamp is None  # node_exporter refuses timestamps in text files
            series[key] = sample.value
    return families, series


def one_hot(host: str, status: HostStatus) -> Series:
    return {("fleet_host_status", frozenset({("host", host), ("status", s.value)})): float(s is status)
            for s in HostStatus}


def gpu(name: str, host: str, index: int, value: float) -> Series:
    return {(name, frozenset({("host", host), ("gpu", str(index))})): value}


def per_host(name: str, host: str, value: float, **labels: str) -> Series:
    return {(name, frozenset({("host", host), *labels.items()})): value}


def expected_series() -> Series:
    series: Series = {
        ("fleet_run_info", frozenset({("run_id", "20261202T110501Z-3f9c2a"), ("command", "reset"),
                                      ("fleet_version", fleet.__version__)})): 1,
        ("fleet_run_timestamp_seconds", frozenset()): FINISHED,
        ("fleet_run_duration_seconds", frozenset()): 78.5,
        ("fleet_run_exit_code", frozenset()): 1,
    }
    counts = {HostStatus.CLEAN: 1, HostStatus.FAILED: 1, HostStatus.UNREACHABLE: 1, HostStatus.SKIPPED: 1}
    series |= {("fleet_run_hosts", frozenset({("status", s.value)})): counts.get(s, 0) for s in HostStatus}
    for host, status in [("gpu-a01", HostStatus.CLEAN), ("gpu-a02", HostStatus.FAILED),
                         ("gpu-a03", HostStatus.UNREACHABLE), ("gpu-a04", HostStatus.SKIPPED)]:
        series |= one_hot(host, status)
    series |= per_host("fleet_host_reason", "gpu-a02", 1, reason="health")
    series |= per_host("fleet_host_reason", "gpu-a03", 1, reason="connect_timeout")
    series |= per_host("fleet_host_reason", "gpu-a04", 1, reason="stopped")
    for host, seconds, killed in [("gpu-a01", 6.5, 2), ("gpu-a02", 61.25, 1), ("gpu-a03", 10.0, 0),
                                  ("gpu-a04", 0.0, 0)]:
        series |= per_host("fleet_host_duration_seconds", host, seconds)
        series |= per_host("fleet_host_killed_processes", host, killed)
    series |= per_host("fleet_host_health_findings", "gpu-a01", 0, level="fail")
    series |= per_host("fleet_host_health_findings", "gpu-a01", 1, level="warn")
    series |= per_host("fleet_host_health_findings", "gpu-a02", 3, level="fail")  # 2 on GPUs, 1 on the NVSwitch
    series |= per_host("fleet_host_health_findings", "gpu-a02", 1, level="warn")
    series |= per_host("fleet_host_pci_health_findings", "gpu-a02", 1, pci="0000:05:00", level="fail")
    series |= gpu("fleet_gpu_memory_used_bytes", "gpu-a01", 0, 0)
    series |= gpu("fleet_gpu_memory_used_bytes", "gpu-a01", 1, 3 * MIB)
    series |= gpu("fleet_gpu_memory_used_bytes", "gpu-a02", 0, 1523 * MIB)
    series |= gpu("fleet_gpu_memory_used_bytes", "gpu-a02", 1, 0)
    series |= gpu("fleet_gpu_settle_seconds", "gpu-a01", 0, 0.4)
    series |= gpu("fleet_gpu_settle_seconds", "gpu-a02", 1, 2.5)
    series |= gpu("fleet_gpu_settle_seconds", "gpu-a02", 2, 1.0)
    return series


FAMILIES = [
    "fleet_run_info", "fleet_run_timestamp_seconds", "fleet_run_duration_seconds", "fleet_run_exit_code",
    "fleet_run_hosts", "fleet_host_status", "fleet_host_reason", "fleet_host_duration_seconds",
    "fleet_host_killed_processes", "fleet_host_health_findings", "fleet_host_pci_health_findings",
    "fleet_gpu_memory_used_bytes",
    "fleet_gpu_settle_seconds",
]


def test_every_family_label_and_value_of_a_mixed_run() -> None:
    """Clean, failed, unreachable and skipped hosts: each series as Prometheus parses it, nothing more."""
    families, series = parse(render_metrics(mixed_run(), exit_code=1, finished_at=FINISHED))
    assert list(families) == FAMILIES
    assert all(kind == "gauge" and help_text for kind, help_text in families.values())
    assert series == expected_series()


def test_a_clean_host_has_no_reason_series_and_an_unverified_one_no_findings() -> None:
    _, series = parse(render_metrics(mixed_run(), exit_code=1, finished_at=FINISHED))
    reasons = {dict(labels)["host"] for name, labels in series if name == "fleet_host_reason"}
    assert reasons == {"gpu-a02", "gpu-a03", "gpu-a04"}
    findings = {dict(labels)["host"] for name, labels in series if name == "fleet_host_health_findings"}
    assert findings == {"gpu-a01", "gpu-a02"}  # unreachable/skipped hosts reported no GPU: no "0 findings"


def test_findings_on_no_listed_gpu_count_with_their_pci_address() -> None:
    """A host whose nvidia-smi listed no GPU (one fell off the bus) and a kernel log fleet could not read: its own
    findings are counted, the Xid's by its PCI address; the unread log has no address."""
    lost = HostReport(name="gpu-a05", status=HostStatus.FAILED, duration_s=3.0, error="x", reason=Reason.KERNEL_LOG,
                      health=(
        HostFinding(check="xid", level=Level.FAIL, detail="Xid 79 at 11:02:13: GPU has fallen off the bus",
                    pci="0000:44:00"),
        HostFinding(check="xid", level=Level.WARN,
                    detail="Xid 45 at 11:02:14: Preemptive cleanup, due to previous errors", pci="0000:44:00"),
        HostFinding(check="xid", level=Level.FAIL,
                    detail="cannot read the kernel log (journalctl exited 1: no journal files)"),
    ))
    run = RunReport(run_id="r", command="reset", started_at="2026-12-02T11:05:01+00:00", duration_s=3.0,
                    hosts={"gpu-a05": lost})
    _, series = parse(render_metrics(run, exit_code=1, finished_at=FINISHED))
    assert per_host("fleet_host_health_findings", "gpu-a05", 2, level="fail").items() <= series.items()
    assert per_host("fleet_host_health_findings", "gpu-a05", 1, level="warn").items() <= series.items()
    pci = {k: v for k, v in series.items() if k[0] == "fleet_host_pci_health_findings"}
    assert pci == {**per_host("fleet_host_pci_health_findings", "gpu-a05", 1, pci="0000:44:00", level="fail"),
                   **per_host("fleet_host_pci_health_findings", "gpu-a05", 1, pci="0000:44:00", level="warn")}
    assert per_host("fleet_host_reason", "gpu-a05", 1, reason="kernel_log").items() <= series.items()


def test_text_is_grouped_help_type_then_samples_with_valid_names() -> None:
    """The exposition format's rules beyond what the lenient parser checks: each family once, `# HELP` and
    `# TYPE` before its samples, names and label names valid, gauges only, base units, no `_total`."""
    text = render_metrics(mixed_run(), exit_code=1, finished_at=FINISHED)
    assert text.endswith("\n") and "\n\n" not in text
    seen: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in seen and lines[i + 1] == f"# TYPE {name} gauge"
            seen.append(name)
        elif not line.startswith("# TYPE "):
            match = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)', line)
            assert match and match[1] == seen[-1], line
            assert all(re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", n) for n in re.findall(r'(\w+)="', match[2] or ""))
    assert seen == FAMILIES
    assert all(n.startswith("fleet_") and not n.endswith("_total") for n in seen)
    assert not any(re.search(r"_(mib|ms|minutes|percent)$", n) for n in seen)


def test_every_status_and_reason_is_a_valid_label_value() -> None:
    hosts = {f"n{i:02d}": HostReport(name=f"n{i:02d}", status=HostStatus.FAILED, duration_s=1.0, error="x", reason=r)
             for i, r in enumerate(Reason)}
    _, series = parse(render_metrics(RunReport(run_id="r", command="reset", started_at="t", duration_s=1.0,
                                               hosts=hosts), exit_code=1, finished_at=1.0))
    assert {dict(labels)["reason"] for name, labels in series if name == "fleet_host_reason"} == {
        r.value for r in Reason}
    assert {dict(labels)["status"] for name, labels in series if name == "fleet_host_status"} == {
        s.value for s in HostStatus}


def test_label_values_are_escaped() -> None:
    """Backslash, double quote and line feed in a label value come back unchanged through the parser."""
    odd = 'a\\b "quoted"\nnext'
    assert metrics.escape_label(odd) == 'a\\\\b \\"quoted\\"\\nnext'
    _, series = parse(render_metrics(RunReport(run_id="r1", command=odd, started_at="t", duration_s=1.0), exit_code=0,
                                     finished_at=2.0))
    info = [labels for name, labels in series if name == "fleet_run_info"]
    assert [dict(labels)["command"] for labels in info] == [odd]
    assert metrics.escape_help("a\\b\nc") == "a\\\\b\\nc"


def test_a_run_without_hosts_has_only_run_families_and_an_interrupt_keeps_its_code() -> None:
    families, series = parse(render_metrics(RunReport(run_id="r1", command="check", started_at="t", duration_s=0.5),
                                            exit_code=130, finished_at=3.0))
    assert list(families) == FAMILIES[:5]  # no family without samples
    assert series[("fleet_run_exit_code", frozenset())] == 130
    assert all(series[("fleet_run_hosts", frozenset({("status", s.value)}))] == 0 for s in HostStatus)


@pytest.mark.parametrize(("value", "text"), [(3, "3"), (0.25, "0.25"), (float("inf"), "+Inf"),
                                              (float("-inf"), "-Inf"), (float("nan"), "NaN")])
def test_values_use_the_formats_spelling(value: float, text: str) -> None:
    assert metrics.format_value(value) == text


def test_fleet_itself_never_imports_prometheus_client() -> None:
    """prometheus_client is a test dependency only."""
    package = Path(fleet.__file__).parent
    users = [p for p in package.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Import | ast.ImportFrom)
             and any("prometheus" in name for name in [getattr(node, "module", None) or "",
                                                         *(a.name for a in node.names)])]
    assert users == []


# --- the atomic write ---------------------------------------------------------------------------------------


def test_write_creates_the_file_0644_whatever_the_umask_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "fleet.prom"
    old = os.umask(0o077)
    try:
        write_metrics(target, "fleet_run_exit_code 0\n")
    finally:
        os.umask(old)
    assert target.read_text() == "fleet_run_exit_code 0\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["fleet.prom"]


def test_write_replaces_the_file_a_reader_holds_the_old_one_whole(tmp_path: Path) -> None:
    """A replace, not a rewrite: whoever opened the old file reads it whole; the path reads the new one."""
    target = tmp_path / "fleet.prom"
    write_metrics(target, "old\n" * 1000)
    with target.open() as reader:
        write_metrics(target, "new\n")
        assert reader.read() == "old\n" * 1000
    assert target.read_text() == "new\n"
    assert os.listdir(tmp_path) == ["fleet.prom"]


def test_a_concurrent_reader_sees_the_old_or_the_new_text_never_a_part(tmp_path: Path) -> None:
    target = tmp_path / "fleet.prom"
    texts = ["a" * 200_000 + "\n", "b" * 150_000 + "\n"]
    write_metrics(target, texts[0])
    done = threading.Event()
    seen: set[str] = set()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(60):
            write_metrics(target, texts[i % 2])
    finally:
        done.set()
        reader.join()
    assert seen <= set(texts)


def test_the_temporary_file_is_in_the_same_folder_and_outside_the_collectors_glob(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renames: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        renames.append((str(src), str(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_metrics(tmp_path / "fleet.prom", "x 1\n")
    [(src, dst)] = renames
    assert Path(src).parent == tmp_path and dst == str(tmp_path / "fleet.prom")
    assert Path(src).name.startswith(".") and not src.endswith(".prom")


def test_a_missing_folder_is_a_clean_error_naming_the_path(tmp_path: Path) -> None:
    target = tmp_path / "nope" / "fleet.prom"
    with pytest.raises(FileNotFoundError) as caught:
        write_metrics(target, "x 1\n")
    assert caught.value.filename == str(target)
    assert str(caught.value) == f"[Errno 2] No such file or directory: '{target}'"
    assert os.listdir(tmp_path) == []


def test_a_failed_rename_keeps_the_old_file_and_removes_the_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "fleet.prom"
    write_metrics(target, "old 1\n")

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError) as caught:
        write_metrics(target, "new 1\n")
    assert caught.value.filename == str(target)
    assert target.read_text() == "old 1\n"
    assert os.listdir(tmp_path) == ["fleet.prom"]


def test_a_folder_in_the_way_is_an_error_and_leaves_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "fleet.prom").mkdir()
    with pytest.raises(IsADirectoryError):
        write_metrics(tmp_path / "fleet.prom", "x 1\n")
    assert os.listdir(tmp_path) == ["fleet.prom"]


# --- end to end: `fleet check --metrics-file` against simulated nodes -------------------------------------


@pytest.fixture
async def two_nodes(tmp_path: Path) -> AsyncIterator[SimFleet]:
    unit = UnitSpec(name="sglang.service", gpus=(0, 1), mib=30000)
    async with SimFleet(tmp_path / "sim", [NodeSpec(name=n, units=(unit,)) for n in ("gpu-b01", "gpu-b02")]) as sim:
        yield sim


async def test_a_run_writes_its_metrics_and_a_failed_write_only_warns(two_nodes: SimFleet, tmp_path: Path) -> None:
    prom = tmp_path / "textfile" / "fleet.prom"
    prom.parent.mkdir()
    base = [sys.executable, "-m", "fleet", "check", "-i", str(two_nodes.inventory_path), "-g", "sim",
            "--log-dir", str(tmp_path / "logs")]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [*base, "--metrics-file", str(prom)], capture_output=True, text=True, timeout=120, check=False))
    assert done.returncode == 1  # the units still hold memory: check is read-only
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert families["fleet_run_exit_code"].samples[0].value == 1
    reasons = {(s.labels["host"], s.labels["reason"]) for s in families["fleet_host_reason"].samples}
    assert reasons == {("gpu-b01", "memory_held"), ("gpu-b02", "memory_held")}

    missing = tmp_path / "nowhere" / "fleet.prom"
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [*base, "--metrics-file", str(missing)], capture_output=True, text=True, timeout=120, check=False))
    assert done.returncode == 1 and f"fleet: warning: metrics not written to {missing}" in done.stderr
