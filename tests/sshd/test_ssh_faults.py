"""SSH faults through the real OpenSSH sshd (integration suite, marker `sshd`): one host never takes the run
down, and a session that goes silent is noticed once.

A silent session is made by SIGSTOPping every process below the test's own sshd (found by walking /proc
from its recorded pid, never by name): TCP stays up and nothing answers, as with a flaky switch or a wedged
node. The stopped processes are continued in teardown, and the sshd fixture then kills them by pid.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest
from support.keys import ClientKey
from support.sshd import Sshd
from support.waits import eventually, line_within

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.model.errors import SessionSilent
from fleet.model.report import Reason
from fleet.node.node import is_remote_command
from fleet.reset import lock, verdict_time
from fleet.sim.node import NodeSpec, SimNode, UnitSpec
from fleet.transport import batch
from fleet.transport.base import CommandResult, Note, OpenCommand
from fleet.transport.ssh import SshTransport, open_ssh

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
# A broken line of each kind OpenSSH skips: a marker with nothing after it, a hashed entry cut short.
SOME_KEY = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
CORRUPT_LINES = ("@cert-authority", f"|1|SGVsbG8gd29ybGQ= {SOME_KEY}")


def children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(root: int) -> list[int]:
    """Pids below root in the process tree, from /proc."""
    children, found, todo = children_by_parent(), [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def started(pid: int) -> str | None:
    """When the process `pid` started (field 22 of /proc/PID/stat), None when there is none: with its pid, which
    process this is (a pid is used again once its process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass
class Freezer:
    """SIGSTOPs everything below one sshd (its sessions and what they run); at the end kills each process it
    stopped that is still that process (its pid and start time). Not thawed and left to the sshd fixture: a
    session continued after its client left exits at once, its commands (a hung nvidia-smi bounded at minutes) go
    to init, out of reach of a kill of sshd's descendants."""

    sshd_pid: int
    stopped: list[tuple[int, str]] = field(default_factory=list)  # (pid, start time)

    def freeze(self) -> None:
        pids = descendants(self.sshd_pid)
        assert pids, "no ssh session to freeze"
        for pid in pids:
            start = started(pid)
            if start is None:  # gone already
                continue
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append((pid, start))

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def end(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: signal.Signals) -> None:
        for pid, start in self.stopped:
            if started(pid) == start:
                with suppress(ProcessLookupError):
                    os.kill(pid, signum)


@pytest.fixture
def freezer(sshd: Sshd) -> Iterator[Freezer]:
    frozen = Freezer(sshd.process.pid)
    yield frozen
    frozen.end()  # before the sshd fixture's teardown kills what is left below it by pid


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Callable[[NodeSpec], SimNode]]:
    nodes: list[SimNode] = []

    def make(spec: NodeSpec) -> SimNode:
        sim = SimNode(tmp_path / spec.name, spec)
        nodes.append(sim)
        sim.setup()
        sim.start()
        return sim

    try:
        yield make
    finally:
        for sim in nodes:
            sim.stop()


def node_host(sshd: Sshd, client_key: ClientKey, node: SimNode, **host_vars: Any) -> Host:
    """The host entry for a simulated node behind the real sshd (its tools first on PATH)."""
    env = node.env()
    sshd.authorize(client_key.public_line, environment={"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"]})
    settings: dict[str, Any] = {
        "address": "127.0.0.1", "port": sshd.port, "user": getpass.getuser(), "identity_file": str(client_key.path),
        "known_hosts": str(sshd.known_hosts), "gpus": 8, "devices": (node.devices_glob,),
        "nvidia_smi": node.nvidia_smi_path, "drain_timeout": 5, "kill_grace": 2, "settle_timeout": 15,
        "connect_timeout": 5, "lock_file": node.lock_file, **host_vars,
    }
    return Host(name=node.spec.name, **settings)


@dataclass
class Run:
    """What `fleet reset` left: its exit status, summary.json and each host's log."""

    exit_status: int
    log_dir: Path

    @property
    def summary(self) -> dict[str, Any]:
        (path,) = self.log_dir.glob("*/summary.json")
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    def host(self, name: str) -> dict[str, Any]:
        host: dict[str, Any] = self.summary["hosts"][name]
        return host

    def events(self, name: str, event: str | None = None) -> list[dict[str, Any]]:
        (path,) = self.log_dir.glob(f"*/{name}.jsonl")
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [e for e in lines if event is None or e["event"] == event]


