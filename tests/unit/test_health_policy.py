"""The health gate's policy: defaults, a host's say over them, and findings on real captures."""

from __future__ import annotations

import calendar
import dataclasses
import json
import time
from pathlib import Path

import pytest
from support.paths import FIXTURES, REPO

from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.model.errors import InventoryError
from fleet.model.health_checks import TABLE, by_name, names
from fleet.model.report import KilledProcess
from fleet.node.probes.health import GpuHealth, parse_health
from fleet.node.probes.kernel_log import Xid, parse_xids
from fleet.node.probes.smi import ComputeApp, GpuRow
from fleet.reset.health_gate import (
    XID_ACTION,
    XID_APPLICATION,
    XID_NAMES,
    XID_RESOLVABLE,
    Ended,
    Finding,
    HealthPolicy,
    HostFinding,
    Judgement,
    KernelReads,
    Level,
    fails,
    judge,
)

SMI = FIXTURES / "nvidia-smi"
KLOG = FIXTURES / "kernel-log"
DEFAULTS = HealthPolicy()
BUS = "00000000:83:00.0"  # the H200 capture's GPU
PCI = "0000:83:00"
T0 = 11 * 3600 + 2 * 60 + 13  # 11:02:13 UTC on 1970-01-01


def fixture(path: Path) -> str:
    return path.read_bytes().decode()


def gpu(bus_id: str = BUS, /, **facts: object) -> GpuHealth:
    """The real H200 idle capture's GPU, at `bus_id`, with `facts` changed."""
    (h200,) = parse_health(fixture(SMI / "h200_drv590.48.01_1gpu_q_idle.txt"))
    return dataclasses.replace(h200, bus_id=bus_id).said(**facts)


def message_xids(name: str, at: float) -> tuple[Xid, ...]:
    """A kernel-log fixture of bare messages, stamped `at` as journalctl -o short-unix would."""
    return parse_xids("".join(f"{at} node kernel: {line}\n" for line in fixture(KLOG / name).splitlines()))


def ctime_epoch(ctime: str) -> int:
    return calendar.timegm(time.strptime(ctime, "%a %b %d %H:%M:%S %Y"))


def judged(gpus: list[GpuHealth] | tuple[GpuHealth, ...], before: tuple[Xid, ...] | list[Xid] = (),
           during: tuple[Xid, ...] | list[Xid] = (), policy: HealthPolicy = DEFAULTS, *,
           ended: Ended | None = None, unread: str | None = None) -> Judgement:
    return judge(gpus, KernelReads(tuple(before), tuple(during), unread), policy, ended=ended)


def only(found: Judgement, key: str = BUS) -> tuple[Finding, ...]:
    """The findings of the one GPU listed; nothing on the host."""
    assert set(found.gpus) == {key} and not found.host_findings, found
    return tuple(found.gpus[key])


# --- the checks and their defaults ------------------------------------------------


def test_each_check_is_one_row() -> None:
    """One row a check: a name of its own, why and what it reads said, a rank of its own (1 the most telling), and
    a GPU's facts read into a finding by every check but the kernel log's and the settings' (judged against the
    host's profile: tests/unit/test_gpu_profile.py)."""
    assert len(set(names())) == len(TABLE) and all(by_name(name).name == name for name in names())
    assert all(c.why.strip() and c.reads.strip() for c in TABLE)
    assert sorted(c.rank for c in TABLE) == list(range(1, len(TABLE) + 1))
    assert [c.name for c in TABLE if c.finding is None] == ["gpu_settings", "xid"]


