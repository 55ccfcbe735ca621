"""The settle step's pure part: when each GPU first went, and stayed, under the threshold."""

from __future__ import annotations

from fleet.node.probes.smi import GpuRow
from fleet.reset.settle import note_settled


def test_note_settled_tracks_first_time_under_and_forgets_a_relapse() -> None:
    settled: dict[int, float] = {}
    note_settled([GpuRow(0, 0), GpuRow(1, 900)], 16, 0.5, settled)
    assert settled == {0: 0.5}
    note_settled([GpuRow(0, 30000), GpuRow(1, 0)], 16, 1.0, settled)
    assert settled == {1: 1.0}
