"""The controller alone at 1,000 to 10,000 hosts: fleet's own CPU and memory a host, with no SSH at all.

What one admin node spends per host besides SSH (`percommand.py` measures that part): the task graph, the
steps and their parsers, the per-node JSONL logs, the run history (SQLite) and the report. Every host's
commands are answered in-process (`Replay`), replaying the real answers of simulated 8-GPU
nodes recorded once at the start (over SSH, `fleet.sim`), each in a later turn of the event loop as over a real
connection: a busy node (a serving unit on all 8 GPUs and a
stray python3 on GPU 0: drain, kill, settle polls, verify), an already clean one (the second reset of the
same node), an unhealthy one (an uncorrected ECC error: it fails its health gate) and an unreachable one
(the connection is refused). Hosts are 49% busy, 48% clean, 2% unhealthy, 1% unreachable.

Each size runs in a process of its own (`--one`), the real `run_and_report` (logs, history, summary.json,
the report rendered), all hosts at once, so its peak RSS is its own. Reported per size: fleet's CPU a host
(user+sys of the run, start-up excluded; each beside it: sys is the kernel's, most of it creating
the hosts' log files), wall time, peak RSS, the bytes of the per-node logs, the history
and summary.json, and how long the run waited at its end for the history's last writes (the history writer
is a thread: hosts never wait on it). CPU a host that stays flat from 1,000 to 10,000 shows nothing grows
with the fleet.

    python benchmarks/controller.py [--sizes 1000,5000,10000] [--json out.json]

Not a test (tests/logic/test_controller_bench.py runs 200 hosts once, checks outcomes, not times). Everything it
starts is ended, and its temp dir removed, on success, failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import anyio

from fleet.app.run import run_and_report
from fleet.engine.options import RunOptions
from fleet.engine.walk import Mode
from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.targeting import select
from fleet.model.errors import ConnectError
from fleet.model.report import HostStatus, Reason, RunReport
from fleet.reset import lock
from fleet.sim.fleetsim import SimFleet
from fleet.sim.node import NodeSpec, UnitSpec, WorkerSpec
from fleet.transport import batch, connect
from fleet.transport.base import CommandResult, OpenCommand, Transport
from fleet.transport.scripted import Reply

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
KINDS = ("busy", "clean", "unhealthy", "unreachable")
# Out of every 100 hosts.
MIX = {"busy": 49, "clean": 48, "unhealthy": 2, "unreachable": 1}
EXPECTED = {"busy": (HostStatus.CLEAN, None), "clean": (HostStatus.CLEAN, None),
            "unhealthy": (HostStatus.FAILED, Reason.HEALTH),
            "unreachable": (HostStatus.UNREACHABLE, Reason.CONNECT_REFUSED)}

# kind -> (the recorded host, [(argv, reply)] in the order asked)
Recording = dict[str, tuple[Host, list[tuple[list[str], dict[str, Any]]]]]


# --- recording real answers once ----------------------------------------------------------------------------


class Recorder:
    """A transport that passes every command through and records each (argv, answer); a batch section by
    section, as the replay will answer it."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.answers: list[tuple[list[str], dict[str, Any]]] = []

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        result = await self.inner.run(argv, timeout=timeout, privileged=privileged, stdin=stdin)
        parts, tag = batch.unbatch(argv), batch.tag_of(stdin)
        if parts is None or tag is None:
            self._keep(list(argv), result.exit_status, result.stdout, result.stderr)
            return result
        for (_, part), section in zip(parts, batch.sections(tag, len(parts), result.stdout, result.stderr),
                                      strict=True):
            if section is not None:
                self._keep(part, section.exit_status, section.stdout, section.stderr)
        return result

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        held = await self.inner.open_command(argv, timeout=timeout, privileged=privileged)
        self._keep(list(argv), 0, held.first_line + "\n", "")
        return held

    async def close(self) -> None:
        await self.inner.close()

    def _keep(self, argv: list[str], status: int | None, stdout: str, stderr: str) -> None:
        self.answers.append((argv, {"stdout": stdout, "stderr": stderr, "exit_status": status or 0}))


def node_spec(name: str, kind: str) -> NodeSpec:
    unit = UnitSpec(name="sglang.service", gpus=ALL, mib=70_000, process_name="sglang")
    stray = WorkerSpec(gpus=(0,), mib=1523, name="python3")
    return NodeSpec(name=name, units=(unit,), workers=(stray,), linger_s=0.3, protected_daemon=False,
                    ecc_error_gpus=(3,) if kind == "unhealthy" else ())


