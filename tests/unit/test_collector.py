"""The collector's pace: what it scans again during the hosts' part of a run, and while the report is built."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from fleet.app.collector import YOUNG_OBJECTS, heap_frozen, paced_collection


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


def cycles(count: int) -> list[Node]:
    return [Node() for _ in range(count)]


def test_a_full_collection_sets_aside_what_it_kept_and_all_is_given_back_after() -> None:
    with paced_collection():
        kept = cycles(1000)
        gc.collect()
        assert gc.get_freeze_count() >= len(kept)  # the next full collection scans only what is new
    assert gc.get_freeze_count() == 0
    del kept


def test_cyclic_garbage_set_aside_is_freed_once_the_heap_has_doubled() -> None:
    """A cycle that dies after it was set aside waits; once the frozen objects have doubled since all were last
    scanned, they are given back and the next full collection frees it."""
    with paced_collection():
        gc.collect()  # everything scanned, and set aside: the base
        base = gc.get_freeze_count()
        doomed = Node()
        gone = weakref.ref(doomed)
        gc.collect()  # now set aside too
        del doomed
        gc.collect()
        assert gone() is not None  # frozen: waits
        grown = cycles(2 * base + 1)
        gc.collect()  # the frozen objects have doubled: given back
        gc.collect()  # scans them all
        assert gone() is None
        del grown
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("part", [paced_collection, heap_frozen], ids=["the hosts' part", "the report's part"])
def test_young_objects_are_collected_less_often_during_a_run_only(part: Callable[[], AbstractContextManager[None]]
                                                                  ) -> None:
    before = gc.get_threshold()
    with part():
        assert gc.get_threshold() == (YOUNG_OBJECTS, *before[1:])
        doomed = Node()
        gone = weakref.ref(doomed)
        del doomed
        gc.collect(0)  # a young collection still frees a young cycle
        assert gone() is None
    assert gc.get_threshold() == before


def test_an_error_in_the_hosts_part_still_gives_everything_back() -> None:
    callbacks, thresholds = list(gc.callbacks), gc.get_threshold()
    def failing_hosts() -> None:
        with paced_collection():
            gc.collect()
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        failing_hosts()
    assert gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks  # the pacer is gone with it
    assert gc.get_threshold() == thresholds
