"""`benchmarks/controller.py` at 200 hosts, once: a smoke test of the benchmark and of fleet at that size.

It records a busy, an unhealthy and an already clean simulated node over SSH, then resets 200 hosts replaying
those answers through the real task graph, steps, logs, history and report. Checked: every host ends as its
kind must (clean, failed for health, unreachable), and the run wrote its report, logs and history. Not timed:
speed is `make bench`'s to measure.
"""

from __future__ import annotations

from pathlib import Path

import controller
import pytest


@pytest.mark.timeout(300)
async def test_two_hundred_replayed_hosts_end_as_their_kind_says(tmp_path: Path) -> None:
    recording = await controller.record(tmp_path / "rec")
    assert set(recording) == {"busy", "clean", "unhealthy"}
    busy = [argv for argv, _ in recording["busy"][1]]
    assert any(argv[0] == "sh" and "fleet-signal" in argv for argv in busy), "the busy node's stray was signalled"
    row = await controller.run_size(200, recording, tmp_path / "run")
    assert row["unexpected"] == 0, row["unexpected_example"]
    assert row["hosts"] == 200 and row["logs_mb"] > 0 and row["history_mb"] > 0 and row["summary_mb"] > 0
    assert sorted(controller.kinds(200)).count("unreachable") == 2
