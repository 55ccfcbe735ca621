"""What fleet does to a node's Slurm state around a reset: pure decisions, no I/O.

Before a host is touched (`admission`): a node in service is drained with fleet's reason for
this run; a node an earlier fleet run left drained after failing it, or left drained by a run
that is over (finished, or killed before its release: `fleet.runlog.folder.run_liveness`) is taken
over (adopted); any other node out of service (down, drained, failed, in maintenance, a reboot or power
action: `fleet.slurm.records.OUT_OF_SERVICE`) is someone else's, an admin's "bad DIMM" or a fleet run
still in flight: its host is skipped, and its state and reason are never changed.

After (`release`), while the node's reason is still this run's own: clean -> resume; untouched
(skipped: jobs still running, never started; unreachable: never connected; a drain Slurm may or may
not have applied) -> back exactly as it was; failed -> stays drained, and its reason says why. NHC's
rule: fleet only ever resumes a node whose reason it set itself. When fleet's drain is gone (a
slurmctld restart that lost it, someone who resumed the node), a node fleet proved clean, or never
touched, is left as Slurm shows it; one it failed, or could not prove clean, is drained again with
fleet's reason (`out_of_service`), keeping a reason someone else set. What Slurm shows is the only
truth: the release reads the node before each decision, so an update whose reply was lost is decided
again from what it left.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleet.inventory.messages import one_line
from fleet.model.report import HostStatus
from fleet.slurm.records import OUT_OF_SERVICE, SlurmNode
from fleet.text import terminal_safe

REASON_PREFIX = "fleet: run "
# Characters of a reason fleet sets (Slurm keeps longer ones; `sinfo -R` users read them).
REASON_LIMIT = 200
_FLEET_REASON = re.compile(r"^fleet: run (?P<run_id>\S+?)(?:: (?P<error>.*))?$")


def own_reason(run_id: str) -> str:
    """The reason fleet drains a node with while this run resets it."""
    return f"{REASON_PREFIX}{run_id}"


def failed_reason(run_id: str, error: str | None) -> str:
    """The reason a node keeps after this run failed it: `fleet: run <id>: <the one-line error>`."""
    reason = f"{own_reason(run_id)}: {terminal_safe(one_line(error or 'failed'))}"  # sinfo shows it to people as it is
    return reason if len(reason) <= REASON_LIMIT else reason[: REASON_LIMIT - 3] + "..."


def fleet_run_of(reason: str | None) -> tuple[str, str | None] | None:
    """(run id, error) of a reason fleet set; error is None while that run is in flight. None: not fleet's."""
    match = _FLEET_REASON.match(reason or "")
    return (match["run_id"], match["error"]) if match else None


class Admission(StrEnum):
    """What fleet does to a node before the reset."""

    DRAIN = "drain"  # in service: drained now with this run's reason, resumed when clean
    ADOPT = "adopt"  # left drained by an earlier fleet run that failed it: this run takes the drain over
    LEAVE = "leave"  # out of service by someone else: the host is skipped, the node's state and reason untouched


def admission(node: SlurmNode, earlier_over: bool = False) -> Admission:
    """`earlier_over`: the run named in a `fleet: run <id>` reason without an error part is known to be over
    (finished, or killed before its release): its drain is an orphan, taken over like a failed run's. A node that
    is also down, failed, in maintenance or anything else out of service is someone else's as well."""
    if node.in_service:
        return Admission.DRAIN
    earlier = fleet_run_of(node.reason)
    if node.flags & OUT_OF_SERVICE == {"DRAIN"} and node.base != "DOWN" and earlier is not None \
            and (earlier[1] is not None or earlier_over):
        return Admission.ADOPT
    return Admission.LEAVE


def whose(node: SlurmNode) -> str:
    """Why a node fleet leaves alone is not fleet's: `out of service by someone else`, or the run in flight."""
    run = in_flight_run(node)
    return f"drained by fleet run {run}, which may still be in flight" if run else "out of service by someone else"


