"""report.html (`fleet.report.html_report`): built from a real demo run's summary.json and from a synthetic 512-host
report, read back as a document (html.parser); rendered by Debian's headless Chromium; written by every run (Ctrl-C
too); and `fleet show --html`."""

from __future__ import annotations

import html
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.report_page import (
    DEMO_0_1,
    ODD_DRIVER,
    ODD_HOST,
    Page,
    cells_of,
    demo_document,
    page_of,
    synthetic_document,
)

from fleet.app.run import run_and_report
from fleet.cli.commands import main
from fleet.engine.options import RunOptions
from fleet.history import History, history_path
from fleet.inventory.host import Host
from fleet.inventory.nodesets import fold
from fleet.model.codec import run_from_document
from fleet.model.errors import ConnectError
from fleet.model.report import (
    HostReport,
    HostStatus,
    KeptProcess,
    Reason,
    RunReport,
    StepName,
    StepResult,
    StepStatus,
)
from fleet.report.html_report import BAR_UNITS, REPORT_HTML, RunPage, outcome_groups, page

SIZE_BOUND = 2_000_000  # bytes: the page of a 512-host run, to attach to a mail or a chat




# --- the page as a document --------------------------------------------------------------------------------------


def test_the_demo_page_has_every_host_with_the_numbers_of_its_json() -> None:
    document = demo_document()
    hosts = document["hosts"]
    parsed = Page(page_of(document, log_folder="/var/log/fleet/runs/x"))
    for kind in ("grid", "timeline", "host"):
        assert sorted(r.get("data-host") for r in parsed.of(kind)) == sorted(hosts), kind
    for row in parsed.of("grid"):
        host = hosts[row.get("data-host")]
        expected = [(g["index"], str(b), str(g["memory_used_mib"]))
                    for g, b in zip(host["gpus"], host["memory_before_mib"], strict=True)]
        assert cells_of(row) == expected
        assert row.get("data-gpus") == str(len(host["gpus"]))
    text = "".join(parsed.text)
    assert "1 of 16 hosts not clean" in text
    assert all(f"{n} {s}" in text for s, n in document["summary"].items() if s != "total" and n)
    sick = next(r for r in parsed.of("host") if r.get("data-host") == "gpu-b16")
    assert "gpu 5: Xid 79" in sick.text and "/var/log/fleet/runs/x/gpu-b16.jsonl" in sick.text
    assert "open" in sick.attrs  # a host that did not end clean is shown open
    killed = hosts["gpu-b16"]["killed"][0]
    assert f"{killed['pid']}python3root{killed['signal']}" in sick.text
    failed_cells = [c for c in next(r for r in parsed.of("grid") if r.get("data-host") == "gpu-b16").children
                    if c.tag == "td" and "hf" in c.get("class").split()]
    assert [c.get("title").split(":")[0] for c in failed_cells] == ["gpu 5"]
    assert "xid fail: Xid 79" in failed_cells[0].get("title")


def bars_of(row: Any) -> list[tuple[str, float, float, float]]:
    """(class, x, width, seconds its title says) of each bar of a timeline row, x and width in seconds of the axis
    (the row's SVG spans `data-extent` seconds in BAR_UNITS)."""
    svg = next(c for c in row.children if c.tag == "svg")
    scale = float(svg.get("data-extent")) / BAR_UNITS
    return [(c.get("class"), float(c.get("x")) * scale, float(c.get("width")) * scale,
             float(c.get("title").split()[-2])) for c in row.children if c.tag == "rect"]


def layout_of(text: str) -> str:
    match = re.search(r'<section id="timeline" data-layout="(\w+)"', text)
    assert match is not None
    return match[1]


