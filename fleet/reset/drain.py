"""drain: stop the host's serving units gracefully; SIGKILL a unit only when its stop hangs.

Asks the node: a `systemctl show` of each unit in `services` (was it up: the units it stops), `systemctl stop
--no-block` of each and a first `systemctl show` of each again, all in one command (a batch, `Node.batch`), then
`systemctl show` of the units still up until each is inactive or failed
(backoff, within `drain_timeout`; one command a round); for a unit still up,
`systemctl kill --signal=SIGKILL` and another wait of ESCALATION_WINDOW_S. Decides: a unit is down when inactive or
failed. Reports: each unit's last state; fails when one is still up.
kill uses `stop_units` too, for the units of holders that respawn (`--stop-units`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.inventory.host import Host
from fleet.model.report import Reason, StepName, StepOutcome, StepResult, StepStatus
from fleet.node.bounds import commands_s
from fleet.node.budget import Room, TimeBudget
from fleet.node.node import Node
from fleet.node.poll import backoff, poll_until
from fleet.node.probes import units

# Seconds to wait for a unit to go down after `systemctl kill -s SIGKILL`.
ESCALATION_WINDOW_S = 10.0
# Commands past each window: the poll that sees it end.
POLL_COMMANDS = 1


def stop_room(host: Host, window: float) -> Room:
    """A stop's wait for the units to go down, and the poll that sees it end."""
    return Room(window, commands_s(host, other=POLL_COMMANDS))


def escalation_room(host: Host) -> Room:
    """The wait after SIGKILL for a unit whose stop hung, and the poll that sees it end."""
    return Room(ESCALATION_WINDOW_S, commands_s(host, other=POLL_COMMANDS))


def longest_stop_s(host: Host, window: float) -> float:
    """The longest stopping units can take: the stop's wait, then the escalation's."""
    return stop_room(host, window).seconds + escalation_room(host).seconds


@dataclass(frozen=True)
class UnitsStopped:
    """What stopping units came to: one line of detail, an error when one is still up, and the units that were up
    when the stop began and are down now."""

    detail: str
    error: str | None = None
    stopped: tuple[str, ...] = ()


async def drain(node: Node) -> StepOutcome:
    """Stop every unit in `services` gracefully; escalate to SIGKILL only when the stop hangs."""
    started, services = time.monotonic(), node.host.services
    if not services:
        return StepOutcome(result=StepResult.since(StepName.DRAIN, started, "no services to stop"))
    stopped = await stop_units(node, services, node.host.drain_timeout)
    status = StepStatus.FAILED if stopped.error else StepStatus.OK
    reason = Reason.DRAIN_FAILED if stopped.error else None
    return StepOutcome(result=StepResult.since(StepName.DRAIN, started, stopped.detail, status, stopped.error, reason),
                       stopped=stopped.stopped)


async def stop_units(node: Node, names: Sequence[str], window: float,
                     step: StepName = StepName.DRAIN) -> UnitsStopped:
    """Stop units gracefully, polling up to `window` s; SIGKILL only those whose stop hangs."""
    budget = stop_room(node.host, window).start()
    before = [units.unit_state_before_stop(unit) for unit in names]
    stops = [units.unit_stop(unit) for unit in names]
    shows = [units.unit_state(unit) for unit in names]
    answers = await node.batch([*before, *stops, *shows], step=step, budget=budget)
    for stop in stops:  # an exit other than 0 or 5 (e.g. polkit: "Interactive authentication required.") fails
        answers.result(stop)
    up = [unit for unit, show in zip(names, before, strict=True) if not answers.read(show).is_down]
    first = {unit: answers.read(show) for unit, show in zip(names, shows, strict=True)}
    missing = [unit for unit, state in first.items() if state.missing]
    states = await _wait_down(node, names, budget, step, first)
    hung = [u for u in names if not states[u].is_down]
    if not hung:
        stopped = UnitsStopped(describe_units(states))
    else:
        node.log.warning("drain_escalate", step=str(step), units=hung, after_s=round(budget.elapsed, 3))
        stopped = await _escalate(node, hung, states, window, step)
    error = stopped.error or (no_such_unit(missing, node.host.name) if missing else None)
    return UnitsStopped(stopped.detail, error, tuple(unit for unit in up if states[unit].is_down))


def no_such_unit(missing: Sequence[str], host: str) -> str:
    """A unit in `services` the node does not have: a typo leaves the real service running, unstopped."""
    names = ", ".join(missing)
    return (f"{names}: no such unit on {host} (LoadState=not-found): a typo in services? the service that holds"
            " the GPUs was not stopped")


async def unit_states(node: Node, names: Sequence[str], budget: TimeBudget,
                      step: StepName = StepName.DRAIN) -> dict[str, units.UnitState]:
    """Each unit's ActiveState, SubState and MainPID, in one command (the dry run reads them too)."""
    shows = {unit: units.unit_state(unit) for unit in names}
    answers = await node.batch(list(shows.values()), step=step, budget=budget)
    return {unit: answers.read(probe) for unit, probe in shows.items()}


async def _wait_down(node: Node, names: Sequence[str], budget: TimeBudget, step: StepName,
                     states: dict[str, units.UnitState] | None = None) -> dict[str, units.UnitState]:
    """Poll until every unit is inactive or failed, or the budget is spent; return the last states
    (`states`: a first look already taken)."""
    states = states if states is not None else await unit_states(node, names, budget, step)

    async def look() -> dict[str, units.UnitState]:
        states.update(await unit_states(node, [u for u in names if not states[u].is_down], budget, step))
        return states

    polled = await poll_until(look, lambda seen: all(seen[u].is_down for u in names), backoff(), within=budget,
                              first=states)
    return polled.last


async def _escalate(node: Node, hung: Sequence[str], states: dict[str, units.UnitState], window: float,
                    step: StepName) -> UnitsStopped:
    """`systemctl kill --signal=SIGKILL` the hung units, then poll them for ESCALATION_WINDOW_S."""
    escalation = escalation_room(node.host).start()
    kills = [units.unit_kill(unit) for unit in hung]
    answers = await node.batch(kills, step=step, budget=escalation)
    for probe in kills:
        answers.result(probe)
    states.update(await _wait_down(node, hung, escalation, step))
    detail = f"{', '.join(hung)} did not stop within {window:g} s: SIGKILLed; " + describe_units(states)
    still = [u for u in hung if not states[u].is_down]
    if still:
        return UnitsStopped(detail, f"{still[0]} still {states[still[0]].active_state} after SIGKILL")
    return UnitsStopped(detail)


def describe_units(states: Mapping[str, units.UnitState]) -> str:
    return ", ".join(f"{unit} {state.label}" for unit, state in states.items())