def test_the_host_variables_and_the_policy_accept_the_checks_of_the_table(tmp_path: Path) -> None:
    """`health_warn` and `health_ignore` accept every check of the table and nothing else (their error lists the
    table), and so does the policy."""
    known = names()
    listed = ", ".join(known)
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults: {{health_warn: [{listed}], health_ignore: [{listed}]}}\nhosts: {{n1: null}}\n")
    (host,) = load_inventory(path).hosts.values()
    assert host.health_warn == host.health_ignore == known
    assert HealthPolicy.of(host) == HealthPolicy(warn=frozenset(known), ignore=frozenset(known))
    for variable in ("health_warn", "health_ignore"):
        path.write_text(f"hosts: {{n1: {{{variable}: [xid, pcie_speed]}}}}\n")
        with pytest.raises(InventoryError, match=rf"{variable}\[1\]: unknown health check 'pcie_speed' "
                                                 rf"\(known: {listed}\)"):
            load_inventory(path)
    with pytest.raises(ValueError, match=rf"unknown health check\(s\) pcie_speed \(known: {listed}\)"):
        HealthPolicy(ignore=frozenset({"xid", "pcie_speed"}))


def test_the_policy_judges_by_the_table() -> None:
    """Each GPU check's finding weighs its row's default, and fails rank by the rows' ranks."""
    sick = gpu(ecc_uncorrected=1, ecc_corrected=1, retired_pending=True, remap_pending=True, remap_failed=True,
               persistence=False, fabric_status="Failure", pcie_width=8, power_limit_w=450.0)
    found = only(judged([sick], [Xid(at=T0, pci=PCI, code=79, detail="GPU has fallen off the bus.")]))
    assert [(f.check, f.level) for f in found] == [(c.name, c.default) for c in TABLE]
    failing = sorted((c for c in TABLE if c.default is Level.FAIL), key=lambda c: c.rank)
    assert [f.check for f in fails({BUS: found})] == [c.name for c in failing]


def test_default_levels_follow_nvidia_docs() -> None:
    warn = {"ecc_corrected", "persistence", "gpu_settings"}
    assert {c.name for c in TABLE if c.default is Level.WARN} == warn
    assert all(c.default is Level.FAIL for c in TABLE if c.name not in warn)
    assert {48, 63, 64, 74, 79, 92, 94, 95} <= XID_ACTION
    assert not {13, 31, 43, 45, 68, 69} & XID_ACTION  # application errors: restart the application
    assert {13, 31, 43, 45} == XID_APPLICATION and XID_RESOLVABLE == {63, 64} <= XID_ACTION
    assert set(XID_NAMES) == {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 154}


def test_policy_downgrades_and_ignores() -> None:
    policy = HealthPolicy(warn=frozenset({"pcie_width"}), ignore=frozenset({"persistence"}))
    assert policy.level("pcie_width", Level.FAIL) is Level.WARN
    assert policy.level("persistence", Level.WARN) is None
    assert policy.level("xid", Level.FAIL) is Level.FAIL
    assert policy.level("xid", Level.WARN) is Level.WARN  # a warning never becomes a failure


def test_policy_refuses_an_unknown_check() -> None:
    with pytest.raises(ValueError, match=r"unknown health check.*pcie_speed"):
        HealthPolicy(warn=frozenset({"pcie_speed"}))


def test_policy_of_a_host() -> None:
    host = Host(name="gpu-01", address="gpu-01", health_warn=("fabric",), health_ignore=("xid", "persistence"))
    assert HealthPolicy.of(host) == HealthPolicy(warn=frozenset({"fabric"}), ignore=frozenset({"xid", "persistence"}))
    assert HealthPolicy.of(Host(name="gpu-02", address="gpu-02")) == DEFAULTS


# --- real captures -----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["h200_drv590.48.01_1gpu_q_idle.txt", "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt"]
)
def test_healthy_hopper_nodes_have_no_finding(name: str) -> None:
    gpus = parse_health(fixture(SMI / name))
    assert judged(gpus) == Judgement(gpus={g.bus_id: () for g in gpus})


def test_a100_with_persistence_off_only_warns() -> None:
    """Driver 460 prints no Fabric section: the fabric is not judged, not failed."""
    gpus = parse_health(fixture(SMI / "8x-a100-sxm4-40gb_drv460.32.03_q_idle-persistence-off_gpu1-and-gpu5-of-8.txt"))
    off = (Finding("persistence", Level.WARN, "persistence mode off"),)
    assert judged(gpus).gpus == {"00000001:00:00.0": off, "0000000B:00:00.0": off}
    assert fails(judged(gpus)) == []


