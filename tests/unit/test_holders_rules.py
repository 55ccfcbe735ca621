"""The holders step's pure part: joining the scan with what the probes told, and judging each holder."""

from __future__ import annotations

from support.lineages import LINEAGE

from fleet.inventory.host import BUILTIN_PROTECTED, Host
from fleet.node.probes.lineage import Lineage, ProcStat
from fleet.node.probes.procs import HolderRow, Identity, PsRow
from fleet.reset.holders import describe_holders
from fleet.reset.protection import ProcessFacts, Rules


def test_protected_daemon_with_a_cut_comm_is_kept_and_python_is_not() -> None:
    found = (HolderRow(10, "root", ("/dev/nvidiactl",)), HolderRow(39865, "alice", ("/dev/nvidia0",)))
    ps = {10: PsRow(pid=10, ppid=1, user="root", args="/usr/bin/nvidia-persistenced --verbose"),
          39865: PsRow(pid=39865, ppid=1, user="alice", args="python3 train.py")}
    exe = {10: b"/usr/bin/nvidia-persistenced", 39865: b"/usr/bin/python3.11"}
    lineage = Lineage({10: ProcStat(pid=10, ppid=1, comm="nvidia-persiste"),
                       39865: ProcStat(pid=39865, ppid=1, comm="python3"), 1: ProcStat(pid=1, ppid=0, comm="systemd")})
    facts = ProcessFacts(ps=ps, exe=exe, lineage=lineage)
    kept, target = describe_holders(found, facts, Rules(BUILTIN_PROTECTED))
    assert kept.protected_by == "protected name nvidia-persistenced"
    assert (kept.name, kept.comm) == ("nvidia-persistenced", "nvidia-persiste")
    assert target.protected_by is None
    assert (target.user, target.name, target.comm) == ("alice", "python3", None)


def test_a_holder_gone_before_ps_is_dropped() -> None:
    found = (HolderRow(7, "root", ("/dev/nvidia0",)),)
    assert describe_holders(found, ProcessFacts(ps={}, exe={}), Rules(BUILTIN_PROTECTED)) == ()


def test_describe_holders_joins_and_judges() -> None:
    found = [HolderRow(pid, "root", ("/dev/nvidia0",)) for pid in (12, 13, 4242, 6000)]
    ps = {12: PsRow(pid=12, ppid=1, user="root", args="/usr/bin/nvidia-persistenced"),
          13: PsRow(pid=13, ppid=12, user="root", args="helper -d"),
          4242: PsRow(pid=4242, ppid=720, user="alice", args="python3 train.py")}  # 6000 exited before ps
    facts = ProcessFacts(ps=ps, exe={4242: b"/usr/bin/python3.11"}, lineage=LINEAGE, units={4242: "train.service"})
    holders = describe_holders(found, facts, Rules.of(Host(name="h", address="h", kill_users=("root",))))
    assert [(h.pid, h.name, h.unit, h.protected_by) for h in holders] == [
        (12, "nvidia-persistenced", None, "protected name nvidia-persistenced"),
        (13, "helper", None, "child of nvidia-persistenced (pid 12)"),
        (4242, "python3", "train.service", "user alice not in kill_users"),
    ]


def test_each_holder_carries_who_it_is_for_the_signal() -> None:
    """Its start time from the lineage walk and the owner of its fd table from the scan: with pid and exe,
    the identity every signal checks on the node first."""
    found = (HolderRow(4242, "alice", ("/dev/nvidia0",)), HolderRow(77, "bob", ("/dev/nvidia1",)))
    ps = {4242: PsRow(pid=4242, ppid=1, user="alice", args="python3 train.py"),
          77: PsRow(pid=77, ppid=1, user="bob", args="trainer")}
    lineage = Lineage({4242: ProcStat(pid=4242, ppid=1, comm="python3", start=9001),
                       1: ProcStat(pid=1, ppid=0, comm="systemd", start=2)})
    facts = ProcessFacts(ps=ps, exe={4242: b"/usr/bin/python3.11"}, lineage=lineage)
    python, trainer = describe_holders(found, facts, Rules(BUILTIN_PROTECTED))
    assert (python.start, python.owner) == (9001, "alice")
    assert python.identity() == Identity(pid=4242, start=9001, exe=b"/usr/bin/python3.11", user="alice")
    assert (trainer.start, trainer.owner) == (None, "bob")  # not in the walk: its start time is unknown
    assert trainer.identity() is None  # and it is never signalled
