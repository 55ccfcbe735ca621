"""The JSON report and the human summary: shape, counts, folding, exit codes."""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, fields, replace

from hypothesis import given
from hypothesis import strategies as st
from support import report_strategies
from support.report_page import demo_document

import fleet
from fleet.model.codec import host_from_document, host_to_document, run_from_document
from fleet.model.fabric import FabricManager
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    HostPlan,
    HostReport,
    HostStatus,
    KilledProcess,
    Level,
    Reason,
    RunReport,
    StepName,
    StepResult,
    StepStatus,
    flat,
)
from fleet.report import render as reporting


def _run(statuses: dict[str, tuple[HostStatus, str | None]], command: str = "reset") -> RunReport:
    hosts = {
        n: HostReport(name=n, status=s, duration_s=1.0, error=e,
                      steps=tuple(StepResult(name=x, status=StepStatus.OK) for x in StepName))
        for n, (s, e) in statuses.items()
    }
    return RunReport(run_id="r1", command=command, started_at="2026-12-02T10:00:00+00:00", duration_s=2.0, hosts=hosts)


def test_document_matches_the_contract_shape() -> None:
    run = _run({"gpu-b01": (HostStatus.CLEAN, None), "gpu-b02": (HostStatus.FAILED, "gpu 0 holds 1523 MiB")})
    doc = json.loads(json.dumps(reporting.to_document(run)))
    assert set(doc) == {"run_id", "fleet_version", "command", "started_at", "duration_s", "summary", "hosts"}
    assert doc["fleet_version"] == fleet.__version__
    assert doc["summary"] == {"total": 2, "clean": 1, "failed": 1, "unreachable": 0, "skipped": 0}
    host = doc["hosts"]["gpu-b01"]
    assert set(host) == {"status", "reason", "duration_s", "start_s", "error", "steps", "killed", "kept", "gpus",
                         "health"}
    assert host["health"] == [] and host["start_s"] is None
    assert [s["name"] for s in host["steps"]] == ["drain", "kill", "settle", "verify"]
    assert set(host["steps"][0]) == {"name", "status", "duration_s", "detail"}


def test_findings_on_no_listed_gpu_are_the_hosts_health_with_their_pci_address() -> None:
    """An Xid on an NVSwitch (no listed GPU) and a kernel log that could not be read: in the host's `health`, and
    back from the document as a node that reset itself (`--via srun`) hands it over."""
    found = (HostFinding(check="xid", level=Level.FAIL, detail="Xid 74 at 11:02:13: NVLink Error", pci="0000:05:00"),
             HostFinding(check="xid", level=Level.FAIL,
                         detail="cannot read the kernel log (journalctl exited 1: No journal files were "
                                            "found.)"))
    host = HostReport(name="gpu-b02", status=HostStatus.FAILED, duration_s=1.0,
                      error="PCI 0000:05:00 (no listed GPU): Xid 74 at 11:02:13: "
                      "NVLink Error", steps=tuple(StepResult(name=x, status=StepStatus.OK) for x in StepName),
                      reason=Reason.HEALTH,
                      health=found)
    document = json.loads(json.dumps(host_to_document(host)))
    assert document["health"] == [
        {"check": "xid", "level": "fail", "detail": "Xid 74 at 11:02:13: NVLink Error", "pci": "0000:05:00"},
        {"check": "xid", "level": "fail", "detail": "cannot read the kernel log (journalctl exited 1: No journal "
                                                    "files were found.)", "pci": None},
    ]
    assert host_from_document("gpu-b02", document).health == found


def test_a_hosts_records_are_written_as_asdict_writes_them() -> None:
    """`flat` (the report's and the history's cheap asdict) gives what asdict gives, nested findings included."""
    gpus = (GpuReport(index=0, memory_used_mib=0, uuid="GPU-0", name="H100", memory_total_mib=81559, settle_s=0.4,
                      health=(Finding("ecc", Level.FAIL, "1 uncorrectable"),
                                                          Finding("pcie", Level.WARN, "gen 4 of 5"))),
            GpuReport(index=1, memory_used_mib=None))
    host = HostReport(name="gpu-b01", status=HostStatus.FAILED, duration_s=1.0, error="gpu 0: 1 uncorrectable",
                      reason=Reason.HEALTH, gpus=gpus,
                      killed=(KilledProcess(pid=7713, name="python3", user="root", signal="SIGKILL"),),
                      health=(HostFinding(check="xid", level=Level.FAIL, detail="Xid 79", pci="0000:05:00"),))
    document = host_to_document(host)
    assert document["gpus"] == [asdict(g) for g in gpus]
    assert [list(g) for g in document["gpus"]] == [list(asdict(g)) for g in gpus]  # the keys in the same order
    assert document["killed"] == [asdict(k) for k in host.killed]
    assert document["health"] == [asdict(f) for f in host.health]


