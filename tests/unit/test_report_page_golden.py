"""report.html byte for byte: the pages of the real demo's summary.json (and fleet 0.1.0's), and of the same with
every kind of string made markup, equal the pages fleet wrote before the page was rebuilt for speed (77c1284:
each host's words worked out once, fleet's own numbers and enum values no longer escaped, each distinct string
escaped once). The golden pages are `tests/fixtures/report/*.html`; the browser and sim tiers check what they
show. A deliberate change to the page (its style, a new part) writes new goldens: look at the old and new page in
a browser, then write each `PAGES[name]()` over its file, in the same commit as the change."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from support.paths import FIXTURES
from support.report_page import DEMO_0_1, demo_document, page_of

EVIL = '<script>alert("x")</script> & <img src=x onerror=alert(1)> "quoted" \'single\''


def evil_document() -> dict[str, Any]:
    """The demo's summary with markup in each string a report carries: an error, a kept process, a step's detail,
    a GPU's and a node's health finding, the scheduler's record (with a wait), a dry run's plan, a host's name, the
    units stopped and settings restored, the signal that interrupted the run."""
    document = demo_document()
    host = copy.deepcopy(document["hosts"]["gpu-b16"])
    host.update(error=EVIL, kept=[{"pid": 7, "name": EVIL, "user": EVIL, "why": EVIL}],
                killed=[{"pid": 8, "name": EVIL, "user": EVIL, "signal": EVIL}],
                health=[{"check": EVIL, "level": "fail", "detail": EVIL, "pci": EVIL}])
    host["steps"][1]["detail"] = f"killed 1 (0 on SIGTERM, 1 on SIGKILL); kept pid 7 {EVIL} ({EVIL})"
    host["gpus"][0]["health"] = [{"check": EVIL, "level": "warn", "detail": EVIL}]
    host["gpus"][0]["name"] = EVIL
    host["slurm"] = {"node": EVIL, "state_before": EVIL, "reason_before": EVIL, "jobs": [EVIL], "plan": EVIL,
                     "error": EVIL, "waited_s": 2.5, "taken_over": EVIL, "abandoned": True}
    planned = {"pid": 9, "user": EVIL, "name": EVIL, "mib": 512, "kept_because": EVIL}
    host["plan"] = {"would_stop": [EVIL], "units": {EVIL: EVIL}, "would_kill": [planned], "kept": [planned],
                    "gpu_memory_mib": [70000, None]}
    host.update(stopped=[EVIL], restored=[EVIL])
    document["hosts"][EVIL] = host
    document["interrupted_by"] = EVIL
    return document


PAGES = {
    "demo-report.html": lambda: page_of(demo_document(), log_folder="/var/log/fleet/<run>&"),
    "demo-report-0.1.0.html": lambda: page_of(demo_document(DEMO_0_1)),
    "evil-report.html": lambda: page_of(evil_document(), log_folder=EVIL),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_is_byte_for_byte_the_one_fleet_wrote_before(name: str) -> None:
    golden = (FIXTURES / "report" / name).read_text(encoding="utf-8")
    assert PAGES[name]() == golden
