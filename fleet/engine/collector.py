"""The garbage collector's pace during a run: what it scans again, and when (`gc.freeze`).

A run's heap grows with every host it ends (its report, its records: about 60 KB a host), and CPython runs a
full collection each time the objects that survived the last one have grown by a quarter: each scans the whole
heap again, so a run of 10,000 hosts spent 4.9 s of its 72 s in 15 full collections, 0.5 ms a host.

`paced_collection` (the hosts' part of a run) sizes the young generations for a heap that holds every host in
flight: a host's objects (its coroutines, connection, records) live as long as its reset, seconds and many turns
of the loop, so CPython's young collection every 700 new objects scanned each of them again and again, in vain
(10,000 hosts: 3,756 young and 341 middle collections, 4.9 s of CPU). During the hosts' part the youngest
generation is collected every 50,000 new objects and the middle one every 20 of those: 46 and 1 at 10,000 hosts,
the collector's CPU 1.03 -> 0.16 ms a host (all generations, one pair of runs), peak RSS the same (713 against 711
MB). Garbage in a cycle among young objects waits at most 50,000 allocations (a few MB). The thresholds in force
before are put back after.

After each full collection the objects it kept are set aside
(frozen), so the next one scans only what was made since. A frozen object that later becomes garbage held in a
cycle waits; once the frozen objects have doubled since they were last all scanned, they are given back and the
next full collection scans them all once more. Every object is still scanned, each a few times at most (a
geometric series: twice the final heap, where the quarter rule scans it about five times), and cyclic garbage
waits at most one doubling of the heap. `heap_frozen` (the report's part): everything set aside while the report
is built, and given back after.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

OLDEST = 2  # CPython's oldest generation: a collection of it is a full one
YOUNG_EVERY = 50_000  # new objects between two collections of the youngest generation (CPython: 700)
MIDDLE_EVERY = 20  # young collections between two of the middle generation (CPython: 10)


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
    """Young collections sized for hosts in flight, full collections that scan what is new, and everything again
    only once the heap has doubled; the thresholds before put back, and every object given back to the collector,
    after."""
    pacer = _Pacer()
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_EVERY, MIDDLE_EVERY, before[OLDEST])
    gc.callbacks.append(pacer)
    try:
        yield
    finally:
        gc.callbacks.remove(pacer)
        gc.set_threshold(*before)
        gc.unfreeze()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """The objects alive now (every host's report and records: 160,000 at 2,000 hosts) kept out of the
    garbage collector's full collections while the report is built, and given back to it after (`gc.freeze`):
    building summary.json and the page allocates much and made the collector scan them all again (about a
    fifth of a millisecond a host). Nothing is left uncollected: they only wait for the next full collection."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