def test_a_hosts_start_in_the_run_comes_back_from_the_document() -> None:
    """start_s (seconds from the run's start to the host's, null for a host that never started) survives the JSON
    both ways (`--via srun`'s hand-over, `fleet show`); an older summary.json has none."""
    steps = tuple(StepResult(name=x, status=StepStatus.OK, duration_s=0.5) for x in StepName)
    run = RunReport(run_id="r1", command="reset", started_at="2026-12-02T10:00:00+00:00", duration_s=9.0, hosts={
        "gpu-b01": HostReport(name="gpu-b01", status=HostStatus.CLEAN, duration_s=2.0, error=None, steps=steps,
                              start_s=4.25),
        "gpu-b02": HostReport(name="gpu-b02", status=HostStatus.SKIPPED, duration_s=0.0, error="stopped",
                              reason=Reason.STOPPED),
    })
    document = json.loads(reporting.render(reporting.to_document(run)))
    assert [h["start_s"] for h in document["hosts"].values()] == [4.25, None]
    assert host_from_document("gpu-b01", document["hosts"]["gpu-b01"]).start_s == 4.25
    again = run_from_document(document)
    assert [h.start_s for h in again.hosts.values()] == [4.25, None]
    document["hosts"]["gpu-b01"]["slurm"] = {"node": "gpu-b01", "jobs": ["4711"], "waited_s": 3.0}
    assert run_from_document(document).hosts["gpu-b01"].start_s == 4.25
    del document["hosts"]["gpu-b01"]["start_s"]
    assert host_from_document("gpu-b01", document["hosts"]["gpu-b01"]).start_s is None


def test_summary_counts_equal_host_statuses() -> None:
    run = _run({f"n{i}": (HostStatus.CLEAN if i % 2 else HostStatus.UNREACHABLE, None) for i in range(7)})
    counts = reporting.summary(run)
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")


def test_human_lines_fold_hosts_with_the_same_outcome() -> None:
    statuses: dict[str, tuple[HostStatus, str | None]] = {f"gpu-b{i:02d}": (HostStatus.CLEAN, None)
                                                          for i in range(1, 16)}
    statuses["gpu-b16"] = (HostStatus.FAILED, "gpu 0 holds 1523 MiB (pid 39865 python3)")
    lines = reporting.human_lines(_run(statuses))
    assert lines[0] == "gpu-b[01-15] clean"
    assert lines[1] == "gpu-b16 failed: gpu 0 holds 1523 MiB (pid 39865 python3)"
    assert lines[2].startswith("reset of 16 hosts in 2.0 s: 15 clean, 1 failed")


def test_hosts_fold_by_reason_with_the_range_of_their_numbers() -> None:
    """500 hosts stay readable: one line per status, reason and shape of error, numbers that differ as ranges."""
    held = Reason.MEMORY_HELD
    hosts = {f"gpu-b{i:02d}": HostReport(name=f"gpu-b{i:02d}", status=HostStatus.FAILED, duration_s=1.0,
                                         error=f"gpu 0 holds {mib} MiB after 60 s (threshold 16 MiB)", reason=held)
             for i, mib in ((3, 1523), (7, 4096), (11, 2000))}
    hosts |= {f"gpu-c{i:02d}": HostReport(name=f"gpu-c{i:02d}", status=HostStatus.FAILED, duration_s=1.0,
                                          error=f"cannot see every process on gpu-c{i:02d} as bob (permission denied on"
                                          f" /proc/*/fd of {i * 3} processes): run as root", reason=Reason.BLIND_SCAN)
              for i in (1, 2)}
    hosts |= {f"gpu-d{i:02d}": HostReport(name=f"gpu-d{i:02d}", status=HostStatus.FAILED, duration_s=1.0,
                                          error=f"gpu 5: Xid 79 at 07:2{i}:00: GPU has fallen off the bus",
                                          reason=Reason.HEALTH)
              for i in (1, 2)}
    hosts["gpu-e01"] = HostReport(name="gpu-e01", status=HostStatus.SKIPPED, duration_s=0.0,
                                  error="slurm: job 4711 still running on gpu-e01 after"
                                  " 600 s: not reset", reason=Reason.JOBS_RUNNING)
    lines = reporting.human_lines(RunReport(run_id="r", command="reset", started_at="t", duration_s=2.0, hosts=hosts))
    assert lines[:4] == [
        "gpu-c[01-02] failed blind_scan: cannot see every process on <host> as bob (permission denied on /proc/*/fd"
        " of 3-6 processes): run as root",
        "gpu-d[01-02] failed health: gpu 5: Xid 79 at 07:21:00-07:22:00: GPU has fallen off the bus",
        "gpu-b[03,07,11] failed memory_held: gpu 0 holds 1523-4096 MiB after 60 s (threshold 16 MiB)",
        "gpu-e01 skipped jobs_running: slurm: job 4711 still running on gpu-e01 after 600 s: not reset",
    ]


