"""A reservation an earlier `--via srun` run left (`fleet.slurm.leftovers`): which are fleet's and another run's,
and which nodes keep one in place. The same rules run against a real slurmctld in test_slurm_crash.py."""

from __future__ import annotations

import pytest

from fleet.slurm.leftovers import Leftover, holding_back, leftovers, parse_reservations
from fleet.slurm.records import SlurmNode

OURS = "20261204T060000Z-aaaaaa"
KILLED = "20261204T050000Z-bbbbbb"
# `scontrol show reservation --oneliner`, as Slurm 22-24 print it (fields trimmed)
SHOWN = (
    f"ReservationName=fleet-{KILLED} StartTime=2026-12-04T05:00:01 EndTime=2026-12-04T05:17:01 Duration=00:17:00"
    " Nodes=sim[1-4] NodeCnt=4 CoreCnt=4 Features=(null) PartitionName=gpu Flags=MAINT,IGNORE_JOBS,SPEC_NODES"
    " TRES=cpu=4 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null)\n"
    "ReservationName=fleet-weekly StartTime=2026-12-05T00:00:00 EndTime=2026-12-05T01:00:00 Duration=01:00:00"
    " Nodes=sim[3-5] NodeCnt=3 Flags=MAINT Users=root State=INACTIVE\n"
    f"ReservationName=fleet-{OURS} StartTime=2026-12-04T06:00:01 Nodes=sim1 NodeCnt=1 Flags=MAINT Users=root\n"
    "ReservationName=empty Nodes=(null) NodeCnt=0 Flags=ANY_NODES Users=root\n"
)


def test_reservations_are_read_with_their_nodes_expanded() -> None:
    assert parse_reservations(SHOWN) == {
        f"fleet-{KILLED}": ("sim1", "sim2", "sim3", "sim4"),
        "fleet-weekly": ("sim3", "sim4", "sim5"),
        f"fleet-{OURS}": ("sim1",),
        "empty": (),
    }
    assert parse_reservations("No reservations in the system\n") == {}
    assert parse_reservations("ReservationName=odd Nodes=sim[1-") == {"odd": ()}  # unreadable: no node guessed


def test_only_another_fleet_runs_reservation_on_a_target_is_a_leftover() -> None:
    """fleet-weekly is an admin's name, not a run id; this run's own reservation is not a leftover; a fleet
    reservation on no target is none of this run's business."""
    found = leftovers(parse_reservations(SHOWN), ["sim2", "sim5"], OURS, lambda run_id: run_id == KILLED)
    assert found == [Leftover(name=f"fleet-{KILLED}", run_id=KILLED, nodes=("sim1", "sim2", "sim3", "sim4"), over=True)]
    assert leftovers(parse_reservations(SHOWN), ["sim9"], OURS, lambda run_id: True) == []
    assert not leftovers(parse_reservations(SHOWN), ["sim1"], OURS, lambda run_id: False)[0].over


IDLE, DRAINED, DOWN = "IDLE+MAINTENANCE+RESERVED", "IDLE+DRAIN+MAINTENANCE+RESERVED", "DOWN+MAINTENANCE+RESERVED"


@pytest.mark.parametrize(("clean", "states", "held"), [
    # every node reset clean by this run, or drained: nothing goes back into service unchecked
    ({"sim1", "sim2", "sim3"}, {"sim4": DRAINED}, []),
    # sim4 was no target (or not reset clean) and is in service: removing the reservation would free it unchecked
    ({"sim1", "sim2", "sim3"}, {"sim4": IDLE}, ["sim4"]),
    # down is out of service too
    ({"sim1", "sim2", "sim3"}, {"sim4": DOWN}, []),
    # a node Slurm no longer shows is not known to be safe
    ({"sim1", "sim2", "sim3"}, {}, ["sim4"]),
    (set(), dict.fromkeys(("sim1", "sim2", "sim3", "sim4"), IDLE), ["sim1", "sim2", "sim3", "sim4"]),
])
def test_a_leftover_is_held_back_by_each_node_it_would_free_unchecked(clean: set[str], states: dict[str, str],
                                                                      held: list[str]) -> None:
    leftover = Leftover(name=f"fleet-{KILLED}", run_id=KILLED, nodes=("sim1", "sim2", "sim3", "sim4"), over=True)
    now = {name: SlurmNode(name=name, state=state) for name, state in states.items()}
    assert holding_back(leftover, clean, now) == held


def test_a_leftover_says_whose_it_is_and_whether_its_run_is_over() -> None:
    leftover = Leftover(name=f"fleet-{KILLED}", run_id=KILLED, nodes=("sim1", "sim2"), over=True)
    assert leftover.describe() == (f"reservation fleet-{KILLED} of run {KILLED} holds sim[1-2]"
                                   " (its run is over: its running.lock is free)")
    assert Leftover(name="fleet-x", run_id="x", nodes=("sim1",),
                    over=False).describe().endswith("(its run may still be going)")
