"""The codec (`fleet.model.codec`): a host's report and its JSON document, typed both ways. Round trips over many
generated reports and the real summaries in tests/fixtures; strict reading (a missing or mistyped key is one line
naming it, and bytes of any shape raise nothing else, as the `--via srun` relay reads them from a node); the
relay's frames; and the history's columns read back (`host_from_row`)."""

from __future__ import annotations

import io
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.report_page import DEMO, DEMO_0_1, demo_document
from support.report_strategies import hosts

from fleet.cli.commands import main
from fleet.history import History, history_path, host_from_row
from fleet.model import plugs
from fleet.model.codec import host_from_document, host_to_document, json_writer, run_from_document
from fleet.model.errors import DocumentError
from fleet.model.fabric import FmState
from fleet.model.report import (
    GpuReport,
    HostReport,
    HostStatus,
    KeptProcess,
    Reason,
    RunReport,
    SchedulerRecord,
    StepResult,
)
from fleet.report.render import render, to_document
from fleet.slurm.frames import Assembler
from fleet.slurm.noderun import Lines

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


def through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(hosts)
def test_a_host_comes_back_from_its_document(host: HostReport) -> None:
    document = through_json(host_to_document(host))
    assert host_from_document(host.name, document) == host
    assert through_json(host_to_document(host_from_document(host.name, document))) == document


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10), hosts, max_size=4))
def test_a_run_comes_back_from_its_summary_json(found: dict[str, HostReport]) -> None:
    run = RunReport(run_id="20261203T030000Z-5e1f00", command="reset", started_at="2026-12-03T03:00:00+00:00",
                    duration_s=9.5,
                    hosts={name: replace(h, name=name) for name, h in found.items()})
    again = run_from_document(json.loads(render(to_document(run))))
    assert again == run and list(again.hosts) == list(run.hosts)


JSON_WRITERS = {(", ", ": "): json_writer(), (",", ":"): json_writer(",", ":")}


def writes_as_json_dumps(value: Any) -> bool:
    """Every writer's text of `value` is json.dumps' with its separators, byte for byte."""
    return all(write(value) == json.dumps(value, separators=separators) for separators, write in JSON_WRITERS.items())


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_json_writer_writes_what_json_dumps_writes(value: Any) -> None:
    assert writes_as_json_dumps(value)


@settings(max_examples=100, deadline=None)
@given(hosts)
def test_the_json_writer_writes_a_host_document_as_json_dumps(host: HostReport) -> None:
    """A host's line of the summary (tuples, enums, floats, any text) as json.dumps writes it; a value JSON has no
    type for is json.dumps' TypeError."""
    assert writes_as_json_dumps(host_to_document(host))
    with pytest.raises(TypeError):
        json_writer()({"bad": {1, 2}})


@pytest.mark.parametrize("path", [DEMO, DEMO_0_1], ids=["this fleet", "fleet 0.1.0"])
def test_the_real_summaries_are_written_by_the_json_writer_as_by_json_dumps(path: Path) -> None:
    assert writes_as_json_dumps(demo_document(path))


@pytest.mark.parametrize("path", [DEMO, DEMO_0_1], ids=["this fleet", "fleet 0.1.0"])
def test_the_real_summaries_read_back_and_write_the_same_document(path: Path) -> None:
    """A real demo run's summary.json, of this fleet and of 0.1.0 (no start_s, no health, no kept): read back, each
    host writes the document it was read from, but the keys added since (0.1.0's `kept`, a GPU's `settings`,
    `start_s`, `health`; this fleet's demo has every one, `fabric_manager` too)."""
    document = demo_document(path)
    run = run_from_document(document)
    assert len(run.hosts) == document["summary"]["total"] == 16
    assert run.hosts["gpu-b16"].reason is Reason.HEALTH and run.hosts["gpu-b16"].gpus[5].health
    for name, host in run.hosts.items():
        again = host_to_document(host)
        added = {"kept", "start_s", "health"} - set(document["hosts"][name])
        again = {k: v for k, v in again.items() if k not in added}
        if path == DEMO_0_1:
            again["gpus"] = [{k: v for k, v in gpu.items() if k != "settings"} for gpu in again["gpus"]]
        else:
            assert host.fabric_manager is not None and host.fabric_manager.state is FmState.PRESENT
        assert json.dumps(again) == json.dumps(document["hosts"][name])