def test_the_timeline_puts_each_host_at_its_start_in_the_run_sorted_by_end() -> None:
    """Each host's bars begin at its start_s and last its steps' durations, end to end; a Slurm wait is its own bar
    ending where the host started; rows by end time (start_s + duration_s), those that never started last."""
    document = synthetic_document()
    text = page_of(document)
    assert layout_of(text) == "run" and "seconds since the run started" in text
    assert "<i class=\"wait\"></i>waiting for its node's Slurm jobs" in text
    rows = Page(text).of("timeline")
    ran = [r for r in rows if any(c.tag == "rect" for c in r.children)]
    ends = [float(r.get("data-end")) for r in ran]
    assert ends == sorted(ends)
    waits = 0
    for row in ran:
        host = document["hosts"][row.get("data-host")]
        assert float(row.get("data-start")) == host["start_s"]
        assert float(row.get("data-end")) == pytest.approx(host["start_s"] + host["duration_s"], abs=0.001)
        bars = bars_of(row)
        extent = float(next(c for c in row.children if c.tag == "svg").get("data-extent"))
        close = extent / BAR_UNITS  # one SVG unit, in seconds: the page writes x and width to 0.1 of one
        waited = host["slurm"].get("waited_s")
        if waited:
            waits += 1
            kind, x, width, said = bars.pop(0)
            assert (kind, said) == ("wait", waited)
            assert x == pytest.approx(host["start_s"] - waited, abs=close)
            assert x + width == pytest.approx(host["start_s"], abs=close)
        assert all(kind != "wait" for kind, *_ in bars)
        assert bars[0][1] == pytest.approx(host["start_s"], abs=close)
        for (_, x, width, said), following in zip(bars, [*bars[1:], None], strict=True):
            assert width == pytest.approx(said, abs=close)
            if following is not None:
                assert following[1] == pytest.approx(x + width, abs=close)  # end to end
        assert bars[-1][1] + bars[-1][2] == pytest.approx(host["start_s"] + host["duration_s"], abs=2 * close)
        assert sum(said for *_, said in bars) == pytest.approx(host["duration_s"], abs=0.02)
        names = [kind for kind, *_ in bars]
        assert [n for n in names if n not in ("pre", "bad")] == [
            s["name"] for s in host["steps"] if s["status"] == "ok"]
    assert waits == sum(1 for h in document["hosts"].values() if h["start_s"] is not None
                        and h["slurm"].get("waited_s"))
    assert waits > 10
    never = [r for r in rows if r not in ran]
    assert len(never) == 6 and all("not started (waited 30.0 s for its Slurm jobs)" in r.text for r in never)
    assert [r.get("data-host") for r in never] == sorted(r.get("data-host") for r in never)
    last = max(ran, key=lambda r: float(r.get("data-end")))
    words = "".join(Page(text).text)
    assert f"last to end: {last.get('data-host')} at {float(last.get('data-end')):.1f} s into the run" in words


def test_an_older_summary_without_start_s_keeps_each_hosts_own_axis() -> None:
    """fleet 0.1.0's summary.json (no start_s): each host's bars start at its own start, rows by duration, the page
    says why; a Slurm wait is not drawn (it would lie before the host's start)."""
    document = demo_document(DEMO_0_1)
    assert all("start_s" not in h for h in document["hosts"].values())
    document["hosts"]["gpu-b03"]["slurm"] = {"node": "gpu-b03", "state_before": "MIXED", "jobs": ["4711"],
                                             "waited_s": 4.0}
    text = page_of(document)
    assert layout_of(text) == "host"
    assert "seconds from each host's own start" in text and "keeps no host's start in the run" in text
    assert "<i class=\"wait\">" not in text
    rows = Page(text).of("timeline")
    assert [float(r.get("data-end")) for r in rows] == sorted(h["duration_s"] for h in document["hosts"].values())
    for row in rows:
        host = document["hosts"][row.get("data-host")]
        assert "data-start" not in row.attrs
        bars = bars_of(row)
        assert bars[0][1] == 0.0 and all(kind != "wait" for kind, *_ in bars)
        assert sum(said for *_, said in bars) == pytest.approx(host["duration_s"], abs=0.02)
    one_without = synthetic_document()
    one_without["hosts"]["gpu-r01n01"].pop("start_s")  # one host that ran without its start: no run axis
    assert layout_of(page_of(one_without)) == "host"