async def record(tmp: Path) -> Recording:
    """Reset a busy and an unhealthy simulated node over SSH, then the busy one again (now clean)."""
    specs = [node_spec("rec-busy", "busy"), node_spec("rec-sick", "unhealthy")]
    fast = {"drain_timeout": 5, "kill_grace": 2, "settle_timeout": 15}
    recording: Recording = {}
    recorders: list[Recorder] = []

    async def recording_connector(host: Host) -> Recorder:
        recorders.append(Recorder(await connect(host)))
        return recorders[-1]

    async with SimFleet(tmp / "record", specs, host_vars={s.name: fast for s in specs}) as sim:
        hosts = {h.name: h for h in select(load_inventory(sim.inventory_path), groups=["sim"])}
        for kind, name in (("busy", "rec-busy"), ("unhealthy", "rec-sick"), ("clean", "rec-busy")):
            _, report = await run_and_report([hosts[name]], RunOptions(mode=Mode.RESET), as_json=False,
                                             log_dir=tmp / "record-logs", connector=recording_connector)
            ended = report.hosts[name]
            if (ended.status, ended.reason) != EXPECTED[kind]:
                raise SystemExit(f"recording {kind}: {name} ended {ended.status}: {ended.error}")
            recording[kind] = (hosts[name], recorders[-1].answers)
    return recording


# --- replaying them for N hosts -----------------------------------------------------------------------------


def key(argv: Sequence[str]) -> tuple[str, ...]:
    """What identifies a command across hosts and runs: the lock's carries the run id, so only its program."""
    return ("fleet-lock",) if lock.is_lock_argv(argv) else tuple(argv)


Answers = dict[tuple[str, ...], tuple[Reply, ...]]


def replies(answers: list[tuple[list[str], dict[str, Any]]]) -> Answers:
    """A recording's answers by command, in the order asked: made once, every host of its kind replays them."""
    by_command: dict[tuple[str, ...], list[Reply]] = {}
    for argv, reply in answers:
        by_command.setdefault(key(argv), []).append(Reply(**reply))
    return {command: tuple(them) for command, them in by_command.items()}


@types.coroutine
def next_turn() -> Generator[None, None, None]:
    """Give the event loop one turn, as a real connection's answer does (what `anyio.lowlevel.checkpoint` comes
    to on asyncio, `asyncio.sleep(0)`, without its layers)."""
    yield


# A batch's argv -> its sections' commands (`key`), None for a command that is no batch: every host asks the same
# batches, unbatched once (the harness's own bookkeeping, not fleet's: the same for every run).
_SECTIONS: dict[tuple[str, ...], tuple[tuple[str, ...], ...] | None] = {}


def sections_of(argv: tuple[str, ...]) -> tuple[tuple[str, ...], ...] | None:
    found = _SECTIONS.get(argv, ())
    if found == ():
        parts = batch.unbatch(argv)
        found = _SECTIONS[argv] = None if parts is None else tuple(key(part) for _, part in parts)
    return found


class Replay:
    """One host's transport: each command answered with its kind's recorded answers (`replies`) in order, the last
    one again once they are used up (a poll that asks once more); a batch section by section, framed with its tag
    as batch.sh frames it. Every answer comes in a later turn of the event loop, as over a real connection (the
    loop's turns, and a host's work between two answers, are as over SSH), and costs about what a transport's
    handing over of the bytes does: none of the scripted transport's bookkeeping (`sent`, `ran`, prefixes)."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.asked: dict[tuple[str, ...], int] = {}  # how often each command was answered

    def reply(self, command: tuple[str, ...]) -> Reply:
        replies = self.answers.get(command)
        if replies is None:
            raise AssertionError(f"no recorded answer for {list(command)[:4]}")
        times = self.asked.get(command, 0)
        self.asked[command] = times + 1
        return replies[times] if times < len(replies) else replies[-1]

    async def run(self, argv: Sequence[str], *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> CommandResult:
        await next_turn()
        asked = tuple(argv)
        parts = sections_of(asked)
        if parts is None:
            reply = self.reply(key(asked))
            return CommandResult(argv=asked, exit_status=reply.exit_status, stdout=reply.stdout, stderr=reply.stderr,
                                 duration_s=0.0)
        tag = batch.tag_of(stdin)
        if tag is None:  # as batch.sh: no tag on stdin, nothing run
            return CommandResult(argv=asked, exit_status=2, stdout="", stderr="", duration_s=0.0)
        answered = [self.reply(part) for part in parts]
        out, err = batch.frame(tag, [(r.exit_status, r.stdout, r.stderr) for r in answered])
        return CommandResult(argv=asked, exit_status=0, stdout=out, stderr=err, duration_s=0.0)

    async def open_command(self, argv: Sequence[str], *, timeout: float, privileged: bool = False) -> OpenCommand:
        await next_turn()
        asked = tuple(argv)
        reply = self.reply(key(asked))
        first = reply.stdout.split("\n", 1)[0]
        ended = CommandResult(argv=asked, exit_status=reply.exit_status, stdout=reply.stdout, stderr=reply.stderr,
                              duration_s=0.0)
        if reply.exit_status == 0 and first:
            return OpenCommand(first, release=lambda: _released(ended))
        return OpenCommand(first, ended)

    async def close(self) -> None:
        pass


async def _released(result: CommandResult) -> CommandResult:
    return result


def kinds(count: int) -> list[str]:
    """Each host's kind, the MIX spread evenly."""
    pattern = [kind for kind in KINDS for _ in range(MIX[kind])]
    return [pattern[i % len(pattern)] for i in range(count)]


