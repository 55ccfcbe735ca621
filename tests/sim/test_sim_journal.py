"""The simulated journalctl against the real one: the same question on the same kernel messages gives the same
stdout, stderr and exit status as systemd 252 gave (tests/fixtures/journalctl, see its SOURCES.md), but for the
cursor's value (its seqnum id and boot id are the journal's own); and the simulated driver's Xid 45 for a worker
killed with GPU memory (NodeSpec `xid_on_kill`).

Each command runs as the SSH server runs it (`/bin/sh -c CMD` in the node's environment); every process a test
starts is ended by its pid (`make_node` stops the nodes).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.paths import FIXTURES
from support.sim_nodes import MakeNode, sh
from support.sim_nodes import make_node as make_node  # the fixture: nodes stopped after the test

from fleet.node.probes import kernel_log
from fleet.sim import NodeSpec, SimError, SimNode, WorkerSpec, pci, state
from fleet.transport.base import CommandResult

__all__ = ["make_node"]  # the fixture, imported for pytest

CAPTURES = FIXTURES / "journalctl"
CURSOR = re.compile(r"-- cursor: s=[0-9a-f]{32};i=[0-9a-f]+;b=[0-9a-f]{32};m=[0-9a-f]+;t=[0-9a-f]+;x=[0-9a-f]{16}")
LINE = re.compile(r"(\d+)\.(\d{6}) (\S+) kernel: (.*)")


def capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CAPTURES / f"{name}.json").read_text())
    return data


def records(stdout: str) -> list[state.KernelRecord]:
    """The kernel messages a capture printed, as the simulated node keeps them."""
    found: list[state.KernelRecord] = []
    for line in stdout.splitlines():
        match = LINE.fullmatch(line)
        if match:
            found.append({"usec": int(match[1]) * 1_000_000 + int(match[2]), "message": match[4]})
    return found


def node_like_the_capture(tmp_path: Path, name: str = "gpu-a01", journal: str = "ok") -> SimNode:
    """A node (set up, nothing started) whose kernel log holds what the captured journal held before the reset."""
    node = SimNode(tmp_path / name, NodeSpec(name=name, journal=journal))
    node.setup()
    write(node, records(capture("since-boot")["stdout"]))
    return node


def write(node: SimNode, kept: list[state.KernelRecord]) -> None:
    state.kern_log(node.root).write_text("".join(json.dumps(r) + "\n" for r in kept))


def ask(node: SimNode, argv: list[str]) -> tuple[str, str, int]:
    out = sh(node, shlex.join(argv))
    return out.stdout, out.stderr, out.returncode


def same_but_cursor(sim: str, real: str) -> None:
    """Line for line the same; a cursor line only in journalctl's form where the capture has one."""
    assert len(sim.splitlines()) == len(real.splitlines()), (sim, real)
    for mine, theirs in zip(sim.splitlines(), real.splitlines(), strict=True):
        if theirs.startswith("-- cursor: "):
            assert CURSOR.fullmatch(mine), mine
        else:
            assert mine == theirs


def cursor_of(stdout: str) -> str:
    return next(line.removeprefix("-- cursor: ") for line in stdout.splitlines() if line.startswith("-- cursor: "))


def test_a_whole_boot_read_as_journalctl_252_prints_it(tmp_path: Path) -> None:
    node = node_like_the_capture(tmp_path)
    real = capture("since-boot")
    out, err, status = ask(node, real["fleet_argv"])
    same_but_cursor(out, real["stdout"])
    assert (err, status) == (real["stderr"], real["exit_status"]) == ("", 0)


def messages(stdout: str) -> list[state.KernelRecord]:
    """The kernel messages of a capture's -a output, each as its bytes (surrogate-escaped), further lines joined."""
    found: list[state.KernelRecord] = []
    indent = 0
    for line in stdout.splitlines():
        match = LINE.fullmatch(line)
        if match:
            found.append({"usec": int(match[1]) * 1_000_000 + int(match[2]), "message": match[4]})
            indent = match.start(4)
        elif line.startswith(" ") and found:
            found[-1]["message"] += "\n" + line[indent:]
    return found


