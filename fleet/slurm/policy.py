"""What fleet does to a node's Slurm state around a reset: pure decisions, no I/O.

Before a host is touched (`admission`): a node in service is drained with fleet's reason for
this run; a node an earlier fleet run left drained after failing it, or left drained by a run
that is over (finished, or killed before its release: `fleet.engine.run_folder.run_liveness`) is taken
over (adopted); any other drained or down node is left exactly as it is (its reason is someone
else's: an admin's "bad DIMM", or a fleet run still in flight).

After (`release`), only while the node's reason is still this run's own: clean ->
resume; untouched (skipped: jobs still running, never started; unreachable: never
connected; a drain Slurm may or may not have applied) -> back exactly as it was; failed ->
stays drained, and its reason says why. NHC's rule: fleet only ever resumes a node whose
reason it set itself. What Slurm shows is the only truth: the release reads the node before
each decision, so an update whose reply was lost is decided again from what it left.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleet.inventory.messages import one_line
from fleet.model.report import HostStatus
from fleet.slurm.records import SlurmNode
from fleet.text import shown

REASON_PREFIX = "fleet: run "
# Characters of a reason fleet sets (Slurm keeps longer ones; `sinfo -R` users read them).
REASON_LIMIT = 200
_FLEET_REASON = re.compile(r"^fleet: run (?P<run_id>\S+?)(?:: (?P<error>.*))?$")


def own_reason(run_id: str) -> str:
    """The reason fleet drains a node with while this run resets it."""
    return f"{REASON_PREFIX}{run_id}"


def failed_reason(run_id: str, error: str | None) -> str:
    """The reason a node keeps after this run failed it: `fleet: run <id>: <the one-line error>`."""
    reason = f"{own_reason(run_id)}: {shown(one_line(error or 'failed'))}"  # sinfo shows it to people as it is
    return reason if len(reason) <= REASON_LIMIT else reason[: REASON_LIMIT - 3] + "..."


def fleet_run_of(reason: str | None) -> tuple[str, str | None] | None:
    """(run id, error) of a reason fleet set; error is None while that run is in flight. None: not fleet's."""
    match = _FLEET_REASON.match(reason or "")
    return (match["run_id"], match["error"]) if match else None


class Admission(StrEnum):
    """What fleet does to a node before the reset."""

    DRAIN = "drain"  # in service: drained now with this run's reason, resumed when clean
    ADOPT = "adopt"  # left drained by an earlier fleet run that failed it: this run takes the drain over
    LEAVE = "leave"  # drained or down for another reason: never resumed, its reason never rewritten


def admission(node: SlurmNode, earlier_over: bool = False) -> Admission:
    """`earlier_over`: the run named in a `fleet: run <id>` reason without an error part is known to be over
    (finished, or killed before its release): its drain is an orphan, taken over like a failed run's."""
    if node.in_service:
        return Admission.DRAIN
    earlier = fleet_run_of(node.reason)
    if node.draining_or_drained and node.base != "DOWN" and earlier is not None \
            and (earlier[1] is not None or earlier_over):
        return Admission.ADOPT
    return Admission.LEAVE


def in_flight_run(node: SlurmNode) -> str | None:
    """The run id of a `fleet: run <id>` reason without an error part: a run in flight, or one that died
    before its release (whether it is over is not Slurm's to say)."""
    earlier = fleet_run_of(node.reason)
    return earlier[0] if earlier is not None and earlier[1] is None else None


def drained_for(node: SlurmNode | None, run_id: str) -> bool:
    """The node is drained (or draining) with this run's own reason: fleet's to give back."""
    return node is not None and node.draining_or_drained and node.reason == own_reason(run_id)


class Release(StrEnum):
    """What fleet does to a node after the reset."""

    RESUME = "resume"  # State=RESUME
    RESTORE = "restore"  # State=DRAIN with the reason it had before (an adopted node fleet never touched)
    KEEP_DRAINED = "keep_drained"  # State=DRAIN with `fleet: run <id>: <error>`
    LEAVE = "leave"  # nothing


@dataclass(frozen=True)
class Action:
    what: Release
    why: str
    reason: str | None = None  # the reason to set, for RESTORE and KEEP_DRAINED