def a100_after_xid_63() -> tuple[GpuHealth, ...]:
    text = fixture(SMI / "8x-a100-sxm4-80gb_drv510.73.08_q_excerpt-remap-pending-after-xid63.txt")
    return parse_health("".join(line for line in text.splitlines(keepends=True) if line.strip() != "[...]"))


def test_a100_after_xid_63_fails_on_the_pending_remap_and_the_xid() -> None:
    xids = message_xids("a100-sxm4-80gb_message_xid-63-row-remapper.log", T0)
    assert judged(a100_after_xid_63(), xids) == Judgement(gpus={"00000000:10:1C.0": (
        Finding("ecc_corrected", Level.WARN, "177 correctable ECC errors (volatile)"),
        Finding("remap_pending", Level.FAIL, "row remapping pending: reset the GPU to apply"),
        Finding("gpu_settings", Level.WARN, "not observed: persistence mode, compute mode, MIG mode, power limit, "
                                            "clock event reason Applications Clocks Setting (nvidia-smi did not say "
                                            "them)"),  # an excerpt of -q: never read as "fine"
        Finding("xid", Level.FAIL, "Xid 63 at 11:02:13: ECC page retirement or row remapping recording event"),
    )})


def test_an_xid_63_the_row_remapper_shows_resolved_warns_naming_both() -> None:
    """The same GPU after a GPU reset applied the remapping: nothing pending, nothing failed (the same -q read)."""
    (a100,) = a100_after_xid_63()
    reset = a100.said(remap_pending=False, ecc_corrected=0, persistence=True, compute_mode="Default", mig=False,
                      power_limit_w=400.0, default_power_limit_w=400.0, app_clocks_setting=False)
    xids = message_xids("a100-sxm4-80gb_message_xid-63-row-remapper.log", T0)
    assert only(judged([reset], xids), a100.bus_id) == (
        Finding("xid", Level.WARN, "Xid 63 at 11:02:13: ECC page retirement or row remapping recording event; "
                                   "resolved: no row remapping pending or failed now (nvidia-smi -q)"),
    )
    assert only(judged([reset], during=xids), a100.bus_id)[0].level is Level.WARN  # logged during the reset too
    failed = reset.said(remap_failed=True)
    assert [f.check for f in judged([failed], xids).gpus[a100.bus_id] if f.level is Level.FAIL] == [
        "remap_failed", "xid"]


@pytest.mark.parametrize(
    ("facts", "resolved"),
    [
        ({"remap_pending": None, "remap_failed": None, "retired_pending": False},
         "no page retirement pending now (nvidia-smi -q)"),  # before A100: page retirement, no row remapper
        ({"remap_pending": None, "remap_failed": None, "retired_pending": True}, None),
        ({"remap_pending": None, "remap_failed": None, "retired_pending": None}, None),  # nothing read: never resolved
        ({"remap_pending": False, "remap_failed": None}, None),
    ],
)
def test_what_shows_an_xid_64_resolved(facts: dict[str, object], resolved: str | None) -> None:
    xid = Xid(at=T0, pci=PCI, code=64, detail="pid=1896, Row Remapper: remapping failed")
    (finding,) = [f for f in only(judged([gpu(**facts)], [xid])) if f.check == "xid"]
    assert finding.level is (Level.FAIL if resolved is None else Level.WARN)
    assert finding.detail.endswith(f"; resolved: {resolved}" if resolved else "recording failure")


@pytest.mark.parametrize("code", sorted(XID_ACTION - XID_RESOLVABLE))
def test_no_other_always_fail_xid_is_ever_resolved(code: int) -> None:
    assert only(judged([gpu()], [Xid(at=T0, pci=PCI, code=code, detail="x")]))[0].level is Level.FAIL


