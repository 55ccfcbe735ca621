"""Time to a verdict: the longest a host can take, phase by phase, and for each way a host goes wrong.

Pure: every figure is a sum of the host's variables and the steps' own constants, read off the same rooms the
steps start their budgets from (`fleet.node.budget.Room`), so a budget and its figure here cannot drift apart.

Two figures a phase (`Phase`): `longest_s`, every command at its bound and every window waited out (what the lock
and `--via srun`'s step must outlast); and `worst_s`, the longest a host that goes wrong in one way (`WAYS`) takes
to its verdict, counted from its start, when that way holds it in this phase: what the progress line counts on for a
host past the typical duration. `ways` gives docs/operating.md's table ("Time to a verdict"): each way with its
formula of the host variables and its seconds. A way's seconds are the waits it costs; the rest of the reset goes
at the node's own pace (a healthy node answers each command in well under a second).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.inventory.host import Host
from fleet.model.report import Reason, StepName
from fleet.node.bounds import SMI_FACTOR
from fleet.node.poll import POLL_CAP_S
from fleet.reset import baselines, drain, kill, lock, plan, restore, settle, verify
from fleet.transport import liveness

# The phase before the first step (connecting; for a reset, taking the lock), as the progress line names it.
CONNECT = "connect"
# Seconds a poll may pause past a window's end before it looks for the last time (the backoff's cap).
LAST_PAUSE_S = POLL_CAP_S
# Seconds of the respawn scans after the kill's waits.
RESPAWN_S = sum(kill.RESPAWN_SCANS_S)


@dataclass(frozen=True, kw_only=True)
class Way:
    """One way a host goes wrong: what it is, the verdict it ends with, where it holds the host, and the longest it
    takes to that verdict as a formula of the host variables (`formula`) and in seconds for a host (`seconds`)."""

    name: str
    verdict: str
    phases: tuple[str, ...]  # the phases it can hold a host in
    formula: str  # `x` is times; every name is a host variable
    seconds: Callable[[Host], float]
    counted_from: str = "the host's start"
    option: str | None = None  # a run option that makes this way cost more (`--stop-units`, `--gpu-reset`)
    option_formula: str = ""  # what it adds, as `formula`
    option_seconds: Callable[[Host], float] = lambda h: 0.0

    def cost(self, host: Host, options: frozenset[str] = frozenset()) -> float:
        """Its seconds on this host, with what the run's options add."""
        return self.seconds(host) + (self.option_seconds(host) if self.option in options else 0.0)


def _silence_s(host: Host) -> float:
    """From the moment a session stops answering: until a keepalive request is sent (a wait's first after
    PROBE_AFTER_S, the next one PROBE_EVERY_S after the last was answered), its silence bound, and the look that
    sees the bound passed (every PROBE_EVERY_S)."""
    return _FIRST_ASK_S + liveness.silence_s(host.connect_timeout) + liveness.PROBE_EVERY_S


_FIRST_ASK_S = max(liveness.PROBE_AFTER_S, liveness.PROBE_EVERY_S)


_STEPS = tuple(s.value for s in StepName)
WAYS: tuple[Way, ...] = (
    Way(name="nothing answers the connection (a host down, a port filtered, a handshake that stalls)",
        verdict=f"unreachable, {Reason.CONNECT_TIMEOUT}", phases=(CONNECT,),
        formula="2 x connect_timeout", seconds=lambda h: 2 * h.connect_timeout),
    Way(name="another run holds the node's lock", verdict=f"failed, {Reason.LOCKED}", phases=(CONNECT,),
        formula=f"{lock.LOCK_WAIT_S:g}", seconds=lambda h: lock.LOCK_WAIT_S),
    Way(name="the driver is wedged (nvidia-smi never answers)", verdict=f"failed, {Reason.COMMAND_TIMEOUT}",
        phases=(StepName.DRAIN.value, StepName.SETTLE.value, StepName.VERIFY.value),
        formula=f"{SMI_FACTOR} x command_timeout", seconds=lambda h: SMI_FACTOR * h.command_timeout),
    Way(name="a unit's stop hangs (its process ignores SIGTERM)",
        verdict="clean, once SIGKILL has ended it",
        phases=(StepName.DRAIN.value,),
        formula=f"drain_timeout + {drain.ESCALATION_WINDOW_S:g}",
        seconds=lambda h: h.drain_timeout + drain.ESCALATION_WINDOW_S if h.services else 0.0),
    Way(name="a holder respawns (Restart=always)", verdict=f"failed, {Reason.RESPAWNED}", phases=(StepName.KILL.value,),
        formula=f"kill_grace + {kill.SIGKILL_WAIT_S:g} + {RESPAWN_S:g}",
        seconds=lambda h: h.kill_grace + kill.SIGKILL_WAIT_S + RESPAWN_S,
        option="--stop-units",
        option_formula=f"drain_timeout + {drain.ESCALATION_WINDOW_S:g} + kill_grace + {kill.SIGKILL_WAIT_S:g} + "
                       f"{RESPAWN_S:g}",
        option_seconds=lambda h: h.drain_timeout + drain.ESCALATION_WINDOW_S + h.kill_grace + kill.SIGKILL_WAIT_S
        + RESPAWN_S),
    Way(name="GPU memory never comes back", verdict=f"failed, {Reason.MEMORY_LEAKED} or {Reason.MEMORY_HELD}",
        phases=(StepName.SETTLE.value,), formula=f"settle_timeout + {LAST_PAUSE_S:g}",
        seconds=lambda h: h.settle_timeout + LAST_PAUSE_S,
        option="--gpu-reset", option_formula=f"gpu_reset_timeout + settle_timeout + {LAST_PAUSE_S:g}",
        option_seconds=lambda h: h.gpu_reset_timeout + h.settle_timeout + LAST_PAUSE_S),
    Way(name="the session goes silent (TCP up, nothing answers)", verdict=f"failed, {Reason.SILENT_SESSION}",
        phases=(CONNECT, *_STEPS),
        formula=f"{_FIRST_ASK_S:g} + max({liveness.SILENCE_MIN_S:g}, connect_timeout) + {liveness.PROBE_EVERY_S:g}",
        seconds=_silence_s, counted_from="the moment it stops answering"),
)


