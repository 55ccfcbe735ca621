"""The run's objects kept out of the collector's full scans while the report is built, and given back after."""

from __future__ import annotations

import gc
import weakref

import pytest

from fleet.engine.run import heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_what_lives_while_the_report_is_built_is_collected_after_it() -> None:
    cycle = Node()
    gone = weakref.ref(cycle)
    with heap_frozen():
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert gone() is not None  # frozen: not scanned, so not freed yet
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_an_error_while_reporting_still_gives_the_objects_back() -> None:
    with pytest.raises(OSError, match="disk full"), heap_frozen():
        raise OSError("disk full")
    assert gc.get_freeze_count() == 0