def refusal_of(name: str, value: Any) -> str | None:
    """Why the codec refused a host's document (its one line), or None when it read it."""
    try:
        host_from_document(name, value)
    except DocumentError as exc:
        return str(exc)
    return None


def broken(change: Any) -> dict[str, Any]:
    document: dict[str, Any] = demo_document()["hosts"]["gpu-b16"]
    change(document)
    return document


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("status"), "status: missing"),
    (lambda d: d.update(status="fine"), "status: 'fine' is no HostStatus fleet knows"),
    (lambda d: d.update(reason="bad_luck"), "reason: 'bad_luck' is no Reason fleet knows"),
    (lambda d: d.update(duration_s="12.5"), "duration_s: expected a number, got '12.5'"),
    (lambda d: d.update(duration_s=True), "duration_s: expected a number, got True"),
    (lambda d: d.update(duration_s=float("nan")), "duration_s: expected a number, got nan"),
    (lambda d: d.update(start_s=float("inf")), "start_s: expected a number or null, got inf"),
    (lambda d: d.update(error=7), "error: expected a string or null, got 7"),
    (lambda d: d.update(steps={}), "steps: expected a list, got dict"),
    (lambda d: d["steps"][2].pop("detail"), "steps[2].detail: missing"),
    (lambda d: d["killed"][0].update(pid="7"), "killed[0].pid: expected an integer, got '7'"),
    (lambda d: d["gpus"][3].update(memory_used_mib=1.5), "gpus[3].memory_used_mib: expected an integer or null,"
                                                         " got 1.5"),
    (lambda d: d["gpus"][5]["health"][0].update(level="grave"), "gpus[5].health[0].level: 'grave' is no Level fleet"
                                                                " knows"),
    (lambda d: d.update(memory_before_mib=[0, "x"]), "memory_before_mib[1]: expected an integer or null, got 'x'"),
    (lambda d: d.update(kept=[{"pid": 1, "name": "x", "user": "root"}]), "kept[0].why: missing"),
    (lambda d: d.update(slurm={"state_before": "IDLE"}), "slurm.node: missing"),
    (lambda d: d.update(slurm={"node": "b16", "jobs": [4711]}), "slurm.jobs[0]: expected a string, got 4711"),
    (lambda d: d.update(plan={"units": {"a.service": 1}}), "plan.units.a.service: expected a string, got 1"),
    (lambda d: d.update(gpus=[[]]), "gpus[0]: expected an object, got list"),
])
def test_a_missing_or_mistyped_key_is_one_line_naming_it(change: Any, message: str) -> None:
    with pytest.raises(DocumentError) as caught:
        host_from_document("gpu-b16", broken(change))
    assert str(caught.value) == message


def test_a_run_document_names_the_host_the_key_is_in() -> None:
    document = demo_document()
    document["hosts"]["gpu-b03"]["gpus"][2]["settle_s"] = "soon"
    with pytest.raises(DocumentError, match=r"^hosts\.gpu-b03\.gpus\[2\]\.settle_s: expected a number or null, got"
                                            r" 'soon'$"):
        run_from_document(document)
    with pytest.raises(DocumentError, match=r"^the document: expected an object, got list$"):
        run_from_document([])


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_at_all_is_read_or_refused_with_a_document_error(value: Any) -> None:
    """What a node sends is untrusted: any JSON value is a report or a DocumentError, never another exception."""
    refusal = refusal_of("n1", value)
    assert refusal is None or "\n" not in refusal


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts, st.data())
def test_a_report_with_one_value_replaced_is_read_or_refused_with_a_document_error(host: HostReport,
                                                                                   data: st.DataObject) -> None:
    document = through_json(host_to_document(host))
    places = [(document, key) for key in document]
    places += [(item, key) for value in document.values() if isinstance(value, list)
               for item in value if isinstance(item, dict) for key in item]
    where, key = data.draw(st.sampled_from(places))
    where[key] = data.draw(json_values)
    refusal = refusal_of(host.name, document)
    assert refusal is None or "\n" not in refusal