def test_the_demo_runs_hosts_start_at_once() -> None:
    """The real demo run's summary.json (this fleet's): every host has its start in the run, within its first
    second (16 hosts, no waves), and the page lays them on the run's axis."""
    document = demo_document()
    starts = [h["start_s"] for h in document["hosts"].values()]
    assert all(0 <= s < 1 for s in starts)
    assert layout_of(page_of(document)) == "run"


def test_the_outcome_folds_as_the_summary_does_largest_group_first() -> None:
    document = synthetic_document()
    groups = outcome_groups(run_from_document(document).hosts)
    sizes = [len(names) for _, _, names, _ in groups]
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) == len(document["hosts"])
    parsed = Page(page_of(document))
    rows = parsed.of("outcome")
    assert [int(r.get("data-count")) for r in rows] == sizes
    for row, (status, reason, names, _) in zip(rows, groups, strict=True):
        assert fold(names) in row.text and status in row.text and reason in row.text
    memory = next(g for g in groups if g[1] == "memory_held")
    assert re.fullmatch(r"gpu 3 holds \d+-\d+ MiB after 60 s \(threshold 16 MiB\)", memory[3])


def test_every_string_from_the_document_is_escaped() -> None:
    evil = '<script>alert("x")</script> & <img src=x onerror=alert(1)> "quoted" \'single\''
    document = demo_document()
    host = document["hosts"]["gpu-b16"]
    host.update(error=evil, kept=[{"pid": 7, "name": evil, "user": evil, "why": evil}])
    host["steps"][1]["detail"] = f"killed 1 (0 on SIGTERM, 1 on SIGKILL); kept pid 7 {evil} ({evil})"
    host["gpus"][0]["health"] = [{"check": evil, "level": "warn", "detail": evil}]
    host["slurm"] = {"node": evil, "state_before": evil, "reason_before": evil, "jobs": [evil]}
    document["hosts"][evil] = host
    text = page_of(document, log_folder=evil)
    parsed = Page(text)
    assert parsed.tags["script"] == 0 and parsed.tags["img"] == 0
    assert evil in "".join(parsed.text)
    assert any(r.get("data-host") == evil for r in parsed.of("grid"))


def test_the_grid_marks_the_odd_hosts_out_naming_why_and_escaping_the_values() -> None:
    """The rack compared: the host on another driver marked in the grid (`≠`, its title why, `data-odd`); a value
    from the document escaped; the real demo's gpu-b07, by its driver and its fabric manager."""
    document = synthetic_document()
    parsed = Page(page_of(document))
    (odd,) = [r for r in parsed.of("grid") if "data-odd" in r.attrs]
    assert odd.get("data-host") == ODD_HOST
    (mark,) = [e for e in odd.children if e.get("class") == "odd"]
    others = sum(1 for h in document["hosts"].values() if h["gpus"]) - 1
    assert mark.get("title") == f"settings: driver {ODD_DRIVER} ({others} others 575.57.08)"
    assert "GPU settings or fabric manager unlike the run's other hosts'" in "".join(parsed.text)
    evil = '<b onclick="x">&</b>'
    document["hosts"][ODD_HOST]["gpus"] = [{**g, "settings": {**g["settings"], "vbios": evil}}
                                           for g in document["hosts"][ODD_HOST]["gpus"]]
    text = page_of(document)
    assert evil not in text and f"VBIOS {html.escape(evil)} (" in text
    (demo,) = [r for r in Page(page_of(demo_document())).of("grid") if "data-odd" in r.attrs]
    (mark,) = [e for e in demo.children if e.get("class") == "odd"]  # the demo's gpu-b07: its driver and its FM
    assert demo.get("data-host") == "gpu-b07" and mark.get("title") == (
        "settings: driver 535.183.01 (15 others 550.90.07); fabric manager 535.183.01 (15 others 550.90.07)")