def touched(status: HostStatus, started: bool = True) -> bool:
    """Whether the reset did anything to the node: skipped and unreachable hosts were never touched, nor was a
    host that never started (failed at its admission: Slurm unreadable, a drain refused)."""
    return started and status in (HostStatus.CLEAN, HostStatus.FAILED)


def release(how: Admission, before: SlurmNode, now: SlurmNode | None, run_id: str, status: HostStatus,
            error: str | None, *, was_touched: bool | None = None) -> Action:
    """What to do to the node now that its host ended with `status`, seeing it as `now`. `was_touched`
    (default: from the status) says whether the reset did anything to the node."""
    if how is Admission.LEAVE:
        return Action(Release.LEAVE, f"it was {describe(before)} before the run: left as it is")
    if now is None:
        return Action(Release.LEAVE, "Slurm no longer shows the node")
    if not drained_for(now, run_id):
        return Action(Release.LEAVE, f"not drained for this run (now {describe(now)}): left as it is")
    if status is HostStatus.CLEAN:
        return Action(Release.RESUME, "clean")
    if not (touched(status) if was_touched is None else was_touched):
        if how is Admission.ADOPT:
            return Action(Release.RESTORE, "never touched: drained again with its earlier reason", before.reason)
        return Action(Release.RESUME, "never touched: back in service as it was")
    return Action(Release.KEEP_DRAINED, "not clean: stays drained", failed_reason(run_id, error))


def describe(node: SlurmNode) -> str:
    """`IDLE`, `IDLE+DRAIN (bad DIMM, by root)`."""
    if node.reason is None:
        return node.state
    by = f", by {node.reason_by}" if node.reason_by else ""
    return f"{node.state} ({node.reason}{by})"


def plan_line(node: SlurmNode, jobs: tuple[str, ...], drain_wait_s: float) -> str:
    """Dry run: what a reset would do to the node in Slurm."""
    how = admission(node)
    waits = f", wait up to {drain_wait_s:g} s for job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}" if jobs else ""
    if how is Admission.DRAIN:
        return f"slurm {describe(node)}: would drain{waits}, reset, resume if clean, else keep it drained"
    if how is Admission.ADOPT:
        return f"slurm {describe(node)}: would take over fleet's earlier drain{waits}, reset, resume if clean"
    return f"slurm {describe(node)}: drained or down for another reason: would{waits[1:] + ',' if jobs else ''}" \
        " reset, never resume, reason untouched"


def after_step(now: SlurmNode | None, run_id: str, status: HostStatus, error: str | None, touched: bool) -> Action:
    """`--via srun`: what to do to a node once the job step is over (the reservation, not a drain, kept jobs off).

    A node the step failed after it began working must stay out of service once the reservation is gone: it is
    drained with fleet's reason whatever Slurm's base state (`DOWN`, `NOT_RESPONDING`, `FAIL`: a down node comes
    back into service by itself with ReturnToService, a drained one never does), unless Slurm already shows it
    drained, for this run (done: a drain whose reply was lost) or by someone else meanwhile (their reason is
    kept). Any other node goes back to service when fleet removes the reservation."""
    if status is HostStatus.CLEAN or not touched:
        return Action(Release.LEAVE, "clean" if status is HostStatus.CLEAN else "never touched")
    if now is None:
        return Action(Release.LEAVE, "Slurm no longer shows the node")
    if now.draining_or_drained:
        earlier = fleet_run_of(now.reason)
        if earlier is not None and earlier[0] == run_id:
            return Action(Release.LEAVE, f"drained for this run ({describe(now)})")
        return Action(Release.LEAVE, f"drained by someone else during the run ({describe(now)}): left as it is")
    return Action(Release.KEEP_DRAINED, f"not clean: drained (Slurm shows {now.state})", failed_reason(run_id, error))


def drains(actions: Mapping[str, Action]) -> dict[str, list[str]]:
    """The `scontrol update ... State=DRAIN` to send: reason -> the nodes it is for (nodes failed the same way
    share one update)."""
    reasons: dict[str, list[str]] = {}
    for name, action in actions.items():
        if action.what is Release.KEEP_DRAINED and action.reason is not None:
            reasons.setdefault(action.reason, []).append(name)
    return reasons
