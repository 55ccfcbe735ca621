"""Hypothesis strategies for a host's report (`HostReport` and its parts), every field the JSON document carries:
the codec's round-trip tests draw from them. Values the document normalises (a step's error and reason, which the
document does not carry; a scheduler's empty optional values, which it leaves out) are drawn only in the form the
document keeps, so that a report drawn here comes back equal."""

from __future__ import annotations

from hypothesis import strategies as st

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
host_findings = st.builds(HostFinding, words, levels, words, maybe_words)
steps = st.builds(StepResult, st.sampled_from(StepName), st.sampled_from(StepStatus), seconds, words)
killed = st.builds(KilledProcess, pids, words, words, st.sampled_from(("SIGTERM", "SIGKILL")))
kept = st.builds(KeptProcess, pids, words, words, words)
maybe_switch = st.none() | st.booleans()
maybe_watts = st.none() | st.floats(min_value=0, max_value=5000, allow_nan=False)
maybe_mhz = st.none() | st.integers(min_value=0, max_value=10_000)
gpu_settings = st.builds(GpuSettings, maybe_words, maybe_words, maybe_words, maybe_switch, maybe_words, maybe_switch,
                         maybe_switch, maybe_switch, maybe_switch, maybe_watts, maybe_watts, maybe_watts, maybe_switch,
                         maybe_mhz, maybe_mhz, maybe_mhz, maybe_mhz)
gpus = st.builds(GpuReport, st.integers(min_value=0, max_value=63), mib, maybe_words, maybe_words, mib,
                 st.none() | seconds, st.lists(findings, max_size=2).map(tuple), st.none() | gpu_settings)
planned = st.builds(PlannedProcess, pids, words, words, mib, maybe_words)
plans = st.builds(HostPlan, st.dictionaries(words, words, max_size=3).map(lambda d: tuple(d.items())),
                  st.lists(planned, max_size=2).map(tuple), st.lists(planned, max_size=2).map(tuple),
                  st.lists(mib, max_size=8).map(tuple), st.lists(words, max_size=2).map(tuple))
set_words = st.none() | st.text(min_size=1, max_size=12)  # an optional scheduler value: absent, or not empty
schedulers = st.builds(SchedulerRecord, words, maybe_words, maybe_words, maybe_words, maybe_words,
                       st.lists(words, max_size=3).map(tuple), set_words, set_words, st.booleans(),
                       st.none() | st.floats(min_value=0.001, max_value=1e5, allow_nan=False), set_words)
hosts = st.builds(
    HostReport, words, st.sampled_from(HostStatus), seconds, maybe_words, st.lists(steps, max_size=4).map(tuple),
    st.lists(killed, max_size=3).map(tuple), st.lists(gpus, max_size=3).map(tuple), st.none() | plans,
    st.none() | schedulers, st.none() | st.sampled_from(Reason), st.none() | st.lists(mib, max_size=8).map(tuple),
    st.lists(host_findings, max_size=2).map(tuple), st.none() | seconds, st.lists(kept, max_size=3).map(tuple))