def test_the_page_loads_nothing_and_runs_nothing() -> None:
    text = page_of(synthetic_document())
    assert "<script" not in text and "://" not in text and "src=" not in text
    assert "@import" not in text and "url(" not in text and "@font-face" not in text
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">" \
        in text


def test_a_512_host_page_stays_under_2_mb() -> None:
    document = synthetic_document()
    assert len(document["hosts"]) == 512
    text = page_of(document, log_folder="/home/operator/.local/state/fleet/runs/20261203T030000Z-5e1f00")
    size = len(text.encode("utf-8"))
    assert size < SIZE_BOUND, f"{size} bytes for 512 hosts"
    parsed = Page(text)
    assert (len(parsed.of("grid")), len(parsed.of("timeline")), len(parsed.of("host"))) == (512, 512, 512)


def test_a_check_without_baselines_and_a_host_never_reached() -> None:
    document = demo_document()
    document["command"] = "check"
    for host in document["hosts"].values():
        host.pop("memory_before_mib")
    document["hosts"]["gpu-b09"] = {"status": "unreachable", "reason": "connect_timeout", "duration_s": 10.0,
                                    "error": "no SSH session within 10 s", "gpus": [], "killed": [],
                                    "steps": [{"name": n, "status": "skipped", "duration_s": 0.0, "detail": ""}
                                              for n in ("drain", "kill", "settle", "verify")]}
    parsed = Page(page_of(document))
    grid = {r.get("data-host"): r for r in parsed.of("grid")}
    assert cells_of(grid["gpu-b01"]) == [(i, None, "0") for i in range(8)]
    assert "no GPU read" in grid["gpu-b09"].text and grid["gpu-b09"].get("data-gpus") == "0"
    timeline = {r.get("data-host"): r for r in parsed.of("timeline")}
    assert [(c.get("class"), c.get("title")) for c in timeline["gpu-b09"].children if c.tag == "rect"] == [
        ("pre", "before drain 10.00 s")]  # its time went into trying to connect


def test_a_host_that_never_started_ends_the_timeline() -> None:
    document = demo_document()
    document["hosts"]["gpu-a01"] = {"status": "skipped", "reason": "stopped", "duration_s": 0.0,
                                    "error": "stopped: more than 0 hosts failed", "gpus": [], "killed": [],
                                    "steps": [{"name": n, "status": "skipped", "duration_s": 0.0, "detail": ""}
                                              for n in ("drain", "kill", "settle", "verify")]}
    timeline = Page(page_of(document)).of("timeline")
    assert timeline[-1].get("data-host") == "gpu-a01" and "not started" in timeline[-1].text


def test_kept_holders_are_the_reports_data_never_read_from_the_kill_steps_prose() -> None:
    """Each holder the kill left alive is a row of its own (pid, name, why) from the host's `kept`, whatever its name
    or its why holds (spaces, parentheses); a kill step's detail that names a kept holder adds no row."""
    kept = (KeptProcess(pid=7, name="python3", user="alice",
                        why="a Slurm job's process (job 4711, cgroup /a/job_4711)"),
            KeptProcess(pid=9, name="nv hostengine (2)", user="root", why="protected name nv-hostengine"))
    steps = (StepResult(name=StepName.KILL, status=StepStatus.OK, duration_s=1.0,
                        detail="no GPU holders to kill; kept pid 7 python3 (...), pid 9"
                        " nv hostengine (2) (protected name nv-hostengine)"),)
    hosts = {"gpu-b01": HostReport(name="gpu-b01", status=HostStatus.CLEAN, duration_s=2.0, error=None, steps=steps,
                                   kept=kept),
             "gpu-b02": HostReport(name="gpu-b02", status=HostStatus.CLEAN, duration_s=2.0, error=None, steps=steps)}
    report = RunReport(run_id="r1", command="reset", started_at="2026-12-03T03:00:00+00:00", duration_s=3.0,
                       hosts=hosts)
    text = page(RunPage(report=report, fleet_version="0.2.0"))
    details = {r.get("data-host"): r for r in Page(text).of("host")}
    rows = [c for c in details["gpu-b01"].children if c.tag == "tr"]
    assert "kept pidnamewhy" in details["gpu-b01"].text
    assert "7python3a Slurm job's process (job 4711, cgroup /a/job_4711)" in details["gpu-b01"].text
    assert "9nv hostengine (2)protected name nv-hostengine" in details["gpu-b01"].text
    assert len(rows) == 2 + 1 + 2  # the steps table's header and row, the kept table's header and its two rows
    assert "kept pidnamewhy" not in details["gpu-b02"].text


