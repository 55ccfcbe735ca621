"""The expected GPU settings: `gpu_settings:` read strictly at every level, a GPU's settings
compared with it (one difference per setting, "not observed" never "fine"), the health gate weighing them as the check
`gpu_settings` (warn; `health_fail` fails; reason `gpu_settings`), and the restore's changes."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from fleet.inventory.gpu_settings import as_written, from_written
from fleet.inventory.load import host_vars, load_inventory
from fleet.model.errors import InventoryError
from fleet.model.gpu_facts import GpuHealth, GpuSettings
from fleet.model.gpu_profile import DEFAULT_PROFILE, Clocks, GpuProfile, Setting, differences, findings
from fleet.model.report import Level, Reason
from fleet.node.probes.smi import GpuRow
from fleet.reset.health_gate import HealthPolicy, KernelReads, fails, judge
from fleet.reset.restore_changes import restoration
from fleet.reset.settle import Allowance
from fleet.reset.verify import verify_verdict
from fleet.slurm.noderun import host_of

# An H100 as the 535.183.01 capture reads it (tests/logic/test_gpu_settings.py): the profile's defaults hold.
CLEAN = GpuSettings(name="NVIDIA H100 80GB HBM3", vbios="96.00.74.00.01", driver="535.183.01", persistence=True,
                    compute_mode="Default", mig=False, mig_pending=False, ecc=True, ecc_pending=True,
                    power_limit_w=700.0, enforced_power_limit_w=700.0, default_power_limit_w=700.0,
                    app_clocks_setting=False, app_clock_graphics_mhz=1980, app_clock_memory_mhz=2619,
                    default_app_clock_graphics_mhz=1980, default_app_clock_memory_mhz=2619)
LOWERED = dataclasses.replace(CLEAN, power_limit_w=450.0, enforced_power_limit_w=450.0)
LOCKED = dataclasses.replace(CLEAN, app_clocks_setting=True)


def load(tmp_path: Path, text: str) -> dict[str, GpuProfile]:
    path = tmp_path / "site.yaml"
    path.write_text(textwrap.dedent(text))
    return {name: host.gpu_settings for name, host in load_inventory(path).hosts.items()}


# ---------------------------------------------------------------- the inventory


def test_the_profile_is_set_at_any_level_and_a_mapping_replaces_the_one_before(tmp_path: Path) -> None:
    found = load(tmp_path, """
        defaults:
          gpu_settings: {power_limit: 500, clocks: {graphics: 1980, memory: 2619}}
        groups:
          exclusive:
            hosts: [gpu-a]
            vars: {gpu_settings: {compute_mode: Exclusive_Process, persistence: off, ecc: on, mig: "off"}}
        hosts:
          gpu-a: {}
          gpu-b: {}
          gpu-c: {gpu_settings: {power_limit: default}}
    """)
    assert found["gpu-a"] == GpuProfile(persistence=False, compute_mode="Exclusive_Process", ecc=True)
    assert found["gpu-b"] == GpuProfile(power_limit_w=500.0, clocks=Clocks(1980, 2619))
    assert found["gpu-c"] == DEFAULT_PROFILE


def test_no_gpu_settings_is_the_default_profile(tmp_path: Path) -> None:
    assert load(tmp_path,
                "hosts: {gpu-a: {}}") == {"gpu-a": GpuProfile(persistence=True, compute_mode="Default", mig=False,
                                                              power_limit_w=None, clocks=None, ecc=None)}


@pytest.mark.parametrize(("written", "error"), [
    ("{powr_limit: 3}", "defaults.gpu_settings.powr_limit: unknown key; did you mean 'power_limit'? (known: "
                        "persistence, compute_mode, mig, power_limit, clocks, ecc)"),
    ("{power_limit: lots}", "defaults.gpu_settings.power_limit: expected 'default' or a number of watts, got 'lots'"),
    ("{power_limit: 0}", "defaults.gpu_settings.power_limit: expected a number of watts above 0 and at most 10000"),
    ("{power_limit: true}", "defaults.gpu_settings.power_limit: expected 'default' or a number of watts, got True"),
    ("{clocks: {graphic: 1980}}", "defaults.gpu_settings.clocks.graphic: unknown key; did you mean 'graphics'?"),
    ("{clocks: {graphics: -1}}", "defaults.gpu_settings.clocks.graphics: "),
    ("{clocks: {}}", "defaults.gpu_settings.clocks: expected locked clocks with graphics or memory MHz, got none"),
    ("{clocks: fast}", "defaults.gpu_settings.clocks: expected 'default' or locked clocks"),
    ("{mig: maybe}", "defaults.gpu_settings.mig: expected on or off, got 'maybe'"),
    ("{persistence: 1}", "defaults.gpu_settings.persistence: expected on or off, got 1"),
    ("{compute_mode: exclusive}", "defaults.gpu_settings.compute_mode: expected 'Default', 'Exclusive_Process' or "
                                  "'Prohibited', got 'exclusive'"),
    ("[persistence]", "defaults.gpu_settings: expected a mapping, got ['persistence']"),
])
def test_a_bad_profile_is_one_line_naming_the_file_and_the_key(tmp_path: Path, written: str, error: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, f"defaults:\n  gpu_settings: {written}\nhosts: {{gpu-a: {{}}}}\n")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'site.yaml'}: {error}") and "\n" not in message


def test_health_fail_names_known_checks(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("hosts: {gpu-a: {health_fail: [gpu_settings, ecc_corrected]}}\n")
    assert load_inventory(path).hosts["gpu-a"].health_fail == ("gpu_settings", "ecc_corrected")
    path.write_text("hosts: {gpu-a: {health_fail: [gpu_setings]}}\n")
    with pytest.raises(InventoryError, match=r"hosts.gpu-a.health_fail\[0\]: unknown health check 'gpu_setings'"):
        load_inventory(path)


def test_the_profile_as_written_reads_back(tmp_path: Path) -> None:
    """`fleet inventory --json` and `--via srun`'s document to the node write it as the inventory would, and the node
    reads it back (`fleet.slurm.noderun.host_of`)."""
    profile = GpuProfile(persistence=False, compute_mode="Prohibited", mig=True, power_limit_w=450.0,
                         clocks=Clocks(1980, None), ecc=False)
    assert as_written(profile) == {"persistence": "off", "compute_mode": "Prohibited", "mig": "on",
                                   "power_limit": 450.0, "clocks": {"graphics": 1980}, "ecc": "off"}
    assert from_written(as_written(profile)) == profile and from_written(as_written(DEFAULT_PROFILE)) == DEFAULT_PROFILE
    path = tmp_path / "site.yaml"
    path.write_text("hosts: {gpu-a: {gpu_settings: {power_limit: 450, mig: on}}}\n")
    host = load_inventory(path).hosts["gpu-a"]
    assert host_vars(host)["gpu_settings"]["power_limit"] == 450.0
    assert host_of("gpu-a", host_vars(host)).gpu_settings == host.gpu_settings == GpuProfile(mig=True,
                                                                                             power_limit_w=450.0)


# ---------------------------------------------------------------- the comparison


def details(profile: GpuProfile, gpu: GpuSettings) -> list[str]:
    return [d.detail for d in differences(profile, gpu)]


def test_a_clean_gpu_has_no_difference_with_the_default_profile() -> None:
    assert differences(DEFAULT_PROFILE, CLEAN) == ()


@pytest.mark.parametrize(("gpu", "expected"), [
    (LOWERED, ["power limit 450 W, default 700 W"]),
    (LOCKED, ["locked or application clocks in force (clock event reason Applications Clocks Setting)"]),
    (dataclasses.replace(CLEAN, app_clock_graphics_mhz=1410, app_clock_memory_mhz=2619),
     ["application clocks 1410/2619 MHz, default 1980/2619 MHz"]),
    (dataclasses.replace(CLEAN, compute_mode="Exclusive_Process"), ["compute mode Exclusive_Process, profile Default"]),
    (dataclasses.replace(CLEAN, mig=True, mig_pending=True), ["MIG mode on, profile off"]),
    (dataclasses.replace(CLEAN, mig=True, mig_pending=False), ["MIG mode on (off pending a GPU reset), profile off"]),
    (dataclasses.replace(CLEAN, mig_pending=True), ["MIG mode on pending a GPU reset, profile off"]),
    (dataclasses.replace(CLEAN, persistence=False), []),  # the health check `persistence` says it
])
def test_each_setting_a_last_user_leaves_is_one_difference(gpu: GpuSettings, expected: list[str]) -> None:
    assert details(DEFAULT_PROFILE, gpu) == expected


def test_a_setting_nvidia_smi_did_not_say_is_not_observed_never_fine() -> None:
    found = differences(DEFAULT_PROFILE, GpuSettings())
    assert [d.detail for d in found] == [
        "persistence mode not observed (nvidia-smi did not say it)", "compute mode not observed (nvidia-smi did not "
        "say it)", "MIG mode not observed (nvidia-smi did not say it)", "power limit not observed (nvidia-smi did "
        "not say it)", "clock event reason Applications Clocks Setting not observed (nvidia-smi did not say it)"]
    assert not any(d.observed for d in found)
    no_default = dataclasses.replace(CLEAN, default_power_limit_w=None)
    assert details(DEFAULT_PROFILE, no_default) == ["default power limit not observed (nvidia-smi did not say it)"]


def test_the_health_gate_folds_what_was_not_said_into_one_line() -> None:
    assert findings(DEFAULT_PROFILE, dataclasses.replace(LOWERED, compute_mode=None, mig=None)) == (
        "power limit 450 W, default 700 W",
        "not observed: compute mode, MIG mode (nvidia-smi did not say them)")
    assert findings(DEFAULT_PROFILE, dataclasses.replace(CLEAN, compute_mode=None)) == (
        "compute mode not observed (nvidia-smi did not say it)",)
    assert findings(DEFAULT_PROFILE, CLEAN) == ()


def test_a_profile_of_its_own_is_judged_against() -> None:
    profile = GpuProfile(persistence=False, compute_mode="Exclusive_Process", power_limit_w=450.0, ecc=False)
    assert details(profile, LOWERED) == ["persistence mode on, profile off",
                                         "compute mode Default, profile Exclusive_Process",
                                         "ECC mode on, profile off"]
    assert details(GpuProfile(ecc=True), dataclasses.replace(CLEAN, ecc_pending=False)) == [
        "ECC mode off pending a GPU reset, profile on"]
    locked = details(GpuProfile(clocks=Clocks(1980, None)), LOCKED)
    assert locked == ["locked clocks (graphics 1980 MHz in the profile) not observed (nvidia-smi did not say it)"]


# ---------------------------------------------------------------- the health gate


def gpu_of(settings: GpuSettings, bus: str = "00000000:18:00.0") -> GpuHealth:
    return GpuHealth(bus, {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
                           if getattr(settings, f.name) is not None})


def test_a_difference_warns_by_default_and_fails_with_health_fail() -> None:
    gpus = [gpu_of(LOWERED)]
    warned = judge(gpus, KernelReads(), HealthPolicy())
    assert [(f.check, f.level, f.detail) for f in warned.gpus["00000000:18:00.0"]] == [
        ("gpu_settings", Level.WARN, "power limit 450 W, default 700 W")]
    failed = judge(gpus, KernelReads(), HealthPolicy(fail=frozenset({"gpu_settings"})))
    assert [f.level for f in failed.gpus["00000000:18:00.0"]] == [Level.FAIL]
    assert judge(gpus, KernelReads(), HealthPolicy(ignore=frozenset({"gpu_settings"}),
                                                   fail=frozenset({"gpu_settings"}))).gpus["00000000:18:00.0"] == ()
    assert judge([gpu_of(CLEAN)], KernelReads(), HealthPolicy()).gpus["00000000:18:00.0"] == ()


def test_health_fail_makes_any_warning_check_fail() -> None:
    policy = HealthPolicy(warn=frozenset({"ecc_corrected"}), fail=frozenset({"ecc_corrected"}))
    assert policy.level("ecc_corrected", Level.WARN) is Level.FAIL and policy.level("xid", Level.FAIL) is Level.FAIL
    with pytest.raises(ValueError, match="unknown health check"):
        HealthPolicy(fail=frozenset({"nope"}))


def test_a_failing_difference_is_the_hosts_error_with_reason_gpu_settings() -> None:
    rows = (GpuRow(index=3, memory_used_mib=0, uuid="GPU-a", pci_bus_id="00000000:18:00.0"),)
    found = judge([gpu_of(LOWERED)], KernelReads(), HealthPolicy(fail=frozenset({"gpu_settings"})))
    verdict = verify_verdict(rows, (), 1, Allowance(16, 256), (), found)
    assert verdict == (Reason.GPU_SETTINGS, "gpu 3: power limit 450 W, default 700 W")
    assert verify_verdict(rows, (), 1, Allowance(16, 256), (), judge([gpu_of(LOWERED)], KernelReads(),
                                                                      HealthPolicy())) is None


def test_a_restore_the_driver_refused_is_a_finding_on_its_gpu() -> None:
    refused = {"00000000:18:00.0": ("nvidia-smi -i 3 -pl 700 exited 4: Failed to set power management limit for GPU "
                                    "00000000:18:00.0: Insufficient Permissions (restoring power limit 450 W, "
                                    "default 700 W)",)}
    found = judge([gpu_of(LOWERED)], KernelReads(), HealthPolicy(), refused=refused)
    assert [(f.level, f.detail) for f in found.gpus["00000000:18:00.0"]] == [
        (Level.WARN, "power limit 450 W, default 700 W"), (Level.FAIL, refused["00000000:18:00.0"][0])]


@pytest.mark.parametrize("policy", [HealthPolicy(), HealthPolicy(warn=frozenset({"gpu_settings"})),
                                    HealthPolicy(ignore=frozenset({"gpu_settings"}))],
                         ids=["default", "warn", "ignore"])
def test_a_restore_the_driver_refused_fails_whatever_the_hosts_policy(policy: HealthPolicy) -> None:
    """--restore-settings is the operator saying these settings matter: one the driver refused fails the GPU."""
    refused = {"00000000:18:00.0": ("nvidia-smi -i 3 -pl 700 exited 4: Insufficient Permissions",)}
    found = judge([gpu_of(LOWERED)], KernelReads(), policy, refused=refused)
    assert [(f.check, f.level, f.detail) for f in fails(found)] == [
        ("gpu_settings", Level.FAIL, "nvidia-smi -i 3 -pl 700 exited 4: Insufficient Permissions")]


# ---------------------------------------------------------------- the restore's changes


def lines(gpus: list[tuple[int, GpuSettings]], profile: GpuProfile = DEFAULT_PROFILE, gpu_reset: bool = False
          ) -> tuple[list[str], list[str]]:
    wanted = restoration(gpus, profile, gpu_reset=gpu_reset)
    return [" ".join(c.args) for c in wanted.changes], list(wanted.held)


def test_each_difference_is_restored_by_its_command_per_gpu() -> None:
    stale = dataclasses.replace(LOCKED, persistence=False, compute_mode="Prohibited", power_limit_w=450.0)
    assert lines([(0, CLEAN), (3, LOWERED), (5, stale)]) == ([
        "-i 3 -pl 700",
        "-i 5 -pm 1", "-i 5 -c DEFAULT", "-i 5 -pl 700", "-i 5 -rgc", "-i 5 -rmc", "-i 5 -rac"], [])
    app = dataclasses.replace(CLEAN, app_clock_graphics_mhz=1410)
    assert lines([(1, app)]) == (["-i 1 -rac"], [])
    assert lines([(2, LOWERED)], GpuProfile(power_limit_w=500.0, compute_mode="Exclusive_Process")) == (
        ["-i 2 -c EXCLUSIVE_PROCESS", "-i 2 -pl 500"], [])


def test_mig_and_ecc_wait_for_gpu_reset_and_are_said() -> None:
    mig = dataclasses.replace(CLEAN, mig=True, mig_pending=True)
    assert lines([(1, mig)]) == ([], ["gpu 1: MIG mode on, profile off: takes a GPU reset (--gpu-reset)"])
    assert lines([(1, mig)], gpu_reset=True) == (["-i 1 -mig 0", "-i 1 -r"], [])
    pending_off = dataclasses.replace(CLEAN, mig=True, mig_pending=False)
    assert lines([(1, pending_off)], gpu_reset=True) == (["-i 1 -r"], [])
    ecc = dataclasses.replace(CLEAN, ecc=False, ecc_pending=False)
    assert lines([(2, ecc)], GpuProfile(ecc=True), gpu_reset=True) == (["-i 2 -e 1", "-i 2 -r"], [])


def test_nothing_is_restored_that_was_not_observed_or_that_matches() -> None:
    assert lines([(0, GpuSettings()), (1, CLEAN)]) == ([], [])
    assert restoration([(1, LOCKED)], GpuProfile(clocks=Clocks(1980, 2619))).changes == ()
    assert {d.setting for d in differences(DEFAULT_PROFILE, LOCKED)} == {Setting.CLOCKS}


def test_a_gpu_whose_settings_were_not_read_gets_no_change_and_verify_says_not_observed() -> None:
    """Settings not read (no facts for the GPU's bus id) change nothing: no guess is restored; the profile's
    findings name them not observed, never fine."""
    assert restoration([(0, GpuSettings())], DEFAULT_PROFILE).changes == ()
    said = findings(DEFAULT_PROFILE, GpuSettings())
    assert said and all("not observed" in line for line in said)