@dataclass(frozen=True)
class Phase:
    """A phase of a host's way (`connect`, or a step), with the longest it can take (`longest_s`) and the longest a
    host held in it by one way of going wrong takes to its verdict from its start (`worst_s`)."""

    name: str
    longest_s: float
    worst_s: float


def reset_phases(host: Host, *, stop_units: bool = False, gpu_reset: bool = False,
                 restore_settings: bool = False) -> tuple[Phase, ...]:
    """A reset's phases on this host: connect and take the lock, the baselines and drain, kill, settle, verify."""
    settle_s = settle.longest_s(host, gpu_reset=gpu_reset)
    settle_s += restore.longest_s(host) if restore_settings else 0.0
    longest = {
        CONNECT: connect_s(host) + lock.longest_take_s(host),
        StepName.DRAIN.value: baselines.longest_s(host) + (drain.longest_stop_s(host, host.drain_timeout)
                                                           if host.services else 0.0),
        StepName.KILL.value: kill.longest_s(host, stop_units=stop_units),
        StepName.SETTLE.value: settle_s,
        StepName.VERIFY.value: verify.room(host).seconds,
    }
    options = frozenset({*(["--stop-units"] if stop_units else []), *(["--gpu-reset"] if gpu_reset else [])})
    return _phases(host, longest, options)


def check_phases(host: Host) -> tuple[Phase, ...]:
    """A check's phases: connect, verify."""
    return _phases(host, {CONNECT: connect_s(host), StepName.VERIFY.value: verify.room(host).seconds})


def plan_phases(host: Host, *, restore_settings: bool = False) -> tuple[Phase, ...]:
    """A dry run's phases: connect, the survey (shown as drain) and the settings it would restore."""
    survey = plan.survey_room(host).seconds + (restore.longest_s(host, planned=True) if restore_settings else 0.0)
    return _phases(host, {CONNECT: connect_s(host), StepName.DRAIN.value: survey})


def connect_s(host: Host) -> float:
    """The longest connecting can take: the name's lookup, then the handshake (or a jump host's, then the host's),
    each within `connect_timeout`."""
    return 2 * host.connect_timeout


def held_s(host: Host, *, stop_units: bool = False, gpu_reset: bool = False, restore_settings: bool = False) -> float:
    """The longest a reset can hold the node's lock: every phase after it is taken at its longest."""
    phases = reset_phases(host, stop_units=stop_units, gpu_reset=gpu_reset, restore_settings=restore_settings)
    return sum(p.longest_s for p in phases if p.name != CONNECT)


def walk_s(host: Host, *, stop_units: bool = False, gpu_reset: bool = False, restore_settings: bool = False) -> float:
    """The longest one node's reset can take once connected: taking the lock, then all it holds (what `--via
    srun`'s step runs on the node itself)."""
    return lock.longest_take_s(host) + held_s(host, stop_units=stop_units, gpu_reset=gpu_reset,
                                              restore_settings=restore_settings)


def ways(host: Host, options: frozenset[str] = frozenset()) -> tuple[tuple[Way, float], ...]:
    """Each way a host goes wrong, with its seconds on this host under the run's options (`--stop-units`,
    `--gpu-reset`); a way this host cannot go wrong (no services: no stop to hang) is left out."""
    return tuple((way, s) for way in WAYS if (s := way.cost(host, options)) > 0)


def _phases(host: Host, longest: dict[str, float], options: frozenset[str] = frozenset()) -> tuple[Phase, ...]:
    found = ways(host, options)
    return tuple(Phase(name, seconds, max((s for way, s in found if name in way.phases), default=0.0))
                 for name, seconds in longest.items())