async def fleet_reset(hosts: Sequence[Host], log_dir: Path, **options: Any) -> Run:
    """One `fleet reset` run as the CLI makes it (report, summary.json, per-host logs)."""
    connector, handle_signals = options.pop("connector", None), options.pop("handle_signals", False)
    status, _ = await run_and_report(hosts, RunOptions(mode=Mode.RESET, **options), as_json=False, log_dir=log_dir,
                                     connector=connector, handle_signals=handle_signals)
    return Run(status, log_dir)


# --- known_hosts: read as OpenSSH reads it ---------------------------------------------------------


@pytest.fixture
def unit_node(make_node: Callable[[NodeSpec], SimNode]) -> SimNode:
    return make_node(NodeSpec(name="gpu-s01", linger_s=0.5,
                              units=(UnitSpec(name="sglang.service", gpus=ALL, mib=30000, process_name="sglang"),)))


async def test_corrupt_known_hosts_lines_are_skipped_and_said_once(
    sshd: Sshd, client_key: ClientKey, unit_node: SimNode, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("\n".join(CORRUPT_LINES) + "\n# a comment\n\n" + sshd.known_hosts.read_text())
    host = node_host(sshd, client_key, unit_node, services=("sglang.service",), known_hosts=str(known_hosts))

    run = await fleet_reset([host], tmp_path / "logs")

    assert run.host("gpu-s01")["status"] == "clean", run.host("gpu-s01")["error"]
    assert run.exit_status == 0
    skipped = run.events("gpu-s01", "known_hosts_skipped")
    assert [(e["path"], e["lines"]) for e in skipped] == [(str(known_hosts), [1, 2])]


async def test_known_hosts_without_a_usable_line_is_unreachable_and_the_others_run(
    sshd: Sshd, client_key: ClientKey, unit_node: SimNode, tmp_path: Path
) -> None:
    broken = tmp_path / "broken_known_hosts"
    broken.write_text("# nothing here can be read\n" + "\n".join(CORRUPT_LINES) + "\n")
    good = node_host(sshd, client_key, unit_node, services=("sglang.service",))
    bad = Host(name="gpu-s09", address=good.address, port=good.port, user=good.user,
               identity_file=good.identity_file, known_hosts=str(broken))

    run = await fleet_reset([bad, good], tmp_path / "logs")

    assert run.host("gpu-s01")["status"] == "clean", run.host("gpu-s01")["error"]
    assert run.host("gpu-s09")["status"] == "unreachable"
    assert run.host("gpu-s09")["error"] == (
        f"known_hosts file {broken} has no line that can be read (lines skipped: 2, 3): "
        "no host key of 127.0.0.1 can be checked"
    )
    assert run.summary["summary"]["total"] == 2


# --- a session that goes silent -------------------------------------------------------------------


def runs(argv: Sequence[str], *prefix: str) -> bool:
    """Whether a command on the wire is (or, a batch, holds) one that starts with prefix."""
    batched = batch.unbatch(argv)
    parts = [part for _, part in batched] if batched else [list(argv)]
    return any(tuple(part[:len(prefix)]) == prefix for part in parts)


@dataclass
class FreezeBefore:
    """The real SSH transport, whose sshd is frozen just before the first command `when` picks."""

    inner: SshTransport
    when: Callable[[Sequence[str]], bool]
    freeze: Callable[[], None]
    before: list[tuple[str, ...]] = field(default_factory=list)  # commands run before the freeze
    after: list[tuple[str, ...]] = field(default_factory=list)  # commands tried once frozen

    @property
    def notes(self) -> tuple[Note, ...]:
        return self.inner.notes

    def _note(self, argv: Sequence[str]) -> None:
        frozen = bool(self.after) or self.when(argv)
        if frozen and not self.after:
            self.freeze()
        (self.after if frozen else self.before).append(tuple(argv))

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        self._note(argv)
        return await self.inner.run(argv, timeout=timeout, privileged=privileged, stdin=stdin)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        self._note(argv)
        return await self.inner.open_command(argv, timeout=timeout, privileged=privileged)

    async def close(self) -> None:
        await self.inner.close()


# The silent session's row of the time-to-verdict table (docs/operating.md): from the moment the session stops
# answering, the first keepalive request, its silence bound and the look that sees it passed.
SILENT = next(way for way in verdict_time.WAYS if way.verdict.endswith(str(Reason.SILENT_SESSION)))
# The row's seconds for these fixtures' hosts (connect_timeout 5: under the floor), plus a margin for a loaded machine.
SILENT_WITHIN_S = SILENT.seconds(Host(name="gpu-s01", address="127.0.0.1", connect_timeout=5)) + 4


@pytest.mark.timeout(90)
async def test_session_silent_mid_reset_fails_the_host_and_tries_nothing_more(
    sshd: Sshd, client_key: ClientKey, unit_node: SimNode, freezer: Freezer, tmp_path: Path
) -> None:
    """Frozen once drain is running, before its first poll: the channel is never confirmed and the keepalive
    requests go unanswered. The host ends within the silence bound, not the 60 s command timeout (nor the
    lock's minutes), and nothing else is tried."""
    host = node_host(sshd, client_key, unit_node, services=("sglang.service",), command_timeout=60)
    transports: list[FreezeBefore] = []
    frozen_at: list[float] = []

    def freeze() -> None:
        freezer.freeze()
        frozen_at.append(time.monotonic())

    async def connector(target: Host) -> FreezeBefore:
        transports.append(FreezeBefore(await open_ssh(target), lambda a: runs(a, "systemctl", "show"), freeze))
        return transports[0]

    with anyio.fail_after(SILENT_WITHIN_S + 10):  # a guard: the command alone would wait out 63 s
        run = await fleet_reset([host], tmp_path / "logs", connector=connector)
    assert time.monotonic() - frozen_at[0] <= SILENT_WITHIN_S  # the table's row, from the moment it stopped answering

    assert run.host("gpu-s01")["status"] == "failed"
    assert run.host("gpu-s01")["error"] == "ssh session to gpu-s01 went silent during drain"
    assert run.host("gpu-s01")["reason"] == "silent_session"
    (proxy,) = transports
    assert proxy.inner.silent and len(proxy.after) == 1, proxy.after
    logged = [tuple(e["argv"]) for e in run.events("gpu-s01") if is_remote_command(e)]
    assert logged == [argv for argv in proxy.before if not lock.is_lock_argv(argv)]  # the lock is logged on its release
    assert [e["event"] for e in run.events("gpu-s01")][-3:] == ["lock_released", "transport_error", "host_end"]


@pytest.mark.timeout(90)
async def test_session_paused_8s_mid_step_then_answering_is_slow_not_silent(
    sshd: Sshd, client_key: ClientKey, unit_node: SimNode, freezer: Freezer, tmp_path: Path
) -> None:
    """The same freeze, continued after 8 s (an sshd starved of CPU, a node under memory pressure): past the
    first keepalive request, well past the old 5 s open bound, but the server answers within the step's
    budget. The host ends clean; drain's poll simply answered late."""
    host = node_host(sshd, client_key, unit_node, services=("sglang.service",), drain_timeout=30)
    frozen = anyio.Event()
    transports: list[FreezeBefore] = []

    def freeze() -> None:
        freezer.freeze()
        frozen.set()

    async def connector(target: Host) -> FreezeBefore:
        transports.append(FreezeBefore(await open_ssh(target), lambda a: runs(a, "systemctl", "show"), freeze))
        return transports[0]

    async def thaw_after_8s() -> None:
        await frozen.wait()
        await anyio.sleep(8)
        freezer.thaw()

    async with anyio.create_task_group() as tg:
        tg.start_soon(thaw_after_8s)
        run = await fleet_reset([host], tmp_path / "logs", connector=connector)

    result = run.host("gpu-s01")
    assert (result["status"], result["error"], result["reason"]) == ("clean", None, None)
    (proxy,) = transports
    assert not proxy.inner.silent and proxy.after
    polls = [e for e in run.events("gpu-s01", "command") if tuple(e["argv"][:2]) == ("systemctl", "show")]
    assert polls[0]["duration_s"] >= 8 - 0.5, polls[0]  # it really waited out the pause


@pytest.fixture
async def ssh(sshd: Sshd, client_key: ClientKey) -> AsyncIterator[SshTransport]:
    sshd.authorize(client_key.public_line)
    host = Host(name="gpu-b02", address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
                identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), connect_timeout=2)
    transport = await open_ssh(host)
    yield transport
    await transport.close()


