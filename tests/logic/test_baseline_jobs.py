"""The baselines say which compute apps are a job's processes (fleet.reset.baselines): fleet never ends them, so one
that ends on its own during the reset was not ended by it, and its application Xid fails rather than warns."""

from __future__ import annotations

from support import scripted_node
from support.scripted_node import Log

from fleet.inventory.host import Host
from fleet.node.node import Node
from fleet.reset import baselines
from fleet.reset.health_gate import Ended
from fleet.transport.scripted import Reply, ScriptedTransport

JOB = "0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0"
APPS = "GPU-aaaa, 300, python3, 30000\nGPU-aaaa, 301, python3, 2000\n"


def node(cgroups: Reply) -> tuple[Node, ScriptedTransport, Log]:
    t = ScriptedTransport(script=[
        (scripted_node.KERNEL_LOG, scripted_node.kernel_log_reply()),
        scripted_node.BEFORE,
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout=APPS)),
        (("grep",), cgroups),
    ])
    log = Log()
    return Node(Host(name="gpu-01", address="127.0.0.1", gpus=1, command_timeout=1.0), t, log), t, log


async def test_a_jobs_compute_app_at_the_baselines_is_never_one_the_reset_ended() -> None:
    n, t, _ = node(Reply(stdout=f"/proc/300/cgroup:{JOB}\n/proc/301/cgroup:0::/system.slice/sglang.service\n"))
    baseline, _ = await baselines.read(n)
    assert baseline.jobs == {300}
    assert [argv[0] for argv in t.ran].count("grep") == 1  # one more command, only because apps were listed
    ended = Ended.of((), baseline.apps, spared=baseline.jobs)  # both gone at verify
    assert set(ended.names) == {301}  # the unit's process drain stopped; never the job's


async def test_a_job_read_that_fails_counts_every_app_as_a_jobs() -> None:
    n, _, log = node(Reply(exit_status=127, stderr="sh: grep: not found\n"))
    baseline, _ = await baselines.read(n)
    assert baseline.jobs == {300, 301}
    assert [name for name, _ in log.events].count("jobs_unread") == 1