def skipped(node: SlurmNode) -> str:
    """The error of a host whose node is someone else's (`Admission.LEAVE`): it is not reset."""
    return (f"slurm: {node.name} is {describe(node)}: {whose(node)}: not reset, its state and reason left as they"
            " are (reset it without --slurm once it is yours)")


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
    was = touched(status) if was_touched is None else was_touched
    if drained_for(now, run_id):
        if status is HostStatus.CLEAN:
            return Action(Release.RESUME, "clean")
        if not was:
            if how is Admission.ADOPT:
                return Action(Release.RESTORE, "never touched: drained again with its earlier reason", before.reason)
            return Action(Release.RESUME, "never touched: back in service as it was")
        return Action(Release.KEEP_DRAINED, "not clean: stays drained", failed_reason(run_id, error))
    if status is HostStatus.CLEAN or not was:
        return Action(Release.LEAVE, f"not drained for this run (now {describe(now)}): left as it is")
    return out_of_service(now, run_id, error, f"fleet's drain is gone (now {describe(now)})")


def out_of_service(now: SlurmNode, run_id: str, error: str | None, why: str) -> Action:
    """A node fleet failed, or could not prove clean, whose drain is not (or no longer) this run's: drained with
    fleet's reason whatever its base state (a down node comes back into service by itself with ReturnToService, a
    drained one never does), unless Slurm shows it drained already: for this run (a drain whose reply was lost:
    done), or by someone else (their reason kept). A reason someone else set on a node that is not drained (an
    admin's DOWN) is kept, fleet's after it (`drain_reason`)."""
    if now.draining_or_drained:
        earlier = fleet_run_of(now.reason)
        if earlier is not None and earlier[0] == run_id:
            return Action(Release.LEAVE, f"drained for this run ({describe(now)})")
        return Action(Release.LEAVE, f"drained by someone else during the run ({describe(now)}): left as it is")
    return Action(Release.KEEP_DRAINED, f"not clean: {why}: drained", drain_reason(now, run_id, error))


def drain_reason(now: SlurmNode | None, run_id: str, error: str | None) -> str:
    """fleet's reason for a node it keeps out of service; after the reason someone else set on it, kept whole when
    there is one (`bad DIMM; fleet: run <id>: <error>`): a node whose reason is not fleet's alone stays theirs to
    resume, and the next fleet run leaves it alone."""
    ours = failed_reason(run_id, error)
    theirs = now.reason if now is not None and now.reason and fleet_run_of(now.reason) is None else None
    if theirs is None:
        return ours
    reason = f"{theirs}; {ours}"
    return reason if len(reason) <= REASON_LIMIT else reason[: REASON_LIMIT - 3] + "..."


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
    return f"slurm {describe(node)}: {whose(node)}: would skip it, its state and reason left as they are"


def after_step(now: SlurmNode | None, run_id: str, status: HostStatus, error: str | None, touched: bool) -> Action:
    """`--via srun`: what to do to a node once the job step is over (the reservation, not a drain, kept jobs off).

    A node the step failed, or that may have been touched and sent no report, must stay out of service once the
    reservation is gone (`out_of_service`). Any other node goes back to service when fleet removes the
    reservation."""
    if status is HostStatus.CLEAN or not touched:
        return Action(Release.LEAVE, "clean" if status is HostStatus.CLEAN else "never touched")
    if now is None:
        return Action(Release.LEAVE, "Slurm no longer shows the node")
    return out_of_service(now, run_id, error, f"Slurm shows {now.state}")


def drains(actions: Mapping[str, Action]) -> dict[str, list[str]]:
    """The `scontrol update ... State=DRAIN` to send: reason -> the nodes it is for (nodes failed the same way
    share one update)."""
    reasons: dict[str, list[str]] = {}
    for name, action in actions.items():
        if action.what is Release.KEEP_DRAINED and action.reason is not None:
            reasons.setdefault(action.reason, []).append(name)
    return reasons