async def test_silent_mid_command_is_noticed_once_then_nothing_touches_the_wire(
    ssh: SshTransport, freezer: Freezer, tmp_path: Path
) -> None:
    """Frozen while a command runs: no exit status by its client deadline, and no keepalive request is
    answered either: SessionSilent. Every later command fails at once, and close does not wait."""
    pidfile = tmp_path / "pid"

    async def freeze_once_started() -> None:
        await line_within(pidfile, 20)
        freezer.freeze()

    with anyio.fail_after(SILENT_WITHIN_S + 10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(freeze_once_started)
            with pytest.raises(SessionSilent, match=r"^ssh session to gpu-b02 went silent$"):
                await ssh.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], timeout=1)
    started = time.monotonic()
    with pytest.raises(SessionSilent):
        await ssh.run(["true"], timeout=5)
    with pytest.raises(SessionSilent):
        await ssh.open_command(["cat"], timeout=5)
    await ssh.close()
    assert time.monotonic() - started < 5  # at once: neither waited out its 5 s bound


@pytest.mark.timeout(90)
async def test_channel_never_confirmed_is_silent_within_the_silence_bound(ssh: SshTransport, freezer: Freezer) -> None:
    """The lock's command has a bound of minutes; a channel the frozen server never confirms is silence once
    a keepalive request goes unanswered for the silence bound, not at the command's deadline."""
    assert (await ssh.run(["true"], timeout=5)).ok
    freezer.freeze()
    started = time.monotonic()
    with anyio.fail_after(SILENT_WITHIN_S + 10), pytest.raises(SessionSilent):
        await ssh.open_command(["sh", "-c", "echo locked; exec cat"], timeout=600)
    assert time.monotonic() - started < SILENT_WITHIN_S
    await ssh.close()


