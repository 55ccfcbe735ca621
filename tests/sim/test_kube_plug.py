"""A second scheduler, shaped as a real one: Kubernetes cordon and drain (`support.kube_plug`), against an API
server on loopback (`support.kube_api`), over in-process simulated nodes. The plug is its own module and one row
of `fleet.model.plugs.SCHEDULERS`: its host variables (`kube: {node, grace_s}`), its job ids (pod UIDs), its
job daemons (the container runtime's shim) and its words come from it; fleet's package names it nowhere."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import kube_plug
from support.kube_api import FakeKubeApi
from support.paths import REPO

import fleet
from fleet.engine.options import RunOptions, SchedulerOptions
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model import plugs
from fleet.model.codec import host_to_document
from fleet.model.errors import InventoryError
from fleet.model.report import HostStatus, Reason, SchedulerRecord, StepStatus
from fleet.node.probes.jobs import JobCgroup, parse_job_cgroups
from fleet.report.render import to_document
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, WorkerSpec

FAST = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 30, "command_timeout": 5}
KUBE = RunOptions(scheduler=SchedulerOptions(name="kube", drain_wait_s=1.0))
UID = "0f1e2d3c-0a1b-4c5d-9e8f-7a6b5c4d3e2f"


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plug's one registry row; monkeypatch takes it out again after the test."""
    module = kube_plug.__name__
    monkeypatch.setitem(plugs.SCHEDULERS, "kube", plugs.Scheduled(plug=module, jobs=module, variables=module))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeApi]:
    with FakeKubeApi().serving() as served:
        monkeypatch.setenv("FLEET_KUBE_API", served.url)
        yield served


def test_fleets_package_names_no_kubernetes() -> None:
    """Everything this scheduler needs lives in its own module: fleet's code needed no change for it."""
    named = [str(p.relative_to(REPO)) for p in (REPO / "fleet").rglob("*.py") if "kube" in p.read_text().lower()]
    assert named == []


def test_its_host_variables_are_checked_and_merged_under_its_name(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent("""
        scheduler: kube
        groups: {rack: {hosts: ["gpu-0[1-2]"], vars: {kube: {grace_s: 30}}}}
        hosts: {gpu-01: {kube: {node: k8s-gpu-01}}}
        """))
    inv = load_inventory(path)
    assert inv.scheduler == "kube"
    one, two = inv.hosts["gpu-01"], inv.hosts["gpu-02"]
    assert one.variables_of("kube", kube_plug.KubeVariables) == kube_plug.KubeVariables(node="k8s-gpu-01", grace_s=30)
    assert (kube_plug.node_name(one), kube_plug.node_name(two)) == ("k8s-gpu-01", "gpu-02")
    assert inv.source("gpu-01", "kube.grace_s") == "groups.rack.vars.kube.grace_s"
    path.write_text("hosts: {gpu-01: {kube: {grace_s: -1}}}\n")
    with pytest.raises(InventoryError, match=r"hosts\.gpu-01\.kube\.grace_s: must be greater than or equal to 0"):
        load_inventory(path)


@pytest.mark.parametrize(("path", "uid"), [
    # systemd cgroup driver (cgroup v2), a Burstable pod: `-` escaped as `_`
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     "cri-containerd-4f2a0c.scope", UID),
    # systemd driver, a Guaranteed pod (no QoS slice)
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-4f2a0c.scope", UID),
    # cgroupfs driver, a BestEffort pod, and a Guaranteed one
    (f"/kubepods/besteffort/pod{UID}/34dc0b5e626f", UID),
    (f"/kubepods/pod{UID}/34dc0b5e626f", UID),
    # a kubelet in a container sees its own root first
    (f"/kubelet.slice/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}"
     ".slice/cri-containerd-9a.scope", UID),
    # not a pod's: the runtime itself, a user's own slice, a name that only looks like one
    ("/system.slice/containerd.service", None),
    (f"/user.slice/user-1000.slice/pod{UID}", None),
    ("/kubepods.slice/kubepods-besteffort.slice", None),
])
def test_a_pods_cgroup_names_its_uid(path: str, uid: str | None) -> None:
    assert kube_plug.pod_of_cgroup(path) == uid
    text = f"/proc/42/cgroup:0::{path}\n"
    assert parse_job_cgroups(text) == ({42: JobCgroup(uid, path, "kube")} if uid else {})


