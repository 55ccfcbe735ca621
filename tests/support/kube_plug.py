"""A Kubernetes scheduler plug, written as a plug outside fleet would be: this module and one registry row
(`plugs.SCHEDULERS["kube"] = Scheduled(plug=..., jobs=..., variables=...)`), nothing else of fleet changed.

- `PLUG`: cordon and drain around each host's reset, as `kubectl drain --ignore-daemonsets` does, through the API
  server at `$FLEET_KUBE_API` (`support.kube_api` in the tests): before the wave, each node is read and cordoned
  (`spec.unschedulable`, with an annotation naming the run); before the host's reset, its pods are evicted (a
  DaemonSet's stay) and waited for, up to `--drain-wait`; after it, a clean node is uncordoned and any other kept
  cordoned. A node someone else had cordoned is left alone and the host skipped, untouched.
- `JOBS`: a pod's processes as a node shows them. The kubelet puts each pod in a cgroup named by its UID
  (`pkg/kubelet/cm/pod_container_manager_linux.go`: `"pod" + UID` under its QoS class's cgroup): with the
  cgroupfs driver `/kubepods/<qos>/pod<uid>/<container>` (`/kubepods/pod<uid>/...` for Guaranteed); with the
  systemd driver, each name escaped for systemd (`-` as `_`, `cgroup_manager_linux.go`),
  `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/cri-containerd-<id>.scope`. A container's
  processes descend from its runtime's shim (`containerd-shim-runc-v2`). fleet never kills them.
- `VARIABLES`: `kube: {node: ..., grace_s: ...}` in the inventory.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

import anyio

from fleet.engine.schedulers import Plug, Ready
from fleet.engine.walk import HostRun, Mode
from fleet.inventory import validate
from fleet.inventory.host import Host, Var
from fleet.model.hostlog import HostLog
from fleet.model.report import HostReport, HostStatus, Reason, SchedulerRecord
from fleet.node.jobs import JobSide

NAME = "kube"
ANNOTATION = "fleet.example/reset"  # on a node this run cordoned: which run, so an operator sees whose it is
REQUEST_S = 5.0  # each API request's bound
POLL_S = 0.05  # between two looks at a draining node's pods
RELEASE_S = 3 * REQUEST_S  # the release's bound, shielded: it runs on Ctrl-C too


# --- the host variables ---------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class KubeVariables:
    """A host as Kubernetes knows it."""

    node: Annotated[str | None, Var(help="the host's node name in Kubernetes", check=validate.host_name,
                                    shown="the host name")] = None
    grace_s: Annotated[int | None, Var(help="seconds an evicted pod has to end (`kubectl drain --grace-period`)",
                                       ge=0, le=3600, shown="the pod's own")] = None


VARIABLES = KubeVariables


def node_name(host: Host) -> str:
    return host.variables_of(NAME, KubeVariables).node or host.name


# --- the node side ----------------------------------------------------------------------------------------------

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?")


def pod_of_cgroup(path: str) -> str | None:
    """The UID of the pod whose cgroup `path` lies in (below a `kubepods` cgroup), or None."""
    parts = [p for p in path.split("/") if p]
    below = next((i for i, p in enumerate(parts) if p in ("kubepods", "kubepods.slice")), None)
    if below is None:
        return None
    for part in parts[below + 1:]:
        found = _POD.search(part) if part.startswith(("kubepods", "pod")) else None
        if found is not None:
            return found.group(1).replace("_", "-")
    return None


JOBS = JobSide(name=NAME, title="Kubernetes", daemons=("containerd-shim-runc-v2",), job_of_cgroup=pod_of_cgroup,
               job_of_title=lambda command_line: None,
               hint="drain the node in Kubernetes first (kubectl drain NODE --ignore-daemonsets)")


# --- the API --------------------------------------------------------------------------------------------------

class KubeError(Exception):
    """A request the API server refused or did not answer: its status code (None: no answer) and message."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class KubeApi:
    """The API server's client: one request at a time, each bounded (its socket's timeout, and a client deadline
    a second later)."""

    url: str

    async def request(self, method: str, path: str, body: object = None) -> Any:
        with anyio.fail_after(REQUEST_S + 1):
            return await anyio.to_thread.run_sync(self._request, method, path, body, abandon_on_cancel=True)

    def _request(self, method: str, path: str, body: object) -> Any:
        kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": kind})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            status = json.loads(exc.read() or b"{}")
            raise KubeError(exc.code, f"{method} {path}: {exc.code} {status.get('message', exc.reason)}") from None
        except (OSError, ValueError) as exc:
            raise KubeError(None, f"{method} {path}: {exc}") from None

    async def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.request("GET", f"/api/v1/nodes/{quote(name)}")
        return found

    async def cordon(self, name: str, unschedulable: bool, annotation: str | None) -> None:
        patch = {"spec": {"unschedulable": unschedulable}, "metadata": {"annotations": {ANNOTATION: annotation}}}
        await self.request("PATCH", f"/api/v1/nodes/{quote(name)}", patch)

    async def pods(self, node: str) -> list[dict[str, Any]]:
        """The node's pods but a DaemonSet's (which a drain leaves, and which come back at once if deleted)."""
        found = await self.request("GET", f"/api/v1/pods?fieldSelector={quote('spec.nodeName=' + node)}")
        return [p for p in found["items"]
                if not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences", []))]

    async def evict(self, pod: dict[str, Any], grace_s: int | None) -> bool:
        """Ask the pod to go; False while a PodDisruptionBudget refuses (429), as kubectl drain retries."""
        meta = pod["metadata"]
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        if grace_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_s}
        try:
            await self.request("POST", f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/"
                                       f"{quote(meta['name'])}/eviction", body)
        except KubeError as exc:
            if exc.code == 429:
                return False
            raise
        return True


