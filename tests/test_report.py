"""The JSON report and the human summary: shape, counts, folding, exit codes."""

from __future__ import annotations

import json

import fleet
from fleet.report import render as reporting
from fleet.report.models import HostReport, HostStatus, RunReport, StepName, StepResult, StepStatus


def _run(statuses: dict[str, tuple[HostStatus, str | None]], command: str = "reset") -> RunReport:
    hosts = {
        n: HostReport(n, s, 1.0, e, tuple(StepResult(x, StepStatus.OK) for x in StepName))
        for n, (s, e) in statuses.items()
    }
    return RunReport("r1", command, "2026-12-02T10:00:00+00:00", 2.0, hosts)


def test_document_matches_the_contract_shape() -> None:
    run = _run({"gpu-b01": (HostStatus.CLEAN, None), "gpu-b02": (HostStatus.FAILED, "gpu 0 holds 1523 MiB")})
    doc = json.loads(json.dumps(reporting.to_document(run)))
    assert set(doc) == {"run_id", "fleet_version", "command", "started_at", "duration_s", "summary", "hosts"}
    assert doc["fleet_version"] == fleet.__version__
    assert doc["summary"] == {"total": 2, "clean": 1, "failed": 1, "unreachable": 0, "skipped": 0}
    host = doc["hosts"]["gpu-b01"]
    assert set(host) == {"status", "duration_s", "error", "steps", "killed", "gpus"}
    assert [s["name"] for s in host["steps"]] == ["drain", "kill", "settle", "verify"]
    assert set(host["steps"][0]) == {"name", "status", "duration_s", "detail"}


def test_summary_counts_equal_host_statuses() -> None:
    run = _run({f"n{i}": (HostStatus.CLEAN if i % 2 else HostStatus.UNREACHABLE, None) for i in range(7)})
    counts = reporting.summary(run)
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")


def test_human_lines_fold_hosts_with_the_same_outcome() -> None:
    statuses = {f"gpu-b{i:02d}": (HostStatus.CLEAN, None) for i in range(1, 16)}
    statuses["gpu-b16"] = (HostStatus.FAILED, "gpu 0 holds 1523 MiB (pid 39865 python3)")
    lines = reporting.human_lines(_run(statuses))
    assert lines[0] == "gpu-b[01-15] clean"
    assert lines[1] == "gpu-b16 failed: gpu 0 holds 1523 MiB (pid 39865 python3)"
    assert lines[2].startswith("reset of 16 hosts in 2.0 s: 15 clean, 1 failed")


def test_exit_codes() -> None:
    assert reporting.exit_code(_run({"a": (HostStatus.CLEAN, None)})) == 0
    assert reporting.exit_code(_run({"a": (HostStatus.PLANNED, None)})) == 0
    assert reporting.exit_code(_run({"a": (HostStatus.CLEAN, None), "b": (HostStatus.SKIPPED, None)})) == 1
    assert reporting.exit_code(_run({"a": (HostStatus.UNREACHABLE, "x")})) == 1
    assert reporting.exit_code(_run({"a": (HostStatus.CLEAN, None)}), interrupted=True) == 130


def test_render_is_the_document_with_a_host_a_line() -> None:
    run = _run({"gpu-b01": (HostStatus.CLEAN, None), "gpu-b02": (HostStatus.FAILED, 'say "1523 MiB"\nthen')})
    document = reporting.to_document(run)
    text = reporting.render(document)
    assert json.loads(text) == json.loads(json.dumps(document))
    assert text.endswith("}\n")
    host_lines = [line for line in text.splitlines() if line.lstrip().startswith('"gpu-b')]
    assert len(host_lines) == 2
    assert json.loads("{" + host_lines[0].rstrip(",") + "}")["gpu-b01"]["status"] == "clean"


def test_render_keeps_empty_and_nested_values() -> None:
    document = {"hosts": {}, "summary": {"total": 0}, "note": None, "list": [1, {"a": [2]}]}
    assert json.loads(reporting.render(document)) == document