@pytest.mark.parametrize("cut", ["deadline", "interrupt"])
async def test_deadline_and_interrupt_end_the_run_within_seconds_while_the_session_is_silent(
    cut: str, sshd: Sshd, client_key: ClientKey, make_node: Callable[[NodeSpec], SimNode], freezer: Freezer,
    tmp_path: Path
) -> None:
    """A wedged nvidia-smi (60 s command timeout) behind a session frozen mid-command: `--deadline` or Ctrl-C ends
    the run within seconds, whatever it waits on, and summary.json is written. The first nvidia-smi a reset runs
    is the drain's baseline read of the memory (bounded by nvidia-smi's own bound, 3 x command_timeout):
    the session is frozen while that read hangs."""
    node = make_node(NodeSpec(name="gpu-s02", smi_mode="hang"))
    host = node_host(sshd, client_key, node, command_timeout=60, settle_timeout=60)
    deadline = 10.0 if cut == "deadline" else None
    frozen_at: list[float] = []

    async def freeze_mid_command() -> None:  # the baseline's nvidia-smi hangs: freeze the session around it
        assert await eventually(lambda: any("nvidia_smi" in cmdline(p) for p in descendants(sshd.process.pid)), 8)
        freezer.freeze()
        frozen_at.append(time.monotonic())
        if cut == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)

    started = time.monotonic()
    with anyio.fail_after(10 + 8):  # a guard: today the shielded waits add about 19 s after the cut
        async with anyio.create_task_group() as tg:
            tg.start_soon(freeze_mid_command)
            run = await fleet_reset([host], tmp_path / "logs", deadline_s=deadline, handle_signals=True)
    ended = time.monotonic()
    assert frozen_at, "the baseline's nvidia-smi never ran"
    cut_at = started + deadline if deadline else frozen_at[0]
    assert ended - cut_at < 6
    result = run.host("gpu-s02")
    reason = "run deadline of 10 s reached" if deadline else "interrupted"
    assert (result["status"], result["error"]) == ("failed", f"{reason} during drain")
    assert run.exit_status == (1 if deadline else 130)