def test_xid_119_on_no_listed_gpu_is_the_hosts_with_its_pci_address() -> None:
    """The dmesg --ctime stamps, read as UTC, become the short-unix seconds journalctl would print."""
    lines = fixture(KLOG / "h100-xe9680_dmesg-ctime_xid-119-gsp-rpc-timeout.log").splitlines()
    text = "".join(f"{ctime_epoch(line[1:25])} node kernel: {line[27:]}\n" for line in lines)
    found = judged([gpu()], parse_xids(text))
    assert found == Judgement(gpus={BUS: ()}, host=(
        HostFinding(check="xid", level=Level.FAIL,
                    detail="Xid 119 at 16:24:18: GSP RPC Timeout (5 times, last at 16:30:13)",
                    pci="0000:9b:00"),
    ))
    assert fails(found) == list(found.host)


def test_application_xids_since_boot_warn() -> None:
    """Xid 13, 31 and 109 (not in the table: its own text) as one node logged them, before any reset."""
    lines = fixture(KLOG / "gpud-readme_dmesg-ctime_xid-13-31-109.log").splitlines()
    text = "".join(f"{T0 + i} node kernel: {line[27:]}\n" for i, line in enumerate(lines))
    found = judged([gpu()], parse_xids(text))
    assert found.host == tuple(HostFinding(check="xid", level=Level.WARN, detail=detail,
                                           pci="0000:cb:00") for detail in (
        "Xid 13 at 11:02:14: Graphics Engine Exception (3 times, last at 11:02:16)",
        "Xid 109 at 11:02:17: pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, "
        "Info 0x58005 (2 times, last at 11:02:21)",
        "Xid 31 at 11:02:18: GPU memory page fault",
    ))
    assert fails(found) == []


def test_a_group_counts_as_its_lines() -> None:
    """The read keeps a storm as one group: 8,000 lines, first and last time."""
    storm = Xid(at=T0, pci=PCI, code=13, detail="pid='<unknown>', x", count=8000, last_at=T0 + 300)
    assert only(judged([gpu()], [storm])) == (
        Finding("xid", Level.WARN, "Xid 13 at 11:02:13: Graphics Engine Exception (8000 times, last at 11:07:13)"),)


# --- Xids before and during the reset ------------------------------------------------


def test_any_xid_logged_during_the_reset_fails() -> None:
    old = Xid(at=T0, pci=PCI, code=13, detail="pid=1, name=python3, Graphics Exception")
    new = Xid(at=T0 + 60, pci=PCI, code=13, detail="pid=2, name=python3, Graphics Exception")
    assert only(judged([gpu()], [old], [new])) == (
        Finding("xid", Level.WARN, "Xid 13 at 11:02:13: Graphics Engine Exception"),
        Finding("xid", Level.FAIL, "Xid 13 at 11:03:13: Graphics Engine Exception during the reset"),
    )


def test_a_check_has_no_reset_to_log_during() -> None:
    xid = Xid(at=T0, pci=PCI, code=13, detail="pid=1")
    assert only(judged([gpu()], before=[xid]))[0].level is Level.WARN
    assert only(judged([gpu()], during=[xid]))[0].level is Level.FAIL


def test_fallen_off_the_bus_fails_even_from_before_the_reset() -> None:
    (xid,) = message_xids("message_xid-79-fallen-off-the-bus.log", T0)
    assert only(judged([gpu("00000000:44:00.0")], [xid]), "00000000:44:00.0") == (
        Finding("xid", Level.FAIL, "Xid 79 at 11:02:13: GPU has fallen off the bus"),
    )


def test_an_xid_on_another_domain_joins_its_gpu() -> None:
    (xid,) = message_xids("kmsg_xid-149-netir-domain-0019.log", T0)
    found = judged([gpu("00000019:01:00.0")], [xid])
    assert only(found, "00000019:01:00.0")[0].detail.startswith("Xid 149 at 11:02:13: NETIR Fatal XC0 i0 Link -1")


def test_host_policy_over_xids() -> None:
    (xid,) = message_xids("message_xid-79-fallen-off-the-bus.log", T0)
    gpus = [gpu("00000000:44:00.0")]
    warned = judged(gpus, [xid], policy=HealthPolicy(warn=frozenset({"xid"})))
    assert [f.level for f in warned.gpus["00000000:44:00.0"]] == [Level.WARN]
    ignored = judged(gpus, [xid], policy=HealthPolicy(ignore=frozenset({"xid"})))
    assert ignored == Judgement(gpus={"00000000:44:00.0": ()})


# --- fleet's own kill: application Xids of the processes the reset ended -------------------------

KILLED = Ended({4242: "pid 4242 python3, which fleet killed"}, {PCI: (4242,)})


def test_the_real_xid_45_of_a_killed_process_warns_naming_it() -> None:
    """The real lines (syslog-kernel_xid-45-caused-by-previous-xid.log) logged during the reset for the pids fleet
    killed: warnings that name the process; the same lines for a pid fleet did not kill fail."""
    first, second = message_xids("syslog-kernel_xid-45-caused-by-previous-xid.log", T0 + 60)
    gpus = [gpu("00000000:DC:00.0"), gpu("00000000:ED:00.0")]
    ended = Ended.of([KilledProcess(pid=1818990, name="python3", user="root", signal="SIGTERM")])
    found = judged(gpus, during=[first, second], ended=ended)
    assert found.gpus == {
        "00000000:DC:00.0": (Finding("xid", Level.WARN, "Xid 45 at 11:03:13: Preemptive cleanup, due to previous "
                                                       "errors during the reset: pid 1818990 python3, which fleet "
                                                       "killed"),),
        "00000000:ED:00.0": (Finding("xid", Level.FAIL, "Xid 45 at 11:03:13: Preemptive cleanup, due to previous "
                                                       "errors during the reset"),),
    }


@pytest.mark.parametrize("code", sorted(XID_APPLICATION))
def test_each_application_xid_of_a_killed_pid_warns(code: int) -> None:
    xid = Xid(at=T0, pci=PCI, code=code, detail="pid=4242, name=python3, Ch 00000001")
    (finding,) = only(judged([gpu()], during=[xid], ended=KILLED))
    assert finding.level is Level.WARN and finding.detail.endswith(": pid 4242 python3, which fleet killed")


@pytest.mark.parametrize("code", [*sorted(XID_ACTION - XID_RESOLVABLE), 109, 62, 68])
def test_any_other_xid_of_a_killed_pid_still_fails(code: int) -> None:
    xid = Xid(at=T0, pci=PCI, code=code, detail="pid=4242, name=python3, Ch 00000001")
    assert only(judged([gpu()], during=[xid], ended=KILLED))[0].level is Level.FAIL


def test_an_application_xid_naming_no_pid_warns_on_a_gpu_whose_holder_fleet_killed() -> None:
    """Xid 13 prints pid='<unknown>' (gpud-readme_dmesg-ctime_xid-13-31-109.log); on the GPU fleet's kill emptied
    it warns, on another GPU it fails. A group of pids the read folded names no pid either, but whose they are is
    not known (a kept job's may be among them: eight killed processes faulting on the GPU, then the job's Xid 31):
    it fails, wherever it is."""
    unknown = Xid(at=T0, pci=PCI, code=13, detail="pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
    (finding,) = only(judged([gpu()], during=[unknown], ended=KILLED))
    assert finding == Finding("xid", Level.WARN, "Xid 13 at 11:02:13: Graphics Engine Exception during the reset, "
                                                 "naming no process, on the GPU of pid 4242 python3, which fleet "
                                                 "killed")
    other = dataclasses.replace(unknown, pci="0000:1b:00")
    assert judged([gpu()], during=[other], ended=KILLED).host[0].level is Level.FAIL
    folded = Xid(at=T0, pci=PCI, code=45, detail="pid=9999, name=python3, Ch 00000001", count=40, folded=True)
    assert only(judged([gpu()], during=[folded], ended=KILLED))[0].level is Level.FAIL
    assert only(judged([gpu()], during=[folded]))[0].level is Level.FAIL


def test_the_processes_the_reset_ended_are_placed_on_gpus_by_the_apps_read_as_the_reset_began() -> None:
    """Killed by fleet, or a compute app as the reset began that is none at verify (drain stopped its unit); a
    kept one still running (the MPS server) ended nothing."""
    rows = [GpuRow(index=0, memory_used_mib=1523, uuid="GPU-aaaa", pci_bus_id="00000000:83:00.0"),
            GpuRow(index=1, memory_used_mib=0, uuid="GPU-bbbb", pci_bus_id="00000000:1B:00.0")]
    before = [ComputeApp(gpu_uuid="GPU-aaaa", pid=4242, process_name="python3", used_mib=1523),
              ComputeApp(gpu_uuid="GPU-bbbb", pid=77, process_name="nvidia-cuda-mps-server", used_mib=10),
              ComputeApp(gpu_uuid="GPU-cccc", pid=4242, process_name="python3", used_mib=1),
              ComputeApp(gpu_uuid="GPU-bbbb", pid=501, process_name="/opt/sglang/bin/sglang", used_mib=30)]
    after = [ComputeApp(gpu_uuid="GPU-bbbb", pid=77, process_name="nvidia-cuda-mps-server", used_mib=10)]
    ended = Ended.of([KilledProcess(pid=4242, name="python3", user="root", signal="SIGKILL")], before, rows, after)
    assert ended == Ended({4242: "pid 4242 python3, which fleet killed",
                           501: "pid 501 sglang, which the reset stopped"},
                          {"0000:83:00": (4242,), "0000:1b:00": (501,)})
    stopped = Xid(at=T0, pci="0000:1b:00", code=45, detail="pid=501, name=sglang, Ch 00000001")
    assert judged([gpu("00000000:1B:00.0")], during=[stopped], ended=ended).gpus["00000000:1B:00.0"] == (
        Finding("xid", Level.WARN, "Xid 45 at 11:02:13: Preemptive cleanup, due to previous errors during the "
                                   "reset: pid 501 sglang, which the reset stopped"),)


def test_a_kept_jobs_process_whose_step_ended_on_its_own_downgrades_nothing() -> None:
    """The kill kept pid 6001 (a Slurm job's step, `spared`); it was a compute app as the reset began and ended on
    its own before verify: the reset did not end it, so its application Xid during the reset still fails, by pid and
    on its GPU alike."""
    rows = [GpuRow(index=0, memory_used_mib=0, uuid="GPU-aaaa", pci_bus_id="00000000:83:00.0")]
    before = [ComputeApp(gpu_uuid="GPU-aaaa", pid=6001, process_name="python3", used_mib=30000)]
    ended = Ended.of([], before, rows, after=[], spared=frozenset({6001}))
    assert ended == Ended({}, {})
    by_pid = Xid(at=T0, pci=PCI, code=43, detail="pid=6001, name=python3, Ch 00000008")
    unnamed = Xid(at=T0, pci=PCI, code=13, detail="pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
    for xid in (by_pid, unnamed):
        (finding,) = only(judged([gpu()], during=[xid], ended=ended))
        assert finding.level is Level.FAIL and finding.detail.endswith("during the reset"), finding
    drained = Ended.of([], before, rows, after=[])  # the same process, not kept: drain stopped its unit
    assert only(judged([gpu()], during=[by_pid], ended=drained))[0].level is Level.WARN


# --- a kernel log that could not be read ----------------------------------------------------


def test_an_unread_kernel_log_fails_the_xid_check_as_the_hosts() -> None:
    why = "journalctl exited 1: No journal files were found."
    found = judged([gpu()], unread=why)
    assert found.unread == HostFinding(check="xid", level=Level.FAIL, detail=f"cannot read the kernel log ({why})")
    assert found.unread_why == why and found.host_findings == (found.unread,)
    assert fails(found) == []  # the unread log is no Xid: verify gives it its own reason
    assert judged([gpu()], unread=why, policy=HealthPolicy(warn=frozenset({"xid"}))).unread == HostFinding(
        check="xid", level=Level.WARN, detail=f"cannot read the kernel log ({why})")
    assert judged([gpu()], unread=why, policy=HealthPolicy(ignore=frozenset({"xid"}))).unread is None


# --- each GPU check ------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "finding"),
    [
        ({"ecc_uncorrected": 2}, Finding("ecc_uncorrected", Level.FAIL, "2 uncorrectable ECC errors (volatile)")),
        ({"ecc_uncorrected": 1}, Finding("ecc_uncorrected", Level.FAIL, "1 uncorrectable ECC error (volatile)")),
        ({"ecc_corrected": 1}, Finding("ecc_corrected", Level.WARN, "1 correctable ECC error (volatile)")),
        ({"retired_pending": True},
         Finding("retired_pending", Level.FAIL, "page retirement pending: reset the GPU to retire the pages")),
        ({"remap_pending": True},
         Finding("remap_pending", Level.FAIL, "row remapping pending: reset the GPU to apply")),
        ({"remap_failed": True},
         Finding("remap_failed", Level.FAIL, "row remapping failed: no spare row left in the bank (RMA criterion)")),
        ({"persistence": False}, Finding("persistence", Level.WARN, "persistence mode off")),
        ({"fabric_state": "In Progress", "fabric_status": None},
         Finding("fabric", Level.FAIL, "fabric state In Progress, status N/A")),
        ({"fabric_status": "Failure"}, Finding("fabric", Level.FAIL, "fabric state Completed, status Failure")),
        ({"pcie_width": 8}, Finding("pcie_width", Level.FAIL, "PCIe link x8, capable of x16")),
    ],
)
def test_each_check(facts: dict[str, object], finding: Finding) -> None:
    assert only(judged([gpu(**facts)])) == (finding,)


@pytest.mark.parametrize(
    "facts",
    [
        {"persistence": None, "ecc_corrected": None, "ecc_uncorrected": None, "retired_pending": None,
         "remap_pending": None, "remap_failed": None, "pcie_width": None, "pcie_width_max": None},
        {"fabric_state": None, "fabric_status": None},  # a GPU without a fabric (or a driver without the section)
        {"pcie_gen": 1},  # an idle GPU lowers its link generation on purpose
        {"ecc_corrected": 0, "retired_pending": False},
    ],
)
def test_what_is_unknown_or_normal_is_no_finding(facts: dict[str, object]) -> None:
    """(A GPU setting not said is a `gpu_settings` finding, never "fine": tests/unit/test_gpu_profile.py.)"""
    assert only(judged([gpu(**facts)], policy=HealthPolicy(ignore=frozenset({"gpu_settings"})))) == ()


def test_downgraded_and_ignored_checks() -> None:
    sick = gpu(pcie_width=4, persistence=False)
    policy = HealthPolicy(warn=frozenset({"pcie_width"}), ignore=frozenset({"persistence"}))
    assert only(judged([sick], policy=policy)) == (Finding("pcie_width", Level.WARN, "PCIe link x4, capable of x16"),)


# --- fails and the report shape --------------------------------------------------


def test_fails_puts_the_most_telling_first() -> None:
    sick = gpu(pcie_width=8, remap_pending=True, ecc_uncorrected=3, persistence=False)
    xid = Xid(at=T0, pci=PCI, code=79, detail="GPU has fallen off the bus.")
    assert [f.check for f in fails(judged([sick], [xid]))] == [
        "xid", "ecc_uncorrected", "remap_pending", "pcie_width",
    ]


def test_a_finding_is_check_level_detail_in_json() -> None:
    finding = Finding("xid", Level.FAIL, "Xid 79 at 11:02:13: GPU has fallen off the bus")
    assert json.loads(json.dumps(dataclasses.asdict(finding))) == {
        "check": "xid", "level": "fail", "detail": "Xid 79 at 11:02:13: GPU has fallen off the bus",
    }


def readme_table(readme: str, header: str) -> list[str]:
    """The consecutive lines starting with '|' from `header` on."""
    rows = readme[readme.index(header):].splitlines()
    return rows[:next(i for i, row in enumerate(rows) if not row.startswith("|"))]


def test_the_readme_states_the_default_policy_as_declared() -> None:
    """docs/operating.md's health table is the table of checks in fleet/model/health_checks.py, row for row."""
    readme = (REPO / "docs" / "operating.md").read_text()
    assert readme_table(readme, "| check | default | read from | why |")[2:] == [
        f"| `{c.name}` | {c.default.value} | {c.reads} | {c.why} |" for c in TABLE]
    assert ", ".join(map(str, sorted(XID_ACTION))) in " ".join(readme.split())
