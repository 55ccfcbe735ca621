"""Time to a verdict (fleet.reset.verdict_time): pure sums of a host's variables, each way's formula its seconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet.inventory.host import Host
from fleet.reset import baselines, drain, kill, remedy, restore, settle, verdict_time, verify
from fleet.reset.verdict_time import CONNECT, WAYS

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = ("connect_timeout", "command_timeout", "drain_timeout", "kill_grace", "settle_timeout",
             "gpu_reset_timeout")


def host(**kw: object) -> Host:
    base: dict[str, object] = {"services": ("sglang.service",)}
    base.update(kw)
    return Host(name="gpu-b01", address="10.0.0.1", **base)  # type: ignore[arg-type]  # Host's fields


HOSTS = [
    host(),
    host(connect_timeout=3, command_timeout=2, drain_timeout=7, kill_grace=1, settle_timeout=4),
    host(connect_timeout=45, command_timeout=60, drain_timeout=300, kill_grace=30, settle_timeout=900),
]


def evaluate(formula: str, h: Host) -> float:
    """A way's formula read as arithmetic over the host's variables (`x` is times)."""
    assert re.fullmatch(r"[a-z_0-9 .+x(),]+", formula), formula
    names = {name: getattr(h, name) for name in VARIABLES}
    return float(eval(formula.replace(" x ", " * "), {"__builtins__": {}, "max": max}, names))


@pytest.mark.parametrize("h", HOSTS)
@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name.split(" (")[0])
def test_each_ways_formula_is_its_seconds(way: verdict_time.Way, h: Host) -> None:
    assert evaluate(way.formula, h) == way.seconds(h) == way.cost(h)
    if way.option is not None:
        assert evaluate(way.option_formula, h) == way.cost(h, frozenset({way.option})) - way.seconds(h) > 0


def test_the_ways_at_the_default_bounds() -> None:
    seconds = {way.name.split(" (")[0]: s for way, s in verdict_time.ways(host())}
    assert seconds == {
        "nothing answers the connection": 20.0,
        "another run holds the node's lock": 10.0,
        "the driver is wedged": 30.0,
        "a unit's stop hangs": 40.0,
        "a holder respawns": 11.0,
        "GPU memory never comes back": 61.0,
        "the session goes silent": 14.0,
    }


def test_a_host_without_services_cannot_hang_a_stop() -> None:
    names = [way.name for way, _ in verdict_time.ways(host(services=()))]
    assert not [n for n in names if "stop hangs" in n]
    drain_phase = next(p for p in verdict_time.reset_phases(host(services=())) if p.name == "drain")
    assert drain_phase.longest_s == baselines.longest_s(host(services=()))
    assert drain_phase.worst_s == 30.0  # a wedged driver at the baselines


def test_a_reset_phase_by_phase_at_the_default_bounds() -> None:
    phases = {p.name: (p.longest_s, p.worst_s) for p in verdict_time.reset_phases(host())}
    assert list(phases) == [CONNECT, "drain", "kill", "settle", "verify"]
    assert phases == {
        CONNECT: (2 * 10 + 10 + 2 * 10, 20.0),  # connect, then the lock's wait and its answer and owner read
        "drain": (2 * 10 + 2 * 30 + 30 + 10 + 10 + 10, 40.0),  # the baselines, the stop and its escalation
        "kill": (5 + 5 + 8 * 10, 14.0),  # one round; held longest by a silent session (14 s), then a respawn
        "settle": (60 + 2 * 30 + 2 * (3 * 30 + 5 * 10), 61.0),
        "verify": (5 * 30 + 10 * 10, 30.0),
    }


def test_the_options_add_what_they_run() -> None:
    h = host()
    plain = {p.name: p for p in verdict_time.reset_phases(h)}
    gpu_reset = {p.name: p for p in verdict_time.reset_phases(h, gpu_reset=True)}
    assert gpu_reset["settle"].longest_s == plain["settle"].longest_s + remedy.reset_room(h).seconds \
        + settle.wait_room(h).seconds
    assert gpu_reset["settle"].worst_s == plain["settle"].worst_s + h.gpu_reset_timeout + h.settle_timeout + 1
    stop = {p.name: p for p in verdict_time.reset_phases(h, stop_units=True)}
    assert stop["kill"].longest_s == 2 * kill.round_room(h).seconds + drain.longest_stop_s(h, h.drain_timeout)
    assert stop["kill"].worst_s == 11 + h.drain_timeout + 10 + h.kill_grace + 5 + 1  # the respawn, the unit's stop
    restored = {p.name: p for p in verdict_time.reset_phases(h, restore_settings=True)}
    assert restored["settle"].longest_s == plain["settle"].longest_s + restore.longest_s(h)


def test_what_the_lock_and_an_srun_step_must_outlast() -> None:
    h = host()
    phases = verdict_time.reset_phases(h, gpu_reset=True)
    assert verdict_time.held_s(h, gpu_reset=True) == sum(p.longest_s for p in phases[1:])
    assert verdict_time.walk_s(h) == 10 + 10 + 10 + verdict_time.held_s(h)  # the lock taken, then held


def test_the_xid_check_ignored_reads_no_kernel_log_at_the_baselines() -> None:
    assert baselines.longest_s(host()) - baselines.longest_s(host(health_ignore=("xid",))) == 20.0  # log and jobs


def test_a_check_and_a_dry_run() -> None:
    assert [(p.name, p.longest_s, p.worst_s) for p in verdict_time.check_phases(host())] == [
        (CONNECT, 20.0, 20.0), ("verify", verify.room(host()).seconds, 30.0)]
    assert [p.name for p in verdict_time.plan_phases(host())] == [CONNECT, "drain"]


def test_the_docs_table_is_the_functions() -> None:
    """docs/operating.md's "Time to a verdict" has one row a way: its verdict, formula and default seconds."""
    text = (ROOT / "docs" / "operating.md").read_text()
    for way, seconds in verdict_time.ways(host(connect_timeout=10)):
        row = f"| {way.name} | {way.verdict} | `{way.formula}` | {seconds:g} s |"
        assert row in text, row
        if way.option is not None:
            added = way.cost(host(), frozenset({way.option})) - seconds
            row = f"| {way.option} | {way.name} | `+ {way.option_formula}` | + {added:g} s |"
            assert row in text, row