async def test_a_reset_cordons_drains_resets_and_gives_back_only_the_clean_nodes(
        tmp_path: Path, api: FakeKubeApi) -> None:
    """gpu-01: its pod is evicted (the DaemonSet's stays), a stray process killed, the node clean and uncordoned.
    gpu-02: a PodDisruptionBudget keeps its pod past --drain-wait: skipped untouched, uncordoned. gpu-03: cordoned
    by an admin before the run: skipped, left as it was. gpu-04: a pod's process (below the runtime's shim) holds
    GPU 0: kept, the host fails naming the pod's job and the plug's hint, and the node stays cordoned."""
    names = ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
    for name in names:
        api.add_node(f"k8s-{name}", cordoned=name == "gpu-03")
    trainer = api.add_pod("k8s-gpu-01", "trainer")
    api.add_pod("k8s-gpu-01", "nvidia-device-plugin-x7k2p", namespace="kube-system", daemon_set=True)
    api.blocked.add(api.add_pod("k8s-gpu-02", "db-0"))
    specs = [NodeSpec(name=name, linger_s=0.2) for name in names]
    host_vars = {name: {**FAST, "kube": {"node": f"k8s-{name}", "grace_s": 0}} for name in names}
    async with SimFleet(tmp_path / "sim", specs, host_vars=host_vars) as sim:
        stray = sim.nodes["gpu-01"].spawn_worker(WorkerSpec(gpus=(1,), mib=2000, name="python3"))
        node4 = sim.nodes["gpu-04"]
        shim = node4.spawn_worker(WorkerSpec(gpus=(), mib=0, name="containerd-shim-runc-v2", compute=False,
                                             child=WorkerSpec(gpus=(0,), mib=30000, name="python3")))
        [pod_process] = node4.children_of(shim)
        hosts = select(load_inventory(sim.inventory_path), groups=["sim"])
        report = await fleet.run(hosts, KUBE, log_dir=tmp_path / "logs")
        assert not sim.nodes["gpu-01"].alive(stray) and node4.alive(shim) and node4.alive(pod_process)
    one, two, three, four = (report.hosts[n] for n in names)
    assert one.status is HostStatus.CLEAN and one.scheduler is not None
    assert (one.scheduler.state_before, one.scheduler.state_after, one.scheduler.jobs) == ("ready", "ready",
                                                                                          (trainer,))
    assert api.running("k8s-gpu-01") == ["nvidia-device-plugin-x7k2p"] and not api.cordoned("k8s-gpu-01")
    evictions = {target: body for method, target, body in api.requests if target.endswith("/eviction")}
    assert evictions["/api/v1/namespaces/default/pods/trainer/eviction"] == {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "trainer", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 0}}
    assert not any("nvidia-device-plugin" in target for target in evictions)  # a DaemonSet's pod stays
    assert (two.status, two.reason) == (HostStatus.SKIPPED, Reason.JOBS_RUNNING)
    assert all(step.status is StepStatus.SKIPPED for step in two.steps)
    assert two.error == "kube: pod default/db-0 still running on k8s-gpu-02 after 1 s: not reset"
    assert not api.cordoned("k8s-gpu-02") and api.annotations("k8s-gpu-02") == {}
    assert (three.status, three.reason) == (HostStatus.SKIPPED, Reason.SCHEDULER) and api.cordoned("k8s-gpu-03")
    assert three.scheduler == SchedulerRecord(node="k8s-gpu-03", by="kube", state_before="cordoned",
                                              state_after="cordoned")
    assert (four.status, four.reason) == (HostStatus.FAILED, Reason.MEMORY_HELD_BY_JOB)
    assert f"memory held by a Kubernetes job (containerd-shim-runc-v2 pid {shim})" in (four.error or "")
    assert (four.error or "").endswith("drain the node in Kubernetes first (kubectl drain NODE --ignore-daemonsets)")
    assert api.cordoned("k8s-gpu-04") and api.annotations("k8s-gpu-04") == {kube_plug.ANNOTATION:
                                                                            f"fleet: run {report.run_id}"}
    assert four.scheduler is not None and four.scheduler.reason_after == f"fleet: run {report.run_id}: failed"
    document = json.loads(json.dumps(host_to_document(one)))
    assert "slurm" not in document and document["kube"]["jobs"] == [trainer]
    assert to_document(report)["hosts"]["gpu-01"]["kube"]["node"] == "k8s-gpu-01"


async def test_an_api_that_fails_fails_its_hosts_untouched(tmp_path: Path, api: FakeKubeApi) -> None:
    api.add_node("gpu-01")
    api.failing = True
    async with SimFleet(tmp_path / "sim", [NodeSpec(name="gpu-01")], host_vars={"gpu-01": FAST}) as sim:
        report = await fleet.run(select(load_inventory(sim.inventory_path), groups=["sim"]), KUBE,
                                 log_dir=tmp_path / "logs")
    host = report.hosts["gpu-01"]
    assert (host.status, host.reason) == (HostStatus.FAILED, Reason.SCHEDULER)
    assert all(step.status is StepStatus.SKIPPED for step in host.steps)
    assert host.error == "kube: GET /api/v1/nodes/gpu-01: 500 etcdserver: request timed out"



@pytest.mark.parametrize("lost", [True, False], ids=["the cordon's", "the uncordon's"])
async def test_a_lost_reply_is_read_back_never_guessed(tmp_path: Path, api: FakeKubeApi, lost: bool) -> None:
    """A cordon or uncordon took but its reply was lost: the plug reads the node back and goes on from what the API
    shows, so the node ends as the record says (clean: uncordoned), never cordoned with nobody's record of it."""
    api.add_node("gpu-01")
    api.lose_reply.add(lost)
    async with SimFleet(tmp_path / "sim", [NodeSpec(name="gpu-01")], host_vars={"gpu-01": FAST}) as sim:
        report = await fleet.run(select(load_inventory(sim.inventory_path), groups=["sim"]), KUBE,
                                 log_dir=tmp_path / "logs")
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.CLEAN and host.scheduler is not None
    assert (host.scheduler.state_before, host.scheduler.state_after) == ("ready", "ready")
    assert not api.cordoned("gpu-01") and not api.lose_reply