@settings(max_examples=100, deadline=None)
@given(hosts)
def test_the_srun_relay_hands_the_controller_the_nodes_report(host: HostReport) -> None:
    """A node that reset itself (`--via srun`) writes its report as frames on stdout; the controller reassembles
    them and reads the same report back, its health findings and kept holders included."""
    out = io.StringIO()
    Lines(out, "b01").report(host)
    assembler, got = Assembler(), []
    for line in out.getvalue().splitlines():
        whole = assembler.feed(line)
        if whole is not None:
            got.append(whole)
    (node, message), = got
    assert node == "b01" and host_from_document(host.name, message["report"]) == host


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts)
def test_the_history_row_reads_back_what_it_keeps_of_the_report(host: HostReport) -> None:
    """The history keeps a host's outcome, steps (not their detail), killed, memory, settle times, health findings,
    Slurm's record and each GPU's settings; `host_from_row` gives them back (the GPUs by their place, as the row
    keeps them)."""
    host = replace(host, gpus=tuple(replace(g, index=i) for i, g in enumerate(host.gpus)))
    with tempfile.TemporaryDirectory() as folder, History.open(history_path(Path(folder))) as history:
        history.start_run("r1", "reset", [host.name], {}, "2026-12-03T03:00:00Z", "0.2.0", Path(folder))
        history.record_host("r1", host)
        record = history.get("r1")
    assert record is not None
    (row,) = record.hosts
    before = host.memory_before_mib if host.memory_before_mib is not None else (
        host.plan.gpu_memory_mib if host.plan is not None else None)
    assert host_from_row(row) == HostReport(
        name=host.name, status=host.status, duration_s=host.duration_s, error=host.error,
        steps=tuple(StepResult(name=s.name, status=s.status, duration_s=s.duration_s)
                                                                   for s in host.steps),
        killed=host.killed,
        gpus=tuple(GpuReport(index=g.index, memory_used_mib=g.memory_used_mib, settle_s=g.settle_s, health=g.health,
                                     settings=g.settings) for g in host.gpus),
        scheduler=host.scheduler, reason=host.reason, memory_before_mib=before, health=host.health)


def test_a_row_with_a_reason_of_another_fleet_reads_as_none(tmp_path: Path) -> None:
    host = HostReport(name="gpu-b01", status=HostStatus.FAILED, duration_s=1.0, error="odd", reason=Reason.HEALTH,
                      kept=(KeptProcess(pid=7, name="x", user="root", why="protected name x"),))
    with History.open(history_path(tmp_path)) as history:
        history.start_run("r1", "reset", [host.name], {}, "2026-12-03T03:00:00Z", "0.2.0", tmp_path)
        history.record_host("r1", host)
        record = history.get("r1")
    assert record is not None
    row = replace(record.hosts[0], reason="a_newer_reason")
    assert host_from_row(row) == replace(host, reason=None, kept=())


@pytest.mark.parametrize("html", [False, True], ids=["show", "show --html"])
def test_show_of_a_summary_fleet_cannot_read_is_one_line_exit_2(tmp_path: Path, html: bool,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    document = demo_document()
    document["hosts"]["gpu-b03"]["steps"][0]["status"] = "half done"
    folder = tmp_path / document["run_id"]
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(document))
    assert main(["show", "last", *(["--html"] if html else []), "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder / 'summary.json'}: hosts.gpu-b03.steps[0].status: 'half done' is no" \
                                   " StepStatus fleet knows" in err
    assert not (folder / "report.html").exists()


def test_a_scheduler_record_is_keyed_by_its_scheduler_in_the_document_and_named_in_the_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of another scheduler than Slurm: under its own name in the document (read back only where that
    scheduler is registered), as `by` in the history's column (read back whatever is registered)."""
    host = HostReport(name="gpu-b01", status=HostStatus.CLEAN, duration_s=1.0, error=None,
                      scheduler=SchedulerRecord(node="b01", state_before="ready", by="k8s"))
    document = through_json(host_to_document(host))
    assert "slurm" not in document and document["k8s"] == {"node": "b01", "state_before": "ready",
                                                          "reason_before": None, "state_after": None,
                                                          "reason_after": None, "jobs": []}
    assert host_from_document("gpu-b01", document).scheduler is None  # no such scheduler here: not read
    monkeypatch.setitem(plugs.SCHEDULERS, "k8s", plugs.Scheduled("k8s.plug", "k8s.jobs"))
    assert host_from_document("gpu-b01", document) == host
    with History.open(history_path(tmp_path)) as history:
        history.start_run("r1", "reset", [host.name], {}, "2026-12-03T03:00:00Z", "0.2.0", tmp_path)
        history.record_host("r1", host)
        record = history.get("r1")
    assert record is not None and record.hosts[0].slurm is not None and record.hosts[0].slurm["by"] == "k8s"
    assert host_from_row(record.hosts[0]).scheduler == host.scheduler
