"""The history recorder's test of whether a host's final report is the row `host_ended` already queued: every field
the same but the host's start in the run (`start_s`, which the row does not keep). It compares the reports' fields
without building a report; here it is checked against the straightforward `ended == replace(report, start_s=...)`."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st
from support import report_strategies
from support.report_page import demo_document

from fleet.history.recorder import but_start
from fleet.model.codec import run_from_document
from fleet.model.report import HostReport, HostStatus


def straightforward(ended: HostReport, report: HostReport) -> bool:
    return ended == report or ended == replace(report, start_s=ended.start_s)


@given(report_strategies.hosts, report_strategies.hosts, st.none() | st.floats(0, 1e5))
def test_the_same_but_the_start_is_what_replace_would_say(ended: HostReport, other: HostReport,
                                                          start: float | None) -> None:
    for report in (ended, replace(ended, start_s=start), other, replace(other, name=ended.name)):
        assert (but_start(ended) == but_start(report)) == straightforward(ended, report)


def test_on_the_real_demo_a_report_differing_in_any_field_but_its_start_is_not_written() -> None:
    hosts = list(run_from_document(demo_document()).hosts.values())
    for host in hosts:
        moved = replace(host, start_s=(host.start_s or 0.0) + 1.5)
        assert but_start(host) == but_start(moved) and straightforward(host, moved)
        for changed in (replace(host, duration_s=host.duration_s + 1), replace(host, status=HostStatus.SKIPPED),
                        replace(host, gpus=host.gpus[1:]), replace(host, error="other")):
            assert (but_start(host) == but_start(changed)) == straightforward(host, changed)
    assert any(but_start(a) != but_start(b) for a, b in pairwise(hosts))
