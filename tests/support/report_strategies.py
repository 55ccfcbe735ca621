"""Hypothesis strategies for a host's report (`HostReport` and its parts), every field the JSON document carries:
the codec's round-trip tests draw from them. Values the document normalises (a step's error and reason, which the
document does not carry; a scheduler's empty optional values, which it leaves out) are drawn only in the form the
document keeps, so that a report drawn here comes back equal."""

from __future__ import annotations

from hypothesis import strategies as st

from fleet.model import plugs
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import (
    Finding,
    GpuReport,
    HostFinding,
    HostPlan,
    HostReport,
    HostStatus,
    KeptProcess,
    KilledProcess,
    Level,
    PlannedProcess,
    Reason,
    SchedulerRecord,
    StepName,
    StepResult,
    StepStatus,
)

words = st.text(max_size=12)
maybe_words = st.none() | words
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
mib = st.none() | st.integers(min_value=0, max_value=200_000)
pids = st.integers(min_value=1, max_value=4_194_304)
levels = st.sampled_from(Level)

findings = st.builds(Finding, words, levels, words)
host_findings = st.builds(HostFinding, check=words, level=levels, detail=words, pci=maybe_words)
steps = st.builds(StepResult, name=st.sampled_from(StepName), status=st.sampled_from(StepStatus), duration_s=seconds,
                  detail=words)
killed = st.builds(KilledProcess, pid=pids, name=words, user=words, signal=st.sampled_from(("SIGTERM", "SIGKILL")))
kept = st.builds(KeptProcess, pid=pids, name=words, user=words, why=words)
maybe_switch = st.none() | st.booleans()
maybe_watts = st.none() | st.floats(min_value=0, max_value=5000, allow_nan=False)
maybe_mhz = st.none() | st.integers(min_value=0, max_value=10_000)
gpu_settings = st.builds(GpuSettings, name=maybe_words, vbios=maybe_words, driver=maybe_words, persistence=maybe_switch,
                         compute_mode=maybe_words, mig=maybe_switch, mig_pending=maybe_switch, ecc=maybe_switch,
                         ecc_pending=maybe_switch, power_limit_w=maybe_watts, enforced_power_limit_w=maybe_watts,
                         default_power_limit_w=maybe_watts, app_clocks_setting=maybe_switch,
                         app_clock_graphics_mhz=maybe_mhz, app_clock_memory_mhz=maybe_mhz,
                         default_app_clock_graphics_mhz=maybe_mhz, default_app_clock_memory_mhz=maybe_mhz)
gpus = st.builds(GpuReport, index=st.integers(min_value=0, max_value=63), memory_used_mib=mib, uuid=maybe_words,
                 name=maybe_words, memory_total_mib=mib,
                 settle_s=st.none() | seconds, health=st.lists(findings, max_size=2).map(tuple),
                 settings=st.none() | gpu_settings)
planned = st.builds(PlannedProcess, pid=pids, user=words, name=words, mib=mib, kept_because=maybe_words)
plans = st.builds(HostPlan, units=st.dictionaries(words, words, max_size=3).map(lambda d: tuple(d.items())),
                  would_kill=st.lists(planned, max_size=2).map(tuple), kept=st.lists(planned, max_size=2).map(tuple),
                  gpu_memory_mib=st.lists(mib, max_size=8).map(tuple),
                  would_restore=st.lists(words, max_size=2).map(tuple))
set_words = st.none() | st.text(min_size=1, max_size=12)  # an optional scheduler value: absent, or not empty
schedulers = st.builds(SchedulerRecord, node=words, state_before=maybe_words, reason_before=maybe_words,
                       state_after=maybe_words, reason_after=maybe_words,
                       jobs=st.lists(words, max_size=3).map(tuple), plan=set_words, error=set_words,
                       abandoned=st.booleans(),
                       waited_s=st.none() | st.floats(min_value=0.001, max_value=1e5, allow_nan=False),
                       taken_over=set_words, by=st.sampled_from(sorted(plugs.SCHEDULERS)))
hosts = st.builds(
    HostReport, name=words, status=st.sampled_from(HostStatus), duration_s=seconds, error=maybe_words,
    steps=st.lists(steps, max_size=4).map(tuple),
    killed=st.lists(killed, max_size=3).map(tuple), gpus=st.lists(gpus, max_size=3).map(tuple), plan=st.none() | plans,
    scheduler=st.none() | schedulers, reason=st.none() | st.sampled_from(Reason),
    memory_before_mib=st.none() | st.lists(mib, max_size=8).map(tuple),
    health=st.lists(host_findings, max_size=2).map(tuple), start_s=st.none() | seconds,
    kept=st.lists(kept, max_size=3).map(tuple))
