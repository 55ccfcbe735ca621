"""The scheduler seam is a plug: a fake workload manager, registered by one row of `fleet.model.plugs.SCHEDULERS`,
runs a reset through `run_and_report` with no Slurm anywhere, over scripted and over in-process simulated nodes.
This module is what a new scheduler writes: `Fake` and `PLUG`, the lifecycle around the run; `JOBS`, its jobs as
a node shows them (a `podstepd` daemon and its descendants, a `/fakepods/pod_<id>` cgroup), which no reset kills."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.scripted_run import make_host, node_script

from fleet.app.run import run_and_report
from fleet.cli.choose import chosen_scheduler
from fleet.engine import schedulers
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.engine.schedulers import Ready
from fleet.engine.walk import HostRun
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model import plugs
from fleet.model.codec import run_from_document
from fleet.model.errors import UsageError
from fleet.model.report import HostReport, HostStatus, Reason, SchedulerRecord
from fleet.node.jobs import JobSide
from fleet.node.probes.jobs import JobCgroup, parse_job_cgroups
from fleet.reset.protection import Holder, ProcessFacts, Rules, job_of, protected_by
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, WorkerSpec
from fleet.transport.scripted import ScriptedTransport

FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 30, "command_timeout": 5}


class Fake:
    """Cordons every node before the wave, keeps `busy` nodes out of the reset, and uncordons clean ones."""

    busy = frozenset({"gpu-02"})
    calls: ClassVar[list[str]] = []

    async def serve(self) -> None:
        return None

    async def admit(self, runs: Sequence[HostRun]) -> dict[str, SchedulerRecord]:
        self.calls.extend(f"admit {r.host.name}" for r in runs)
        return {r.host.name: SchedulerRecord(node=r.host.name, state_before="ready", by="fake") for r in runs}

    async def ready(self, run: HostRun, log: object) -> Ready:
        record = run.scheduler
        if run.host.name in self.busy:
            return Ready(record, (HostStatus.SKIPPED, "fake: pod still running", Reason.JOBS_RUNNING))
        return Ready(record)

    async def release(self, run: HostRun, report: HostReport, log: object) -> SchedulerRecord | None:
        self.calls.append(f"release {run.host.name} {report.status}")
        after = "ready" if report.status in (HostStatus.CLEAN, HostStatus.SKIPPED) else "cordoned"
        return SchedulerRecord(node=run.host.name, state_before="ready", state_after=after,
                               by="fake") if run.scheduler else None


PLUG = schedulers.Plug(lifecycle=lambda options, logs, interrupts: Fake())


def pod_of_cgroup(path: str) -> str | None:
    found = re.search(r"/fakepods/pod_([0-9a-f-]+)(?:/|$)", path)
    return found.group(1) if found else None


JOBS = JobSide(name="fake", title="Fake", daemons=("podstepd",), job_of_cgroup=pod_of_cgroup,
               job_of_title=lambda command_line: None, hint="cordon the node in Fake first")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The one registry line; monkeypatch takes it out again after the test."""
    Fake.calls.clear()
    monkeypatch.setitem(plugs.SCHEDULERS, "fake", plugs.Scheduled(plug=__name__, jobs=__name__))
    yield
    assert "fake" in schedulers.names()


