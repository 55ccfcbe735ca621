"""A Kubernetes API server's answers to what a cordon and drain ask, over HTTP on 127.0.0.1 (a thread of the test's
process, started and stopped by `with FakeKubeApi() as api:`).

The shapes are the API's own (core/v1 and policy/v1, as `kubectl drain` uses them):
- `GET /api/v1/nodes/NAME`: the Node, `spec.unschedulable` true when cordoned; 404 `NotFound` for no such node;
- `PATCH /api/v1/nodes/NAME` (`application/merge-patch+json`): `{"spec": {"unschedulable": ...}}`, and
  `metadata.annotations` (a value of null takes the annotation out);
- `GET /api/v1/pods?fieldSelector=spec.nodeName%3DNAME`: a PodList, each pod with `metadata.uid` and its
  `ownerReferences` (a DaemonSet's pods are left where they are, as `--ignore-daemonsets` does);
- `POST /api/v1/namespaces/NS/pods/NAME/eviction` (an `Eviction`, `deleteOptions.gracePeriodSeconds`): 201, and
  the pod is gone once its grace has passed (it shows `metadata.deletionTimestamp` until then); 429
  `TooManyRequests` while a PodDisruptionBudget refuses it (`blocked`), as the API says it.
`failing` makes every request answer 500, `lose_reply` a cordon or an uncordon take and answer 500 (its
reply lost); `requests` records each (method, path, body) it was asked.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

DAEMON_SET = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin", "controller": True}


@dataclass
class FakeKubeApi:
    """The cluster's nodes and pods, and the server that answers for them (see the module docstring)."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # by uid
    blocked: set[str] = field(default_factory=set)  # uids whose eviction a PodDisruptionBudget refuses
    failing: bool = False
    lose_reply: set[bool] = field(default_factory=set)  # the next patch to each `unschedulable` value here takes,
    # and answers 500 (its reply lost on the way back)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""
    _gone_at: dict[str, float] = field(default_factory=dict)  # uid -> when an evicted pod is gone
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_node(self, name: str, *, cordoned: bool = False) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {}},
                            "spec": {"unschedulable": True} if cordoned else {}}

    def add_pod(self, node: str, name: str, *, namespace: str = "default", daemon_set: bool = False) -> str:
        """A running pod on the node; its uid."""
        uid = str(uuid.uuid4())
        self.pods[uid] = {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": name, "namespace": namespace, "uid": uid,
                                       "ownerReferences": [DAEMON_SET] if daemon_set else []},
                          "spec": {"nodeName": node}, "status": {"phase": "Running"}}
        return uid

    def cordoned(self, node: str) -> bool:
        return bool(self.nodes[node]["spec"].get("unschedulable"))

    def annotations(self, node: str) -> dict[str, str]:
        return dict(self.nodes[node]["metadata"]["annotations"])

    def running(self, node: str) -> list[str]:
        """The names of the pods still on the node."""
        with self._lock:
            self._collect()
            return sorted(p["metadata"]["name"] for p in self.pods.values() if p["spec"]["nodeName"] == node)

    @contextmanager
    def serving(self) -> Iterator[FakeKubeApi]:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        thread = threading.Thread(target=server.serve_forever, name="fake-kube-api", daemon=True)
        thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()

    # --- the answers --------------------------------------------------------------------------------------------

    def answer(self, method: str, target: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append((method, target, body))
            if self.failing:
                return _status(500, "InternalError", "etcdserver: request timed out")
            self._collect()
            parts = urlsplit(target)
            path = [p for p in parts.path.split("/") if p]
            if path[:3] == ["api", "v1", "nodes"] and len(path) == 4:
                return self._node(method, path[3], body)
            if path == ["api", "v1", "pods"] and method == "GET":
                return self._pod_list(parse_qs(parts.query).get("fieldSelector", [""])[0])
            if path[:3] == ["api", "v1", "namespaces"] and len(path) == 7 and path[4] == "pods" \
                    and path[6] == "eviction" and method == "POST":
                return self._evict(path[3], path[5], body)
            return _status(404, "NotFound", f"the server could not find the requested resource ({target})")

    def _node(self, method: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        node = self.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        if method == "PATCH":
            wanted = body.get("spec", {}).get("unschedulable")
            lost = wanted in self.lose_reply
            self.lose_reply.discard(wanted)
            if "unschedulable" in body.get("spec", {}):
                node["spec"]["unschedulable"] = body["spec"]["unschedulable"]
            for key, value in body.get("metadata", {}).get("annotations", {}).items():
                if value is None:
                    node["metadata"]["annotations"].pop(key, None)
                else:
                    node["metadata"]["annotations"][key] = value
            if lost:
                return _status(500, "InternalError", "the server was unable to return a response in the time allotted")
        return 200, json.loads(json.dumps(node))

    def _pod_list(self, selector: str) -> tuple[int, dict[str, Any]]:
        key, _, value = selector.partition("=")
        if key != "spec.nodeName":
            return _status(400, "BadRequest", f"field label not supported: {key}")
        items = [json.loads(json.dumps(p)) for p in self.pods.values() if p["spec"]["nodeName"] == value]
        return 200, {"apiVersion": "v1", "kind": "PodList", "items": items}

    def _evict(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        pod = next((p for p in self.pods.values()
                    if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)), None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            return _status(400, "BadRequest", "expected a policy/v1 Eviction")
        uid = pod["metadata"]["uid"]
        if uid in self.blocked:
            return _status(429, "TooManyRequests",
                           "Cannot evict pod as it would violate the pod's disruption budget.")
        grace = body.get("deleteOptions", {}).get("gracePeriodSeconds")
        self._gone_at.setdefault(uid, time.monotonic() + (0.2 if grace is None else min(grace, 0.2)))
        pod["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
        return 201, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}

    def _collect(self) -> None:
        """Evicted pods whose grace has passed are gone."""
        now = time.monotonic()
        for uid in [u for u, at in self._gone_at.items() if at <= now]:
            self.pods.pop(uid, None)
            del self._gone_at[uid]


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "reason": reason,
                  "code": code}


def _handler(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            if self.command == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
                code, document = _status(415, "UnsupportedMediaType", "the body of the request was in an unknown"
                                         " format")
            else:
                code, document = api.answer(self.command, self.path, body or {})
            data = json.dumps(document).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler
