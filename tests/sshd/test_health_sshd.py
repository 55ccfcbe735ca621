"""The health gate's kernel log, end to end through a stock OpenSSH sshd (integration suite, marker `sshd`).

A simulated node whose journalctl cannot be read (no journal files, a user outside the journal's groups, a
journalctl built without pattern matching), whose kernel log holds an Xid storm (before the reset, or logged
during it), or whose driver logs Xid 45 for the processes the reset ends (`xid_on_kill`). Every node is stopped,
every process it started killed by pid; sshd is stopped by the fixture.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from support.sshd_nodes import NAME, MakeHost, kernel_reads, run, serving
from support.sshd_nodes import make_host as make_host  # the fixture: nodes stopped after the test

from fleet.engine.walk import Mode
from fleet.model.report import HostFinding, HostReport, HostStatus, Level, Reason
from fleet.sim import pci, state
from fleet.sim.node import SimNode, WorkerSpec

ALL = (0, 1, 2, 3, 4, 5, 6, 7)
FALLEN = "GPU has fallen off the bus."  # real text (tests/fixtures/kernel-log/message_xid-79-fallen-off-the-bus.log)
# A real Xid 13 line's text, no pid (tests/fixtures/kernel-log/gpud-readme_dmesg-ctime_xid-13-31-109.log)
XID_13 = ("pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal "
          "Instruction Parameter")
STORM = 8000  # Xid 13 lines: 1.4 MiB as journalctl prints them (more than the transport's 1 MiB)
IGNORE = "set health_ignore: [xid] to skip the Xid check"

def xid(gpu: int, code: int, text: str) -> str:
    return pci.xid_message(pci.bus_id(gpu), code, text)


def log_kernel(node: SimNode, messages: list[str]) -> None:
    """Append kernel messages now, in one write (a storm lands at once)."""
    now = int(time.time() * 1_000_000)
    lines = "".join(json.dumps({"usec": now + i, "message": m}) + "\n" for i, m in enumerate(messages))
    with state.kern_log(node.root).open("a") as log:
        log.write(lines)



def xid_findings(host: HostReport, gpu: int) -> list[tuple[Level, str]]:
    return [(f.level, f.detail) for f in host.gpus[gpu].health if f.check == "xid"]


async def when_drained(node: SimNode, then: Callable[[], None]) -> None:
    """Run `then` once drain has stopped the serving unit: after the reset's first reads."""
    for _ in range(400):  # 20 s at most: a file the node's unit supervisor writes, polled
        if node.unit_state("sglang.service") == "inactive":
            break
        await anyio.sleep(0.05)
    then()


# --- 1. a kernel log fleet could not read is never "no Xids" ------------------------------------------------


@pytest.mark.parametrize(
    ("journal", "why"),
    [("no_files", "journalctl exited 1: No journal files were found."),
     ("no_permission", "journalctl exited 1: Hint: You are currently not seeing messages from other users and the "
                       "system.")],
)
async def test_a_kernel_log_that_cannot_be_read_fails_the_host_unless_xids_are_ignored(
        make_host: MakeHost, tmp_path: Path, journal: str, why: str) -> None:
    """The node has an Xid 79 in its kernel log that journalctl cannot show: the host never ends clean."""
    node, host = make_host(serving(journal=journal, xids=((5, 79, FALLEN),)))
    for mode in (Mode.RESET, Mode.CHECK):
        result, _ = await run(host, tmp_path, mode)
        assert result.status is HostStatus.FAILED and result.reason is Reason.KERNEL_LOG, (mode, result.error)
        assert result.error == f"cannot read the kernel log on {NAME} ({why}): {IGNORE}"
        assert result.health == (HostFinding(check="xid", level=Level.FAIL,
                                             detail=f"cannot read the kernel log ({why})"),)
    ignoring = replace(host, health_ignore=("xid",))
    result, events = await run(ignoring, tmp_path)
    assert result.status is HostStatus.CLEAN and result.health == (), result.error
    assert kernel_reads(events) == []  # not judged, not read
    node.set_journal("ok")
    result, _ = await run(host, tmp_path)
    assert result.reason is Reason.HEALTH
    assert re.fullmatch(rf"gpu 5: Xid 79 at \d\d:\d\d:\d\d: {FALLEN[:-1]}", result.error or ""), result.error


async def test_a_journalctl_without_pattern_matching_still_shows_the_xid_79(make_host: MakeHost,
                                                                            tmp_path: Path) -> None:
    """`Compiled without pattern matching support`: fleet never asks --grep, and reads the Xid anyway."""
    _, host = make_host(serving(journal="no_pcre", xids=((5, 79, FALLEN),)))
    result, _ = await run(host, tmp_path)
    assert result.status is HostStatus.FAILED and result.reason is Reason.HEALTH
    assert result.error is not None and result.error.startswith("gpu 5: Xid 79 at ")


async def test_a_kernel_log_unreadable_only_as_the_reset_began_cannot_tell_during_from_before(
        make_host: MakeHost, tmp_path: Path) -> None:
    """The baseline read failed, verify's read since boot worked: old Xids are judged, but "during the reset" cannot
    be told, and the host says so."""
    node, host = make_host(serving(journal="no_files"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(when_drained, node, lambda: node.set_journal("ok"))
        result, _ = await run(host, tmp_path)
    assert result.reason is Reason.KERNEL_LOG
    assert result.error == (f"cannot read the kernel log on {NAME} (as the reset began: journalctl exited 1: No "
                            f"journal files were found.): {IGNORE}")


# --- 2. an Xid storm never hides the Xid that matters ------------------------------------------------------


async def test_more_than_a_mib_of_xid_13_before_an_xid_79(make_host: MakeHost, tmp_path: Path) -> None:
    """8,000 Xid 13 lines since boot (1.4 MiB as journalctl prints them), then an Xid 79: the read is a few hundred
    bytes, the 79 fails the host (reset and check), the storm is one warning with its count."""
    def storm(node: SimNode) -> None:
        log_kernel(node, [xid(0, 13, XID_13)] * STORM + [xid(5, 79, FALLEN)])

    _, host = make_host(serving(), before_start=storm)
    for mode in (Mode.RESET, Mode.CHECK):
        result, events = await run(host, tmp_path, mode)
        assert result.status is HostStatus.FAILED and result.reason is Reason.HEALTH, (mode, result.error)
        assert result.error is not None and result.error.startswith("gpu 5: Xid 79 at ")
        ((level, detail),) = xid_findings(result, 0)
        assert level is Level.WARN and f"Graphics Engine Exception ({STORM} times, last at " in detail
        (read,) = [e for e in kernel_reads(events) if e["step"] == ("drain" if mode is Mode.RESET else "verify")]
        assert read["exit_status"] == 0 and len(read["stdout"]) < 1024  # what crossed the wire, whole in the log


async def test_a_storm_during_the_reset_never_hides_the_xid_79_after_it(make_host: MakeHost, tmp_path: Path) -> None:
    """Logged once drain has stopped the unit: 8,000 Xid 13 naming no process on GPU 0 (which the stopped unit
    held: a warning), then an Xid 79 on GPU 3 (a failure). verify reads only what came after the baseline's cursor,
    summarised."""
    node, host = make_host(serving())
    async with anyio.create_task_group() as tg:
        tg.start_soon(when_drained, node, lambda: log_kernel(node, [xid(0, 13, XID_13)] * STORM + [xid(3, 79, FALLEN)]))
        result, events = await run(host, tmp_path)
    assert result.status is HostStatus.FAILED and result.reason is Reason.HEALTH
    assert result.error is not None and result.error.startswith("gpu 3: Xid 79 at ")
    assert result.error.endswith(f"{FALLEN[:-1]} during the reset")
    ((level, detail),) = xid_findings(result, 0)
    assert level is Level.WARN and f"({STORM} times, last at " in detail
    assert detail.endswith(" during the reset, naming no process, on the GPU of pid "
                           f"{detail.split('on the GPU of pid ')[1].split()[0]} sglang, which the reset stopped")
    (during,) = [e for e in kernel_reads(events) if e["step"] == "verify"]
    assert during["argv"][-1].startswith("s=") and len(during["stdout"]) < 1024


async def test_an_xid_on_no_listed_gpu_is_the_hosts_with_its_pci_address(make_host: MakeHost, tmp_path: Path) -> None:
    """An NVSwitch's Xid 74 (PCI 0000:05:00, no GPU there): a host finding naming the address, in the error too."""
    _, host = make_host(serving(), before_start=lambda node: log_kernel(
        node, ["NVRM: Xid (PCI:0000:05:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected"]))
    result, _ = await run(host, tmp_path)
    assert result.reason is Reason.HEALTH
    assert result.error is not None and result.error.startswith("PCI 0000:05:00 (no listed GPU): Xid 74 at ")
    (finding,) = result.health
    assert (finding.pci, finding.level, finding.check) == ("0000:05:00", Level.FAIL, "xid")
    assert all(not g.health for g in result.gpus)


# --- 3. fleet's own kill is not a hardware fault -------------------------------------------------------------


async def test_xid_45_for_the_processes_the_reset_ended_only_warns(make_host: MakeHost, tmp_path: Path) -> None:
    """The driver logs Xid 45 for the unit's process drain stopped (8 GPUs) and the stray fleet killed (GPU 1):
    clean, each named in a warning."""
    node, host = make_host(serving(xid_on_kill=True))
    stray = node.spawn_worker(WorkerSpec(gpus=(1,), mib=1523, name="python3"))
    unit_pid = node.unit_main_pid("sglang.service")
    result, _ = await run(host, tmp_path)
    assert result.status is HostStatus.CLEAN, result.error
    assert stray in {k.pid for k in result.killed}
    assert all(any(f"pid {unit_pid} sglang, which the reset stopped" in d for _, d in xid_findings(result, gpu))
               for gpu in ALL)
    assert [(lv, d.split(": ", 1)[1]) for lv, d in xid_findings(result, 1) if "python3" in d] == [
        (Level.WARN, f"Preemptive cleanup, due to previous errors during the reset: pid {stray} python3, which "
                     "fleet killed")]
    assert all(lv is Level.WARN for gpu in ALL for lv, _ in xid_findings(result, gpu))


async def test_an_application_xid_of_a_process_the_reset_did_not_end_fails(make_host: MakeHost, tmp_path: Path) -> None:
    """The same Xid 45 during the reset, for a pid the reset did not end: a failure."""
    node, host = make_host(serving(xid_on_kill=True))
    other = xid(6, 45, "pid=999999, name=other, Ch 00000002")
    async with anyio.create_task_group() as tg:
        tg.start_soon(when_drained, node, lambda: log_kernel(node, [other]))
        result, _ = await run(host, tmp_path)
    assert result.status is HostStatus.FAILED and result.reason is Reason.HEALTH
    assert result.error is not None and result.error.startswith("gpu 6: Xid 45 at ")
    assert result.error.endswith("Preemptive cleanup, due to previous errors during the reset")