def summary_of(log_dir: Path) -> dict[str, Any]:
    """The run's summary.json, the one run in `log_dir`."""
    [path] = log_dir.glob("*/summary.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


async def test_a_fake_scheduler_runs_a_reset_through_the_seam(tmp_path: Path) -> None:
    scripts = {n: ScriptedTransport(script=node_script()) for n in ("gpu-01", "gpu-02")}

    async def connector(host: Host) -> ScriptedTransport:
        return scripts[host.name]

    options = RunOptions(scheduler=SchedulerOptions(name="fake"))
    _, report = await run_and_report([make_host("gpu-01"), make_host("gpu-02")], options, as_json=False,
                                     log_dir=tmp_path, connector=connector)
    clean, busy = report.hosts["gpu-01"], report.hosts["gpu-02"]
    assert clean.status is HostStatus.CLEAN and clean.scheduler == SchedulerRecord(node="gpu-01", state_before="ready",
                                                                                   state_after="ready", by="fake")
    assert busy.status is HostStatus.SKIPPED and busy.error == "fake: pod still running" and not scripts["gpu-02"].ran
    assert sorted(Fake.calls) == ["admit gpu-01", "admit gpu-02", "release gpu-01 clean", "release gpu-02 skipped"]
    summary = summary_of(tmp_path)["hosts"]["gpu-01"]
    assert "slurm" not in summary and summary["fake"] == {"node": "gpu-01", "state_before": "ready",
                                                           "reason_before": None, "state_after": "ready",
                                                           "reason_after": None, "jobs": []}
    assert run_from_document(summary_of(tmp_path)).hosts["gpu-01"].scheduler == clean.scheduler  # fleet show


def test_the_command_line_names_the_fake_and_slurm_stays_an_alias() -> None:
    assert chosen_scheduler("fake", slurm=False) == "fake" and chosen_scheduler(None, slurm=True) == "slurm"
    assert chosen_scheduler("slurm", slurm=True) == "slurm" and chosen_scheduler(None, slurm=False) is None
    with pytest.raises(UsageError, match=r"^--slurm is --scheduler slurm: not with --scheduler fake$"):
        chosen_scheduler("fake", slurm=True)
    with pytest.raises(UsageError, match=r"^--scheduler: no scheduler 'k8s' \(known: fake, slurm\)$"):
        chosen_scheduler("k8s", slurm=False)


def test_the_fake_schedulers_job_cgroups_and_daemons_keep_their_processes() -> None:
    """The node side is asked, not named: a pid in a fake pod's cgroup, and the fake's daemon, are a job's. A job
    is the scheduler's own id, as text: a pod's UID, read back from the reason as it is."""
    uid = "8f1e2d3c-0a1b-4c5d-9e8f-7a6b5c4d3e2f"
    path = f"/kubepods.slice/fakepods/pod_{uid}/c1"
    text = f"/proc/42/cgroup:0::{path}\n/proc/43/cgroup:0::/system.slice/sshd.service\n"
    assert parse_job_cgroups(text) == {42: JobCgroup(uid, path, "fake")}
    facts = ProcessFacts(ps={}, exe={}, jobs=parse_job_cgroups(text))
    pod = Holder(pid=42, user="alice", name="python3", exe=b"/usr/bin/python3", devices=("/dev/nvidia0",))
    reason = protected_by(pod, facts, Rules(()))
    assert reason == f"a Fake job's process (job {uid}, cgroup {path})"
    ref = job_of(replace(pod, protected_by=reason))
    assert ref is not None and (ref.side.name, ref.job) == ("fake", uid)
    daemon = Holder(pid=44, user="root", name="podstepd", exe=b"/usr/sbin/podstepd", devices=("/dev/nvidiactl",))
    assert protected_by(daemon, facts, Rules(())) == "a Fake job's process (podstepd)"


async def test_a_reset_through_the_fake_keeps_its_jobs_on_in_process_nodes(tmp_path: Path) -> None:
    """Over simulated nodes (in-process SSH servers): the fake admits both, keeps gpu-02 out of the reset, and on
    gpu-01 a process below `podstepd` holds GPU 0: it is kept, and the host fails at once naming the fake's job and
    its hint; the fake keeps that node cordoned."""
    specs = [NodeSpec(name=name, linger_s=0.2) for name in ("gpu-01", "gpu-02")]
    async with SimFleet(tmp_path / "sim", specs, host_vars={n.name: FAST for n in specs}) as sim:
        node = sim.nodes["gpu-01"]
        task = WorkerSpec(gpus=(0,), mib=30000, name="python3")
        daemon = node.spawn_worker(WorkerSpec(gpus=(), mib=0, name="podstepd", compute=False, child=task))
        [child] = node.children_of(daemon)
        hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
        options = RunOptions(scheduler=SchedulerOptions(name="fake"))
        _, report = await run_and_report(hosts, options, as_json=False, log_dir=tmp_path / "logs")
        assert node.alive(daemon) and node.alive(child)
    held, busy = report.hosts["gpu-01"], report.hosts["gpu-02"]
    assert (held.status, held.reason) == (HostStatus.FAILED, Reason.MEMORY_HELD_BY_JOB)
    assert f"memory held by a Fake job (podstepd pid {daemon}); " in (held.error or "")
    assert (held.error or "").endswith("fleet never kills a job's processes: cordon the node in Fake first")
    assert held.scheduler == SchedulerRecord(node="gpu-01", state_before="ready", state_after="cordoned", by="fake")
    assert busy.status is HostStatus.SKIPPED and busy.error == "fake: pod still running"
    for sim_node in sim.nodes.values():
        assert not [p for p in sim_node.recorded_pids() if sim_node.alive(p)], "teardown left a process alive"


def test_via_takes_the_words_the_registry_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--via`'s words are the registry's: fleet's own fan-out, and each scheduler's row that names one."""
    from fleet.cli.options import via_scheduler

    assert plugs.fan_outs() == {"ssh": "", "srun": "slurm"}  # `fake` names none
    monkeypatch.setitem(plugs.SCHEDULERS, "fake", plugs.Scheduled(plug=__name__, jobs=__name__, via="fakestep"))
    assert (via_scheduler("ssh"), via_scheduler("srun"), via_scheduler("fakestep")) == (None, "slurm", "fake")
    with pytest.raises(UsageError, match=r"^--via takes ssh or srun or fakestep, not 'step'$"):
        via_scheduler("step")
