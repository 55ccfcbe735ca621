"""The garbage collector's pace during a run: what it scans again, and when (`gc.freeze`).

A run's heap grows with every host it ends (its report, its records: about 60 KB a host), and CPython runs a
full collection each time the objects that survived the last one have grown by a quarter: each scans the whole
heap again, so a run of 10,000 hosts spent 4.9 s of its 72 s in 15 full collections, 0.5 ms a host.

`paced_collection` (the hosts' part of a run): after each full collection the objects it kept are set aside
(frozen), so the next one scans only what was made since. A frozen object that later becomes garbage held in a
cycle waits; once the frozen objects have doubled since they were last all scanned, they are given back and the
next full collection scans them all once more. Every object is still scanned, each a few times at most (a
geometric series: twice the final heap, where the quarter rule scans it about five times), and cyclic garbage
waits at most one doubling of the heap. `heap_frozen` (the report's part): everything set aside while the report
is built, and given back after.

`paced_collection` also collects the young objects less often. CPython looks for cycles among them each time 700
more have been made than freed, and a run's hosts keep many alive across each turn of the loop (their coroutines,
their steps' records): each of those collections scanned objects still in use and moved them on to the next
generation, whose collections scanned them again (0.47 ms a host of 4.9 in all collections, measured at 3,000
hosts; 0.18 ms so). Every YOUNG_OBJECTS instead: most of a host's short-lived objects are freed (by their count of
references) before a collection comes, and one held in a cycle waits at most that many allocations (200,000: a
few tens of MB at most, beside a run's 650 MB at 10,000 hosts; at 50,000 the collector scanned the hosts' live
objects four times as often, for about 1.5% of the run's CPU). `heap_frozen` does the same while the report is
built. The application shell (`fleet.app.run`) paces the collector so for a run of the command line; the core
(`fleet.engine.run.run`) leaves a library caller's collector alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

OLDEST = 2  # CPython's oldest generation: a collection of it is a full one
# Objects made (and not yet freed) between two collections of the youngest generation during a run (CPython's: 700).
YOUNG_OBJECTS = 200_000


class _Pacer:
    """The collector's callback: after a full collection, freeze what it kept, or (once the frozen objects have
    doubled since all were scanned) give them back to the next one."""

    def __init__(self) -> None:
        self.scanned = 0  # objects frozen right after the last full collection that scanned them all
        self.all_scanned = True  # the last full collection scanned every object (nothing was frozen)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != OLDEST:
            return
        gc.freeze()
        frozen = gc.get_freeze_count()
        if self.all_scanned:
            self.scanned, self.all_scanned = frozen, False
        elif frozen > 2 * self.scanned:
            gc.unfreeze()  # the next full collection scans everything: cycles among them are freed
            self.all_scanned = True


@contextmanager
def paced_collection() -> Iterator[None]:
    """Young collections every YOUNG_OBJECTS; full collections that scan what is new, and everything again only
    once the heap has doubled; after, the collector as it was, every object given back to it."""
    pacer = _Pacer()
    gc.callbacks.append(pacer)
    try:
        with _young_less_often():
            yield
    finally:
        gc.callbacks.remove(pacer)
        gc.unfreeze()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """The objects alive now (every host's report and records: 160,000 at 2,000 hosts) kept out of the
    garbage collector's full collections while the report is built, and given back to it after (`gc.freeze`):
    building summary.json and the page allocates much and made the collector scan them all again (about a
    fifth of a millisecond a host). Nothing is left uncollected: they only wait for the next full collection. The
    young objects collected every YOUNG_OBJECTS, as during the hosts' part."""
    gc.freeze()
    try:
        with _young_less_often():
            yield
    finally:
        gc.unfreeze()


@contextmanager
def _young_less_often() -> Iterator[None]:
    """The youngest generation collected every YOUNG_OBJECTS for the block; the thresholds as they were after."""
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
