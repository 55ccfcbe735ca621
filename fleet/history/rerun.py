"""`--rerun-failed [RUN_ID|last]`: which past run it means, and what to do with it.

`last` is the newest reset that was not a dry run: a dry run or a check reset nothing, so nothing of theirs can
be rerun, and a named one is refused (exit 2) with one line saying what it was. "Nothing to rerun" (exit 0) is
said only when every target of that reset is on record as `clean`; any other host (failed, unreachable,
skipped, cut short, or never recorded by a run that died) is rerun, and the line says how each ended.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fleet.history import History, RunKind, RunRecord, not_clean, run_kind
from fleet.history.view import counts_text
from fleet.inventory.nodesets import fold
from fleet.model.errors import UsageError

NOT_RECORDED = "not recorded"  # a target with no outcome on record: its run died (or is still going)
_WHAT = {RunKind.DRY_RUN: "a dry run (fleet reset --dry-run)", RunKind.CHECK: "a check (fleet check)",
         RunKind.DEMO: "the demo (fleet demo: simulated nodes)"}


@dataclass(frozen=True, kw_only=True)
class Rerun:
    """What `--rerun-failed` does with a past run: reset `hosts` again (`exit_code` None), or stop at once
    with `exit_code`. `line` is for stderr either way (after `fleet: `; with exit 2, the usage error)."""

    run_id: str
    hosts: tuple[str, ...]
    line: str
    exit_code: int | None = None


def rerun_of(history: History | None, given: str, path: Path) -> Rerun:
    """The rerun `--rerun-failed given` asks for, from the history at `path` (None: there is none)."""
    return decide(find_run(history, given, path))


def find_run(history: History | None, given: str, path: Path) -> RunRecord:
    """The run `given` names (`last`: the newest reset that was not a dry run); a usage error when none."""
    run_id = (history.last_reset_id() if history else None) if given == "last" else given
    record = history.get(run_id) if history is not None and run_id else None
    if record is not None:
        return record
    if given != "last":
        raise UsageError(f"--rerun-failed: no run {given!r} on record in {path}")
    if history is not None and history.last_run_id() is not None:
        raise UsageError(f"--rerun-failed: no reset on record in {path}, only dry runs, checks and demos (they"
                         " reset nothing real, so nothing of theirs is rerun)")
    raise UsageError(f"--rerun-failed: no run on record in {path}")


def decide(record: RunRecord) -> Rerun:
    """Pure: refuse a dry run or a check (exit 2), say there is nothing to rerun only when every target ended
    clean (exit 0), else rerun the others, saying how each ended."""
    run_id = record.run.run_id
    kind = run_kind(record.run)
    if kind is not RunKind.RESET:
        return Rerun(run_id=run_id, hosts=(), exit_code=2,
                     line=f"--rerun-failed: run {run_id} was {_WHAT[kind]}, not a reset: it reset nothing;"
                     " name a reset's run id, or `last` for the newest reset")
    names = not_clean(record)
    if not names:
        return Rerun(run_id=run_id, hosts=(), line=f"nothing to rerun: every host of run {run_id} ended clean",
                     exit_code=0)
    ended = {h.host: h.status for h in record.hosts}
    how = counts_text(Counter(ended.get(name, NOT_RECORDED) for name in names))
    plural = "s" if len(names) > 1 else ""
    return Rerun(run_id=run_id, hosts=tuple(names),
                 line=f"rerunning {len(names)} host{plural} of run {run_id}: {fold(names)} ({how})")