def test_errors_of_another_shape_never_fold_together() -> None:
    hosts = {"a": HostReport(name="a", status=HostStatus.FAILED, duration_s=1.0, error="gpu 0 holds 5 MiB",
                             reason=Reason.MEMORY_HELD),
             "b": HostReport(name="b", status=HostStatus.FAILED, duration_s=1.0, error="gpu 0 holds 5 MiB (pid 7 x)",
                             reason=Reason.MEMORY_HELD)}
    lines = reporting.human_lines(RunReport(run_id="r", command="reset", started_at="t", duration_s=2.0, hosts=hosts))
    assert lines[:2] == ["a failed memory_held: gpu 0 holds 5 MiB", "b failed memory_held: gpu 0 holds 5 MiB (pid 7 x)"]


def test_exit_codes() -> None:
    assert reporting.exit_code(_run({"a": (HostStatus.CLEAN, None)})) == 0
    assert reporting.exit_code(_run({"a": (HostStatus.PLANNED, None)})) == 0
    assert reporting.exit_code(_run({"a": (HostStatus.CLEAN, None), "b": (HostStatus.SKIPPED, None)})) == 3
    assert reporting.exit_code(_run({"a": (HostStatus.UNREACHABLE, "x")})) == 4
    assert reporting.exit_code(_run({"a": (HostStatus.UNREACHABLE, "x"), "b": (HostStatus.SKIPPED, None)})) == 4
    assert reporting.exit_code(_run({"a": (HostStatus.UNREACHABLE, "x"), "b": (HostStatus.FAILED, "y"),
                                     "c": (HostStatus.SKIPPED, None)})) == 1
    assert reporting.exit_code(replace(_run({"a": (HostStatus.CLEAN, None)}), interrupted_by="SIGTERM")) == 130
    assert reporting.exit_code(replace(_run({"a": (HostStatus.FAILED, "y")}), interrupted_by="SIGHUP")) == 129


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


def _records(host: HostReport) -> list[object]:
    """Every record of a host's report that the report and the history flatten (`flat`)."""
    plan = host.plan
    return [*host.killed, *host.kept, *host.health, *host.gpus, *(f for g in host.gpus for f in g.health),
            *(g.settings for g in host.gpus if g.settings is not None),
            *((host.fabric_manager,) if host.fabric_manager is not None else ()),
            *((*plan.would_kill, *plan.kept) if plan is not None else ())]


def _by_fields(record: object) -> list[tuple[str, object]]:
    return [(f.name, getattr(record, f.name)) for f in fields(record)]  # type: ignore[arg-type]


@given(report_strategies.hosts, st.none() | st.builds(FabricManager.present, st.text(max_size=8)))
def test_flat_is_each_field_in_its_order_however_the_record_was_made(host: HostReport,
                                                                      fm: FabricManager | None) -> None:
    """`flat` gives a record's fields, in their order, whether the record was built, replaced
    or read back (pickled: the report crosses process bounds), on drawn reports and the real demo's."""
    demo = run_from_document(demo_document())
    for found in (replace(host, fabric_manager=fm), *list(demo.hosts.values())[:4]):
        for record in _records(found):
            for copy in (record, replace(record), pickle.loads(pickle.dumps(record))):  # type: ignore[type-var]
                assert list(flat(copy).items()) == _by_fields(record)


def test_a_line_per_host_is_for_a_reset_of_a_screenful_or_as_asked() -> None:
    """A reset of up to SCREENFUL hosts says what it did on each (`-q`: not; `-v`: however many); a check does
    nothing to say, and a dry run's plan says it already."""
    few = _run({f"h{i}": (HostStatus.CLEAN, None) for i in range(reporting.SCREENFUL)})
    many = _run({f"h{i}": (HostStatus.CLEAN, None) for i in range(reporting.SCREENFUL + 1)})
    assert reporting.per_host_wanted(few, None) and not reporting.per_host_wanted(few, False)
    assert not reporting.per_host_wanted(many, None) and reporting.per_host_wanted(many, True)
    check = _run({"h": (HostStatus.CLEAN, None)}, command="check")
    assert not reporting.per_host_wanted(check, None) and not reporting.per_host_wanted(check, True)
    planned = replace(few, hosts={n: replace(h, plan=HostPlan()) for n, h in few.hosts.items()})
    assert not reporting.per_host_wanted(planned, True)
    (line,) = reporting.done_lines(_run({"gpu-b01": (HostStatus.CLEAN, None)}))
    assert line == "gpu-b01 clean in 1.0 s: killed nothing; settled in 0.0 s"