# --- the lifecycle --------------------------------------------------------------------------------------------

@dataclass
class _Node:
    name: str
    grace_s: int | None
    state_before: str | None = None  # "ready" or "cordoned"
    cordoned: bool = False  # by this run
    pods: tuple[str, ...] = ()  # uids
    error: str | None = None
    waited_s: float | None = None
    evicted: set[str] = field(default_factory=set)

    def record(self, **after: Any) -> SchedulerRecord:
        return SchedulerRecord(node=self.name, by=NAME, state_before=self.state_before, jobs=self.pods,
                               error=self.error, waited_s=self.waited_s, **after)


class CordonDrain:
    """The `Scheduler` (`fleet.engine.schedulers`) a run goes through with `--scheduler kube`."""

    def __init__(self, api: KubeApi, run_id: str, mode: Mode, drain_wait_s: float) -> None:
        self.api, self.run_id, self.mode, self.drain_wait_s = api, run_id, mode, drain_wait_s
        self.nodes: dict[str, _Node] = {}

    async def serve(self) -> None:
        return None

    async def admit(self, runs: Sequence[HostRun]) -> dict[str, SchedulerRecord]:
        for run in runs:
            node = self.nodes[run.host.name] = _Node(node_name(run.host),
                                                     run.host.variables_of(NAME, KubeVariables).grace_s)
            try:
                found = await self.api.node(node.name)
                node.state_before = "cordoned" if found["spec"].get("unschedulable") else "ready"
                node.pods = tuple(p["metadata"]["uid"] for p in await self.api.pods(node.name))
                if self.mode is Mode.RESET and node.state_before == "ready":
                    node.cordoned = await self._cordon(node)
            except KubeError as exc:
                node.error = f"kube: {exc}"
        return {name: node.record() for name, node in self.nodes.items() if name in {r.host.name for r in runs}}

    async def _cordon(self, node: _Node) -> bool:
        """Cordon the node for this run; after a failed request, whether the node shows this run's cordon (a lost
        reply: the cordon took), read back, else the request's error."""
        mine = f"fleet: run {self.run_id}"
        try:
            await self.api.cordon(node.name, True, mine)
        except KubeError:
            found = await self.api.node(node.name)
            if not (found["spec"].get("unschedulable") and found["metadata"]["annotations"].get(ANNOTATION) == mine):
                raise
        return True

    async def ready(self, run: HostRun, log: HostLog) -> Ready:
        node = self.nodes[run.host.name]
        if node.error is not None:
            return Ready(node.record(), (HostStatus.FAILED, node.error, Reason.SCHEDULER))
        if node.state_before == "cordoned" and self.mode is not Mode.CHECK:
            return Ready(node.record(), (HostStatus.SKIPPED, f"kube: node {node.name} was cordoned before the run:"
                                         " not reset (uncordon it first)", Reason.SCHEDULER))
        if self.mode is not Mode.RESET:
            return Ready(node.record())
        log.info("kube_drain", node=node.name, pods=list(node.pods), drain_wait_s=self.drain_wait_s)
        started = anyio.current_time()
        try:
            left = await self._drain(node, started + self.drain_wait_s)
        except KubeError as exc:
            node.error = f"kube: {exc}"
            return Ready(node.record(), (HostStatus.FAILED, node.error, Reason.SCHEDULER))
        node.waited_s = round(anyio.current_time() - started, 3)
        if left:
            names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in left)
            return Ready(node.record(), (HostStatus.SKIPPED, f"kube: pod {names} still running on {node.name} after"
                                         f" {self.drain_wait_s:g} s: not reset", Reason.JOBS_RUNNING))
        log.info("kube_drained", node=node.name, waited_s=node.waited_s)
        return Ready(node.record())

    async def _drain(self, node: _Node, until: float) -> list[dict[str, Any]]:
        """Evict the node's pods and wait for them to go; those still there when `until` passes."""
        while True:
            left = await self.api.pods(node.name)
            if not left or anyio.current_time() >= until:
                return left
            for pod in left:
                uid = pod["metadata"]["uid"]
                if uid not in node.evicted and await self.api.evict(pod, node.grace_s):
                    node.evicted.add(uid)
            await anyio.sleep(POLL_S)

    async def release(self, run: HostRun, report: HostReport, log: HostLog) -> SchedulerRecord | None:
        node = self.nodes.get(run.host.name)
        if node is None or node.state_before is None:
            return None
        if not node.cordoned:
            return node.record(state_after=node.state_before)
        kept = f"fleet: run {self.run_id}: {report.status}"
        if report.status not in (HostStatus.CLEAN, HostStatus.SKIPPED):
            return node.record(state_after="cordoned", reason_after=kept)
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_S):
            try:
                await self.api.cordon(node.name, False, None)
                return node.record(state_after="ready")
            except KubeError as exc:
                log.error("kube_release_failed", node=node.name, error=str(exc))
                node.error = f"kube: {exc}"
            try:  # the uncordon may have taken with its reply lost: the record says what the API shows now
                found = await self.api.node(node.name)
                return node.record(state_after="cordoned" if found["spec"].get("unschedulable") else "ready",
                                   reason_after=kept if found["spec"].get("unschedulable") else None)
            except KubeError:
                pass
        return node.record(state_after=None, reason_after=f"{kept}: its state unknown, uncordon not confirmed")


def lifecycle(options: Any, logs: Any, interrupts: Any) -> CordonDrain:
    assert options.scheduler is not None
    return CordonDrain(KubeApi(os.environ["FLEET_KUBE_API"]), logs.run_id, options.mode,
                       options.scheduler.drain_wait_s)


PLUG = Plug(lifecycle=lifecycle)