@pytest.mark.parametrize("name", ["bytes", "bytes-without-a"])
def test_messages_that_are_not_printable_utf8_as_journalctl_252_prints_them(tmp_path: Path, name: str) -> None:
    """The same bytes, printed as they are under -a, else `[N blob data]`, tabs spread and colours dropped."""
    node = SimNode(tmp_path / "gpu-a01", NodeSpec(name="gpu-a01"))
    node.setup()
    write(node, messages(capture("bytes")["stdout"]))
    real = capture(name)
    done = subprocess.run(["/bin/sh", "-c", shlex.join(real["fleet_argv"])], env=node.env(), cwd=node.root,
                          capture_output=True, timeout=30, check=False)
    same_but_cursor(done.stdout.decode("utf-8", "surrogateescape"), real["stdout"])
    assert (done.stderr, done.returncode) == (b"", real["exit_status"]) == (b"", 0)
    assert ("blob data" in real["stdout"]) is (name == "bytes-without-a")


def test_after_its_cursor_nothing_new_then_two_new_messages(tmp_path: Path) -> None:
    node = node_like_the_capture(tmp_path)
    first = ask(node, capture("since-boot")["fleet_argv"])[0]
    mark = cursor_of(first)
    for name, flags in (("after-cursor-nothing-new", []), ("quiet-after-cursor-nothing-new", ["-q"])):
        real = capture(name)
        out, err, status = ask(node, [*capture("since-boot")["fleet_argv"], f"--after-cursor={mark}", *flags])
        same_but_cursor(out, real["stdout"])
        assert cursor_of(out) == mark  # nothing after it: the cursor's own entry, as journalctl does
        assert (err, status) == (real["stderr"], real["exit_status"]) == ("", 0)
    real = capture("after-cursor-two-new")
    everything = records(capture("since-boot")["stdout"]) + records(real["stdout"])
    write(node, everything)
    out, err, status = ask(node, [*capture("since-boot")["fleet_argv"], f"--after-cursor={mark}"])
    same_but_cursor(out, real["stdout"])
    assert (err, status) == (real["stderr"], real["exit_status"])


def test_grep_matching_nothing_in_a_journal_read_to_its_end(tmp_path: Path) -> None:
    node = node_like_the_capture(tmp_path)
    write(node, records(capture("since-boot")["stdout"]) + records(capture("after-cursor-two-new")["stdout"]))
    real = capture("grep-no-match")
    out, err, status = ask(node, real["fleet_argv"])
    same_but_cursor(out, real["stdout"])
    assert (err, status) == (real["stderr"], real["exit_status"]) == ("", 1)


@pytest.mark.parametrize(
    ("journal", "name"),
    [("no_files", "no-journal-files"), ("no_permission", "no-permission"),
     ("no_permission", "quiet-no-permission")],
)
def test_a_journal_that_cannot_be_read_as_journalctl_252_says_it(tmp_path: Path, journal: str, name: str) -> None:
    node = node_like_the_capture(tmp_path, journal=journal)
    real = capture(name)
    assert ask(node, real["fleet_argv"]) == (real["stdout"], real["stderr"], real["exit_status"])


def test_a_cursor_it_cannot_seek_to(tmp_path: Path) -> None:
    node = node_like_the_capture(tmp_path)
    real = capture("bad-cursor")
    assert ask(node, real["fleet_argv"]) == (real["stdout"], real["stderr"], real["exit_status"])


def test_a_journalctl_built_without_pattern_matching_refuses_grep_only(tmp_path: Path) -> None:
    """The text of systemd's journalctl.c when built without PCRE2 (SOURCES.md); a read without --grep works."""
    node = node_like_the_capture(tmp_path, journal="no_pcre")
    out, err, status = ask(node, capture("grep-no-match")["fleet_argv"])
    assert (out, err, status) == ("", "Compiled without pattern matching support\n", 1)
    out, err, status = ask(node, capture("since-boot")["fleet_argv"])
    same_but_cursor(out, capture("since-boot")["stdout"])
    assert (err, status) == ("", 0)


def test_a_fresh_node_has_boot_messages_and_so_a_cursor(tmp_path: Path) -> None:
    """Every real boot logs kernel messages: a healthy simulated node's journal is read whole, with no Xid."""
    node = SimNode(tmp_path / "gpu-a02", NodeSpec(name="gpu-a02"))
    node.setup()
    out, err, status = ask(node, capture("since-boot")["fleet_argv"])
    assert (err, status) == ("", 0) and "NVRM: Xid" not in out and CURSOR.fullmatch(out.splitlines()[-1])
    with pytest.raises(SimError, match="unknown journal"):
        node.set_journal("broken")
    with pytest.raises(SimError, match="unknown journal"):
        NodeSpec(name="gpu-a03", journal="broken")