async def run_size(count: int, recording: Recording, tmp: Path) -> dict[str, Any]:
    """One reset of `count` hosts, each replaying its kind's recorded answers (with that host's variables)."""
    names = [f"n{i:05d}" for i in range(count)]
    kind_of = dict(zip(names, kinds(count), strict=True))
    hosts = [dataclasses.replace(recording[_recorded(kind_of[n])][0], name=n, address=n) for n in names]
    answers = {kind: replies(recorded) for kind, (_, recorded) in recording.items()}

    async def connector(host: Host) -> Replay:
        if kind_of[host.name] == "unreachable":
            raise ConnectError(f"connection refused ({host.address}:22)")
        return Replay(answers[kind_of[host.name]])

    log_dir = tmp / "logs"
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    _, report = await run_and_report(hosts, RunOptions(mode=Mode.RESET), as_json=False, log_dir=log_dir,
                                     connector=connector)
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_SELF)
    user, kernel = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cpu = user + kernel
    wrong = [n for n in names if (report.hosts[n].status, report.hosts[n].reason) != EXPECTED[kind_of[n]]]
    return {"hosts": count, "cpu_s": cpu, "cpu_ms_per_host": 1000 * cpu / count,
            "user_ms_per_host": 1000 * user / count, "sys_ms_per_host": 1000 * kernel / count, "wall_s": wall,
            "peak_rss_mb": after.ru_maxrss / 1024, **sizes(log_dir, report), "unexpected": len(wrong),
            "unexpected_example": _example(report, wrong)}


def _recorded(kind: str) -> str:
    return "busy" if kind == "unreachable" else kind


def sizes(log_dir: Path, report: RunReport) -> dict[str, float]:
    run_dir = next(log_dir.glob("*/summary.json")).parent
    logs = sum(p.stat().st_size for p in run_dir.glob("*.jsonl"))
    history = sum(p.stat().st_size for p in log_dir.glob("history.sqlite*"))
    return {"logs_mb": logs / 1e6, "history_mb": history / 1e6,
            "summary_mb": (run_dir / "summary.json").stat().st_size / 1e6}


def _example(report: RunReport, wrong: list[str]) -> str | None:
    if not wrong:
        return None
    host = report.hosts[wrong[0]]
    return f"{wrong[0]}: {host.status} {host.error}"


# --- the driver ---------------------------------------------------------------------------------------------


def one(count: int, recording_path: Path, tmp: Path) -> dict[str, Any]:
    recording = pickle.loads(recording_path.read_bytes())  # written by this script, just now
    return anyio.run(run_size, count, recording, tmp)


def main(sizes_: list[int], out: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="fleet-controller-") as tmp_dir:
        tmp = Path(tmp_dir)
        print("recording a busy, an unhealthy and an already clean simulated node over SSH ...", flush=True)
        recording_path = tmp / "recording.pickle"
        recording_path.write_bytes(pickle.dumps(anyio.run(record, tmp)))
        rows = []
        for count in sizes_:
            work = tmp / f"size-{count}"
            work.mkdir()
            done = subprocess.run([sys.executable, __file__, "--one", str(count), "--recording", str(recording_path),
                                   "--tmp", str(work)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{count} hosts: exit {done.returncode}\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.splitlines()[-1]))
            print(line(rows[-1]), flush=True)
    flat = [r["cpu_ms_per_host"] for r in rows]
    print(f"CPU a host from {rows[0]['hosts']} to {rows[-1]['hosts']} hosts: {flat[0]:.2f} -> {flat[-1]:.2f} ms "
          f"(ratio {flat[-1] / flat[0]:.2f}; flat is 1.0)")
    if out:
        out.write_text(json.dumps({"rows": rows}, indent=2))


def line(r: dict[str, Any]) -> str:
    return (f"{r['hosts']:>6} hosts  CPU {r['cpu_s']:7.2f} s ({r['cpu_ms_per_host']:.2f} ms/host: user "
            f"{r['user_ms_per_host']:.2f}, sys {r['sys_ms_per_host']:.2f})  wall "
            f"{r['wall_s']:6.1f} s  peak RSS {r['peak_rss_mb']:7.1f} MB  logs {r['logs_mb']:6.1f} MB  history "
            f"{r['history_mb']:5.1f} MB  summary.json {r['summary_mb']:5.1f} MB  unexpected {r['unexpected']}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--recording", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        os.environ.setdefault("FLEET_LOG_DIR", str(args.tmp))
        print(json.dumps(one(args.one, args.recording, args.tmp)))
        return
    main([int(s) for s in args.sizes.split(",")], args.json)


if __name__ == "__main__":
    cli()