# --- written by every run, and by fleet show --html -------------------------------------------------------------


async def test_a_run_writes_its_page_beside_summary_json(tmp_path: Path) -> None:
    async def refused(h: Host) -> Any:
        raise ConnectError(f"connection refused ({h.address}:22)")

    hosts = [Host(name=n, address="192.0.2.1") for n in ("gpu-b01", "gpu-b02")]
    _, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=tmp_path, connector=refused)
    folder = tmp_path / report.run_id
    summary = json.loads((folder / "summary.json").read_text())
    text = (folder / REPORT_HTML).read_text()
    assert text == page_of(summary, log_folder=str(folder))
    assert [r.get("data-host") for r in Page(text).of("grid")] == ["gpu-b01", "gpu-b02"]
    assert not list(folder.glob(".*tmp"))


async def test_an_interrupted_run_still_writes_its_page(tmp_path: Path) -> None:
    """SIGINT to this process (the run handles it, as Ctrl-C): exit 130, and the page says where each host was."""
    async def hangs(h: Host) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        await anyio.sleep(30)

    hosts = [Host(name="gpu-b01", address="192.0.2.1")]
    with anyio.fail_after(20):
        code, report = await run_and_report(hosts, RunOptions(), as_json=False, log_dir=tmp_path, connector=hangs,
                                            handle_signals=True)
    assert code == 130
    text = (tmp_path / report.run_id / REPORT_HTML).read_text()
    assert "interrupted during connect" in "".join(Page(text).text)


def test_show_html_prints_the_path_and_writes_the_page_of_an_older_run(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    document = demo_document()
    folder = tmp_path / document["run_id"]
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(document))
    assert main(["show", "last", "--html", "--log-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{folder / REPORT_HTML}\n"
    assert (folder / REPORT_HTML).read_text() == page_of(document, log_folder=str(folder))
    (folder / REPORT_HTML).write_text("kept as it is")
    assert main(["show", document["run_id"], "--html", "--log-dir", str(tmp_path)]) == 0
    assert (folder / REPORT_HTML).read_text() == "kept as it is"  # a page that is there is never rewritten
    capsys.readouterr()
    for bad in (["--host", "gpu-b01"], ["--json"]):
        assert main(["show", "last", "--html", *bad, "--log-dir", str(tmp_path)]) == 2
    assert "--html prints the path" in capsys.readouterr().err


def test_show_html_of_a_run_killed_before_its_summary_builds_the_page_from_the_history(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with History.open(history_path(tmp_path)) as history:
        history.start_run("run-k", "reset", ["gpu-b01", "gpu-b02"], {"mode": "reset"}, "2026-12-03T03:00:00Z",
                          "0.2.0", tmp_path)
        history.record_host("run-k",
                            HostReport(name="gpu-b01", status=HostStatus.FAILED, duration_s=3.5,
                                       error="gpu 0 holds 900 MiB",
                                                reason=Reason.MEMORY_HELD))
    assert main(["show", "run-k", "--html", "--log-dir", str(tmp_path)]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == tmp_path / "run-k" / REPORT_HTML
    parsed = Page(path.read_text())
    assert [r.get("data-host") for r in parsed.of("grid")] == ["gpu-b01", "gpu-b02"]
    text = "".join(parsed.text)
    assert "built from its history, 1 of 2 hosts on record" in text
    assert "gpu 0 holds 900 MiB" in text and "not on record" in text


# --- in a real browser --------------------------------------------------------------------------------------------