def test_fleets_read_through_the_simulated_journal(tmp_path: Path) -> None:
    """kernel_log.sh and xids.awk on the simulated journalctl: the since-boot read, then the one after its cursor."""
    node = node_like_the_capture(tmp_path)
    first = kernel_log.reading(run(node, kernel_log.read_argv()))
    assert [(x.code, x.count) for x in first.xids] == [(13, 3), (109, 1), (31, 1), (109, 1), (79, 1)]
    write(node, records(capture("since-boot")["stdout"]) + records(capture("after-cursor-two-new")["stdout"]))
    after = kernel_log.reading(run(node, kernel_log.read_argv(first.cursor)))
    assert [(x.code, x.pid) for x in after.xids] == [(45, 1818990), (45, 1818992)]
    node.set_journal("no_files")
    with pytest.raises(kernel_log.KernelLogUnread, match=r"^journalctl exited 1: No journal files were found\.$"):
        kernel_log.reading(run(node, kernel_log.read_argv()))


def run(node: SimNode, argv: list[str]) -> CommandResult:
    out, err, status = ask(node, argv)
    return CommandResult(argv=tuple(argv), exit_status=status, stdout=out, stderr=err, duration_s=0.1)


# --- the driver's Xid 45 for a worker killed with GPU memory ---------------------------------------------------


def xids_of(node: SimNode) -> list[str]:
    return [r["message"] for r in state.kernel_records(node.root) if "NVRM: Xid" in r["message"]]


def wait_for_xids(node: SimNode, count: int) -> list[str]:
    assert state.wait_for(lambda: len(xids_of(node)) >= count, 30.0), xids_of(node)
    return xids_of(node)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_worker_killed_with_gpu_memory_logs_xid_45_on_each_gpu(make_node: MakeNode, sig: signal.Signals) -> None:
    """SIGTERM: the worker's own end; SIGKILL: noticed by the next nvidia-smi, as the driver's teardown."""
    node = make_node(NodeSpec(name="gpu-k01", xid_on_kill=True, linger_s=0.1))
    pid = node.spawn_worker(WorkerSpec(gpus=(2, 5), mib=1000, name="a-very-long-process-name"))
    assert xids_of(node) == []
    os.kill(pid, sig)
    assert state.wait_for(lambda: not node.alive(pid), 30.0)
    sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv")
    # the kernel keeps 15 characters of a process name; one line a GPU, at its bus id
    text = f"pid={pid}, name=a-very-long-pro, Ch 00000001"
    assert wait_for_xids(node, 2) == [pci.xid_message(bus_of(node, gpu), 45, text) for gpu in (2, 5)]
    time.sleep(0.2)
    sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv")
    assert len(xids_of(node)) == 2  # noticed once


def bus_of(node: SimNode, gpu: int) -> str:
    return sh(node, f"nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i {gpu}").stdout.strip()


def gone(node: SimNode, pid: int, timeout: float = 30.0) -> bool:
    """Waits until `pid` no longer runs on `node`: False if it still does after `timeout` seconds."""
    return state.wait_for(lambda: not node.alive(pid), timeout)


def test_without_xid_on_kill_or_without_memory_no_xid_is_logged(make_node: MakeNode) -> None:
    quiet = make_node(NodeSpec(name="gpu-k02", linger_s=0.1))
    pid = quiet.spawn_worker(WorkerSpec(gpus=(0,), mib=1000))
    noisy = make_node(NodeSpec(name="gpu-k03", xid_on_kill=True, linger_s=0.1))
    idle = noisy.spawn_worker(WorkerSpec(gpus=(0,), mib=0, compute=False))
    for node, victim in ((quiet, pid), (noisy, idle)):
        os.kill(victim, signal.SIGKILL)
        assert gone(node, victim)
        sh(node, "nvidia-smi --query-gpu=index,memory.used --format=csv")
    time.sleep(0.2)
    assert xids_of(quiet) == [] and xids_of(noisy) == []
