"""The task graph over a scripted transport: outcomes, step order, hangs, interrupts (no sockets)."""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from support import scripted_node
from support.scripted_run import LOCK, make_host, node_script, run

from fleet.engine.graph import run_hosts
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.engine.waves import Amount
from fleet.inventory.host import Host
from fleet.model.outcomes import CommandResult
from fleet.model.report import HostReport, HostStatus, Reason, StepName, StepStatus
from fleet.runlog.folder import RunLogs
from fleet.transport.scripted import Reply, ScriptedTransport


@pytest.fixture(autouse=True)
def quick_respawn_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted node never respawns anything: one look after the kill is enough here."""
    monkeypatch.setattr("fleet.reset.kill.RESPAWN_SCANS_S", (0.0,))



async def test_healthy_host_is_clean_with_steps_in_order(tmp_path: Path) -> None:
    """A stray holder dies on SIGTERM; the report lists drain, kill, settle, verify, all ok."""
    t = ScriptedTransport(script=node_script())
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.CLEAN, host.error
    assert host.error is None
    assert [s.name for s in host.steps] == list(StepName)
    assert all(s.status is StepStatus.OK for s in host.steps)
    assert [(k.pid, k.signal) for k in host.killed] == [(100, "SIGTERM")]
    assert host.gpus[0].memory_used_mib == 0
    assert t.closed


async def test_hanging_nvidia_smi_fails_within_budget_and_names_it(tmp_path: Path) -> None:
    """nvidia-smi that never answers is asked once: the baselines' read waits its bound, the kill still runs, and
    settle and verify do not ask the driver again; failed, with a one-line reason and what to do."""
    t = ScriptedTransport(script=node_script(smi_delay=60))
    with anyio.fail_after(30):
        report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.FAILED
    assert host.error == ("nvidia-smi did not answer within 3 s (nvidia-smi's bound: 3 x command_timeout) in drain, "
                          "not asked again: driver may be wedged; reset its GPUs (--gpu-reset) or reboot the node")
    assert host.reason is Reason.COMMAND_TIMEOUT
    steps = {s.name: s.status for s in host.steps}
    assert steps[StepName.KILL] is StepStatus.OK and [k.pid for k in host.killed] == [100]
    assert steps[StepName.SETTLE] is StepStatus.TIMEOUT and steps[StepName.VERIFY] is StepStatus.TIMEOUT
    assert sum(1 for argv in t.ran if argv[0] == "nvidia-smi") == 1  # the memory before, and never again


async def test_a_driver_that_first_hangs_at_settle_costs_one_bound_and_verify_does_not_ask_it(tmp_path: Path) -> None:
    """The baselines' read answers, settle's first poll hangs: settle waits that one bound, verify's nvidia-smi
    reads are not run (its other reads are), and the host says where the driver stopped answering."""
    delays = iter([0.0])  # the baselines' memory read answers at once; every later one never does
    settle_query = ("nvidia-smi", "--query-gpu=index,uuid,memory.used,mig.mode.current")
    script = [(argv, (lambda _: Reply(stdout="0, GPU-aaaa, 0, Disabled\n", delay_s=next(delays, 60.0)))
               if argv == settle_query else answer) for argv, answer in node_script()]
    t = ScriptedTransport(script=script)
    with anyio.fail_after(30):
        report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.FAILED and host.reason is Reason.COMMAND_TIMEOUT
    assert host.error == ("nvidia-smi did not answer within 3 s (nvidia-smi's bound: 3 x command_timeout) in settle, "
                          "not asked again: driver may be wedged; reset its GPUs (--gpu-reset) or reboot the node")
    assert host.memory_before_mib == (0,)
    # the memory and the apps before, then settle's first poll; verify's reads of the driver are not run, its
    # other reads are (the holder scan, the kernel log, the fabric manager)
    smi_asked = [i for i, argv in enumerate(t.ran) if argv[0] == "nvidia-smi"]
    assert [t.ran[i][:2] for i in smi_asked] == [settle_query, t.ran[smi_asked[1]][:2], settle_query]
    assert t.ran[smi_asked[1]][1].startswith("--query-compute-apps=")
    after = [argv[3] if argv[0] == "sh" else argv[0] for argv in t.ran[smi_asked[-1] + 1:]]
    assert "fleet-scan" in after and "nv-fabricmanager" in after
    # the log says what was not run, and never as a command that ran
    events = [json.loads(line) for line in (tmp_path / "run-1" / "gpu-01.jsonl").read_text().splitlines()]
    skipped = [e for e in events if e["event"] == "not_asked"]
    assert skipped and {e["step"] for e in skipped} == {"verify"} and all(e["argv"][0] == "nvidia-smi" for e in skipped)
    commands = [e["argv"] for e in events if e["event"] == "command" and e["argv"][0] == "nvidia-smi"]
    assert len(commands) == 3


async def test_memory_that_never_settles_fails_with_the_gpu_named(tmp_path: Path) -> None:
    """No process holds it (the complete scan after the window found none): a leaked context, said so."""
    t = ScriptedTransport(script=node_script(settle_mib=1523))
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.FAILED
    assert host.error == ("settle: gpu 0 holds 1523 MiB with no process holding it after 1 s: a leaked context;"
                          " --gpu-reset can reset it") and host.reason is Reason.MEMORY_LEAKED


async def test_unreachable_host_does_not_disturb_the_others(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script())
    report, _ = await run([make_host("gpu-01"), make_host("gpu-02")], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].status is HostStatus.CLEAN
    down = report.hosts["gpu-02"]
    assert down.status is HostStatus.UNREACHABLE
    assert down.error == "connection refused (127.0.0.1:22)" and down.reason is Reason.CONNECT_REFUSED
    assert report.hosts["gpu-01"].reason is None
    assert all(s.status is StepStatus.SKIPPED for s in down.steps)


async def test_respawned_holder_fails_the_kill_and_skips_settle(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script(holders_after_kill="root\t/proc/101/task/101/fd/3\t/dev/nvidia0\n"))
    script = t.script
    script.insert(2, (("ps", "-ww", "-o", "pid=,ppid=,user:32=,args=", "-p", "1,101"),
                      Reply(stdout=scripted_node.ps("  101     1 root     python3\n"))))
    script.insert(3, ((*scripted_node.EXE, "-c", "%N", "--", "/proc/101/exe"),
                      scripted_node.exe_reply({101: "/usr/bin/python3.11"})))
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    host = report.hosts["gpu-01"]
    kill = next(s for s in host.steps if s.name is StepName.KILL)
    assert kill.status is StepStatus.FAILED
    assert kill.error == "respawned: pid 101 python3 (no systemd unit); stop what restarts it"
    assert kill.reason is Reason.RESPAWNED
    assert next(s for s in host.steps if s.name is StepName.SETTLE).status is StepStatus.SKIPPED
    assert host.status is HostStatus.FAILED


async def test_sigint_cancels_in_flight_hosts_and_still_reports(tmp_path: Path) -> None:
    """Ctrl-C: in-flight hosts fail as interrupted, connections are closed, the report is whole."""
    slow = ScriptedTransport(script=[(("systemctl",), Reply(delay_s=30)), LOCK, scripted_node.BEFORE,
                                     scripted_node.APPS_BEFORE, *scripted_node.HEALTH])
    host = make_host(command_timeout=60.0, drain_timeout=60.0)

    async def interrupt() -> None:
        await anyio.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(interrupt)
            report, state = await run([host], {"gpu-01": slow}, tmp_path, handle_signals=True)
    assert state.interrupted
    result = report.hosts["gpu-01"]
    assert result.status is HostStatus.FAILED
    assert result.error == "interrupted during drain" and result.reason is Reason.INTERRUPTED
    assert slow.closed
    assert slow.open_commands == 0, "the reset lock was not released"


async def test_concurrency_limit_bounds_hosts_in_flight(tmp_path: Path) -> None:
    in_flight, peak = 0, 0

    def slow_show(argv: Sequence[str]) -> Reply:
        return Reply(stdout="ActiveState=inactive\nSubState=dead\nMainPID=0\n")

    class Counting(ScriptedTransport):
        async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
            nonlocal in_flight, peak
            if not getattr(self, "counted", False):  # its first command: the host is in flight until closed
                self.counted = True
                in_flight += 1
                peak = max(peak, in_flight)
            result = await super().run(argv, timeout=timeout, privileged=privileged, stdin=stdin)
            await anyio.sleep(0.01)
            return result

        async def close(self) -> None:
            nonlocal in_flight
            in_flight -= 1
            await super().close()

    hosts = [make_host(f"gpu-{i:02d}") for i in range(6)]
    scripts = {h.name: Counting(script=node_script()) for h in hosts}
    for t in scripts.values():
        t.script[1] = (("systemctl", "show"), slow_show)
    report, _ = await run(hosts, scripts, tmp_path, concurrency=2)
    assert report.count(HostStatus.CLEAN) == 6
    assert peak == 2


async def test_dry_run_reads_the_node_and_changes_nothing(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script())
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path, mode=Mode.PLAN)
    host = report.hosts["gpu-01"]
    assert host.status is HostStatus.PLANNED
    assert host.plan is not None
    assert [p.pid for p in host.plan.would_kill] == [100]
    assert host.steps[1].detail.startswith("would kill pid 100 python3")
    assert not [argv for argv in t.ran if (argv[0] == "sh" and argv[3] != "fleet-scan")
                or argv[:2] == ("systemctl", "stop")]


@pytest.mark.parametrize("status", ["inactive", "failed"])
async def test_unit_already_down_counts_as_drained(tmp_path: Path, status: str) -> None:
    t = ScriptedTransport(script=node_script())
    t.script[1] = (("systemctl", "show"), Reply(stdout=f"ActiveState={status}\nSubState=dead\nMainPID=0\n"))
    report, _ = await run([make_host()], {"gpu-01": t}, tmp_path)
    assert report.hosts["gpu-01"].steps[0].status is StepStatus.OK


async def test_an_escalation_the_node_refuses_fails_drain_with_its_message(tmp_path: Path) -> None:
    """A stop that hangs is escalated with `systemctl kill`; a systemctl that refuses it (an older systemd and
    an option it does not know) fails drain with what it said, not with "still active after SIGKILL"."""
    t = ScriptedTransport(script=node_script())
    t.script[1] = (("systemctl", "show"), Reply(stdout="ActiveState=deactivating\nSubState=stop-sigterm\nMainPID=7\n"))
    t.script.insert(0, (("systemctl", "kill"), Reply(stderr="systemctl: unrecognized option '--kill-whom=all'\n",
                                                     exit_status=1)))
    report, _ = await run([make_host(drain_timeout=0.3)], {"gpu-01": t}, tmp_path)
    drain = report.hosts["gpu-01"].steps[0]
    assert drain.status is StepStatus.FAILED
    assert drain.error == ("systemctl kill sglang.service exited 1: systemctl: unrecognized option "
                           "'--kill-whom=all'")
    kills = [argv for argv in t.ran if argv[:2] == ("systemctl", "kill")]
    assert kills == [("systemctl", "kill", "--kill-who=all", "--signal=SIGKILL", "--", "sglang.service")]


async def test_stop_refused_by_the_node_fails_drain_at_once(tmp_path: Path) -> None:
    """A `systemctl stop` that is refused (polkit) fails drain with its message instead of waiting 30 s."""
    t = ScriptedTransport(script=node_script())
    t.script[0] = (("systemctl", "stop"), Reply(stderr="Failed to stop sglang.service: Access denied\n",
                                                exit_status=4))
    host = make_host(drain_timeout=30.0)
    with anyio.fail_after(10):
        report, _ = await run([host], {"gpu-01": t}, tmp_path)
    drain = report.hosts["gpu-01"].steps[0]
    assert drain.status is StepStatus.FAILED
    assert drain.error == "systemctl stop sglang.service exited 4: Failed to stop sglang.service: Access denied"
    assert drain.reason is Reason.DRAIN_FAILED
    assert report.hosts["gpu-01"].steps[1].status is StepStatus.OK  # kill still runs


async def test_a_kill_the_node_refuses_is_reported_as_such(tmp_path: Path) -> None:
    t = ScriptedTransport(script=node_script())
    t.script[5] = (("sh", "-c"), scripted_node.signal(alive_after=lambda sig, pid: True,
                                                      verdict=lambda sig, pid: "denied"))
    report, _ = await run([make_host(kill_grace=0.2)], {"gpu-01": t}, tmp_path)
    kill = report.hosts["gpu-01"].steps[1]
    assert kill.status is StepStatus.FAILED
    assert kill.error is not None and kill.error.startswith("not permitted to kill pid 100 python3")
    assert report.hosts["gpu-01"].reason is Reason.KILL_FAILED
    assert report.hosts["gpu-01"].killed == ()


def _fleet(n: int, down: frozenset[int] = frozenset()) -> tuple[list[Host], dict[str, ScriptedTransport]]:
    hosts = [make_host(f"gpu-{i:02d}") for i in range(1, n + 1)]
    scripts = {h.name: ScriptedTransport(script=node_script()) for i, h in enumerate(hosts, 1) if i not in down}
    return hosts, scripts


async def test_max_fail_stops_starting_hosts_once_exceeded(tmp_path: Path) -> None:
    """--max-fail 1, one host at a time: the second failure exceeds the budget; the rest are skipped."""
    hosts, scripts = _fleet(6, down=frozenset({2, 3}))
    report, state = await run(hosts, scripts, tmp_path, concurrency=1, max_fail=Amount(1))
    statuses = [report.hosts[h.name].status for h in hosts]
    assert statuses == [HostStatus.CLEAN, HostStatus.UNREACHABLE, HostStatus.UNREACHABLE,
                        HostStatus.SKIPPED, HostStatus.SKIPPED, HostStatus.SKIPPED]
    assert report.hosts["gpu-04"].error == "failure budget spent: 2 hosts failed or unreachable, 1 tolerated"
    assert report.hosts["gpu-04"].reason is Reason.STOPPED
    assert "gpu-04" not in {n for n, t in scripts.items() if t.ran}
    assert state.stopped


async def test_max_fail_equalled_is_not_exceeded(tmp_path: Path) -> None:
    hosts, scripts = _fleet(4, down=frozenset({1}))
    report, _ = await run(hosts, scripts, tmp_path, concurrency=1, max_fail=Amount(1))
    assert report.count(HostStatus.CLEAN) == 3


async def test_waves_run_one_after_the_other(tmp_path: Path) -> None:
    """No host of a wave connects before every host of the wave before it has ended (both read on one clock, as
    they happen)."""
    hosts, scripts = _fleet(5)
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}

    async def connector(host: Host) -> ScriptedTransport:
        starts[host.name] = anyio.current_time()
        return scripts[host.name]

    def ended(report: HostReport) -> None:
        ends[report.name] = anyio.current_time()

    logs = RunLogs(tmp_path, "waves")
    logs.create()
    await run_hosts(hosts, RunOptions(batch=Amount(2)), logs, connector=connector, on_host_end=ended)
    logs.close()
    waves = [["gpu-01", "gpu-02"], ["gpu-03", "gpu-04"], ["gpu-05"]]
    for before, after in itertools.pairwise(waves):
        assert max(ends[n] for n in before) <= min(starts[n] for n in after)


async def test_each_host_reports_its_start_in_the_run(tmp_path: Path) -> None:
    """start_s: seconds from the run's start to the host's (report.html's timeline axis): a later wave starts
    after the one before it ended, by the same clock as its connect."""
    hosts, scripts = _fleet(3)
    connected: dict[str, float] = {}

    async def connector(host: Host) -> ScriptedTransport:
        connected[host.name] = anyio.current_time()
        return scripts[host.name]

    logs = RunLogs(tmp_path, "starts")
    logs.create()
    report, _ = await run_hosts(hosts, RunOptions(batch=Amount(2)), logs, connector=connector)
    logs.close()
    starts = {n: h.start_s for n, h in report.hosts.items()}
    assert all(s is not None for s in starts.values())
    first, second, later = (float(starts[n] or 0) for n in ("gpu-01", "gpu-02", "gpu-03"))
    assert 0 <= first < 0.5 and 0 <= second < 0.5
    assert later - first == pytest.approx(connected["gpu-03"] - connected["gpu-01"], abs=0.05)
    assert later >= max(float(starts[n] or 0) + report.hosts[n].duration_s for n in ("gpu-01", "gpu-02")) - 0.01
    assert later + report.hosts["gpu-03"].duration_s <= report.duration_s


async def test_a_host_that_never_started_has_no_start_in_the_run(tmp_path: Path) -> None:
    hosts, scripts = _fleet(3, down=frozenset({1}))
    report, _ = await run(hosts, scripts, tmp_path, canary=1)
    assert report.hosts["gpu-01"].start_s is not None
    assert [report.hosts[n].start_s for n in ("gpu-02", "gpu-03")] == [None, None]


async def test_a_failed_canary_stops_the_run(tmp_path: Path) -> None:
    hosts, scripts = _fleet(4, down=frozenset({1}))
    report, _ = await run(hosts, scripts, tmp_path, canary=1)
    assert report.hosts["gpu-01"].status is HostStatus.UNREACHABLE
    for name in ("gpu-02", "gpu-03", "gpu-04"):
        assert report.hosts[name].status is HostStatus.SKIPPED
        assert report.hosts[name].error == "canary failed on gpu-01: no other host started"
        assert report.hosts[name].reason is Reason.STOPPED
        assert not scripts[name].ran


async def test_a_clean_canary_lets_the_rest_run(tmp_path: Path) -> None:
    hosts, scripts = _fleet(3)
    report, _ = await run(hosts, scripts, tmp_path, canary=1)
    assert report.count(HostStatus.CLEAN) == 3


async def test_run_deadline_ends_in_flight_hosts_and_says_so(tmp_path: Path) -> None:
    slow = ScriptedTransport(script=[(("systemctl",), Reply(delay_s=30)), LOCK, scripted_node.BEFORE,
                                     scripted_node.APPS_BEFORE, *scripted_node.HEALTH])
    host = make_host(command_timeout=60.0, drain_timeout=60.0)
    with anyio.fail_after(10):
        report, state = await run([host, make_host("gpu-02")], {"gpu-01": slow}, tmp_path,
                                  deadline_s=0.5, concurrency=1)
    assert state.deadline.hit and not state.interrupted
    assert report.hosts["gpu-01"].error == "run deadline of 0.5 s reached during drain"
    assert report.hosts["gpu-02"].status is HostStatus.SKIPPED
    assert report.hosts["gpu-02"].error == "run deadline of 0.5 s reached before start"
    assert report.hosts["gpu-01"].reason is Reason.DEADLINE is report.hosts["gpu-02"].reason
    assert slow.closed


async def test_a_run_cut_short_before_its_hosts_began_starts_none_without_a_concurrency_limit(
        tmp_path: Path) -> None:
    """Every host may be in flight at once (no limiter to wait on): a deadline that passes before they begin still
    leaves each skipped, nothing asked of its node."""
    hosts, scripts = _fleet(3)
    with anyio.fail_after(10):
        report, state = await run(hosts, scripts, tmp_path, deadline_s=0.0)
    assert state.deadline.hit
    assert {h.status for h in report.hosts.values()} == {HostStatus.SKIPPED}
    assert {h.error for h in report.hosts.values()} == {"run deadline of 0 s reached before start"}
    assert not any(t.ran for t in scripts.values())


async def test_memory_that_survives_a_gpu_reset_needs_a_reboot(tmp_path: Path) -> None:
    """--gpu-reset: the reset runs (no process holds the GPU), yet the memory stays: the host fails with
    `needs_reboot`, and nothing more is tried."""
    script = node_script(settle_mib=2048)
    script.insert(0, (("nvidia-smi", "-r"), Reply(stdout="GPU 00000000:18:00.0 was successfully reset.\nAll done.\n")))
    t = ScriptedTransport(script=script)
    report, _ = await run([make_host(settle_timeout=0.3)], {"gpu-01": t}, tmp_path, gpu_reset=True)
    host = report.hosts["gpu-01"]
    settle = next(s for s in host.steps if s.name is StepName.SETTLE)
    assert settle.status is StepStatus.FAILED
    assert settle.error is not None and settle.error.startswith("needs_reboot: gpu 0 holds 2048 MiB")
    assert [argv for argv in t.ran if argv[:2] == ("nvidia-smi", "-r")] == [("nvidia-smi", "-r")]
    assert host.status is HostStatus.FAILED
    assert host.reason is Reason.NEEDS_REBOOT and (host.error or "").startswith("settle: needs_reboot: gpu 0")
