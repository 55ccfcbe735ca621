"""The rack compared: across the hosts of a run, which ones are the odd ones out by the GPU
settings a benchmark's results depend on. Pure: no I/O.

A host's settings (`node_settings`) are one value per `PROPERTIES` entry, as the report shows it (`575.57.08`,
`700 W`), folded over its GPUs' (verify's `gpus[].settings`): every GPU alike gives that value; GPUs that differ
give `mixed: a, b` (a value of its own, so the host stands out); a GPU whose value nvidia-smi did not give makes
the host's value not observed (None). `compare` then takes, per property, the value most hosts have:

- a value more hosts have than any other is the majority; every host with another value is odd;
- a tie for the most (8 and 8; 1 and 1) has no majority: every observed host of the property is odd, none
  standing for the rack (fail closed: nothing says which half is right);
- a host whose value was not observed is odd whenever another host's was (never "the same"); a property no host
  gave (application clocks, which drivers from 590 deprecate) is not compared, and said so (`unobserved`);
- hosts that never reached verify have no settings and take no part; fewer than two hosts with settings, nothing
  is compared.

The fabric manager's version is the host's own (`FABRIC_MANAGER`, from verify's `nv-fabricmanager --version`:
`fleet.model.fabric`): its version where it runs; `ABSENT` on a host without one (no NVSwitch), which takes no
part in that property (`absent`: neither alike nor odd, never "not observed": a rack of PCIe nodes is not
"unobserved"); None where the binary gave no version (failed, timed out, unreadable), odd as any value not
observed.

A run's rack (`rack`: its hosts' reports in) is compared once; `odd` names its odd hosts out, each with why, and
`fail_odd` is `--uniform`'s verdict: an odd host out that ended clean fails, reason `not_uniform`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.model.fabric import FabricManager, FmState
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import HostReport, HostStatus, Reason, RunReport

__all__ = ["ABSENT", "FABRIC_MANAGER", "PROPERTIES", "Comparison", "Property", "compare", "compare_groups",
           "node_settings", "odd_hosts"]

Settings = Mapping[str, str | None]  # one host's: property name -> value as shown (None: not observed)


@dataclass(frozen=True)
class Property:
    """One thing compared across hosts: its name (the JSON key), its label in a line, and a GPU's value."""

    name: str
    label: str
    of: Callable[[GpuSettings], str | None]


def _switch(on: bool | None, pending: bool | None) -> str | None:
    if on is None:
        return None
    word = "on" if on else "off"
    return word if pending is None or pending == on else f"{word} (pending {'on' if pending else 'off'})"


def _watts(value: float | None) -> str | None:
    return None if value is None else f"{value:g} W"


def _clocks(gpu: GpuSettings) -> str | None:
    """The application clocks where the driver says them; else whether they are set (the clock event reason)."""
    if gpu.app_clock_graphics_mhz is not None and gpu.app_clock_memory_mhz is not None:
        return f"{gpu.app_clock_graphics_mhz}/{gpu.app_clock_memory_mhz} MHz"
    if gpu.app_clocks_setting is None:
        return None
    return "application clocks set" if gpu.app_clocks_setting else "default"


PROPERTIES: tuple[Property, ...] = (
    Property("driver", "driver", lambda g: g.driver),
    Property("vbios", "VBIOS", lambda g: g.vbios),
    Property("model", "model", lambda g: g.name),
    Property("power_limit", "power limit", lambda g: _watts(g.enforced_power_limit_w)),
    Property("clocks", "clocks", _clocks),
    Property("mig", "MIG", lambda g: _switch(g.mig, g.mig_pending)),
    Property("ecc", "ECC", lambda g: _switch(g.ecc, g.ecc_pending)),
)
GPU_COUNT = Property("gpus", "GPUs", lambda g: None)  # a host's, not a GPU's: how many verify listed
FABRIC_MANAGER = Property("fabric_manager", "fabric manager", lambda g: None)  # a host's: its version
LABELS = {p.name: p.label for p in (*PROPERTIES, GPU_COUNT, FABRIC_MANAGER)}
ABSENT = "absent"  # a host's value of a property it does not have (no fabric manager): it takes no part


def node_settings(gpus: Sequence[GpuSettings | None], listed: int | None = None,
                  fabric_manager: FabricManager | None = None) -> dict[str, str | None]:
    """One host's settings from its GPUs' (see the module; None: a GPU whose settings verify did not read);
    `listed`: how many GPUs verify listed (the count compared; by default how many settings there are);
    `fabric_manager`: verify's read of it (None: not read, so not observed)."""
    values: dict[str, str | None] = {GPU_COUNT.name: str(len(gpus) if listed is None else listed)}
    per_gpu = _values_per_gpu(gpus)
    for prop, seen in zip(PROPERTIES, zip(*per_gpu, strict=True) if per_gpu else [()] * len(PROPERTIES), strict=True):
        values[prop.name] = _fold(seen) if seen else None
    values[FABRIC_MANAGER.name] = _fabric_manager(fabric_manager)
    return values


def _values_per_gpu(gpus: Sequence[GpuSettings | None]) -> list[tuple[str | None, ...]]:
    """Each GPU's values of `PROPERTIES`, in order (None each: a GPU whose settings were not read); a GPU whose
    settings are the GPU before it's (nearly every GPU of a node; their attributes' dicts equal, compared in C: the
    fields a dataclass compares) has that GPU's values, not worked out again."""
    rows: list[tuple[str | None, ...]] = []
    for before, gpu in zip([None, *gpus], gpus, strict=False):  # each with the one before it (None: the first)
        if gpu is None:
            rows.append((None,) * len(PROPERTIES))
        elif before is not None and vars(before) == vars(gpu):
            rows.append(rows[-1])
        else:
            rows.append(tuple(prop.of(gpu) for prop in PROPERTIES))
    return rows


def _fabric_manager(found: FabricManager | None) -> str | None:
    if found is None or found.state is FmState.NOT_OBSERVED:
        return None
    return ABSENT if found.state is FmState.ABSENT else found.version


def _fold(seen: Sequence[str | None]) -> str | None:
    distinct = set(seen)
    if None in distinct:
        return None
    if len(distinct) == 1:
        return distinct.pop()
    return "mixed: " + ", ".join(sorted(v for v in distinct if v is not None))


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One property across the hosts compared: the majority value (None: a tie, or no host gave it), the hosts
    that have it, the odd ones out with their values (None: not observed)."""

    name: str
    majority: str | None
    alike: tuple[str, ...]
    odd: Mapping[str, str | None]
    unobserved: bool = False  # no host gave it: not compared
    absent: tuple[str, ...] = ()  # the hosts that do not have it (no fabric manager): neither alike nor odd

    @property
    def tie(self) -> bool:
        return self.majority is None and not self.unobserved and bool(self.odd)

    @property
    def label(self) -> str:
        return LABELS.get(self.name, self.name)


def compare(hosts: Mapping[str, Settings]) -> tuple[Comparison, ...]:
    """Each property compared across `hosts` (name -> settings, in the run's order); () for fewer than two."""
    if len(hosts) < 2:
        return ()
    names = [GPU_COUNT.name, *(p.name for p in PROPERTIES), FABRIC_MANAGER.name]
    return tuple(_one(name, {host: values.get(name) for host, values in hosts.items()}) for name in names)


def _one(name: str, found: Mapping[str, str | None]) -> Comparison:
    absent = tuple(host for host, value in found.items() if value == ABSENT)
    values = {host: value for host, value in found.items() if value != ABSENT}
    counts = Counter(v for v in values.values() if v is not None)
    if not counts:
        return Comparison(name=name, majority=None, alike=(), odd={}, unobserved=bool(values), absent=absent)
    ranked = counts.most_common()
    top = ranked[0][0] if len(ranked) == 1 or ranked[0][1] > ranked[1][1] else None
    alike = tuple(host for host, value in values.items() if top is not None and value == top)
    odd = {host: value for host, value in values.items() if top is None or value != top}
    return Comparison(name=name, majority=top, alike=alike, odd=odd, absent=absent)


def compare_groups(hosts: Mapping[str, Settings], groups: Mapping[str, Iterable[str]]) -> dict[str, tuple[
        Comparison, ...]]:
    """`compare` within each inventory group (group -> its hosts), for the groups with two hosts or more compared."""
    compared = {}
    for group, members in groups.items():
        within = {h: hosts[h] for h in members if h in hosts}
        if len(within) >= 2:
            compared[group] = compare(within)
    return compared


def odd_hosts(comparisons: Iterable[Comparison]) -> dict[str, list[str]]:
    """Each odd host and, per property it is odd by, one line: `driver 570.86.15, 15 others 575.57.08`."""
    lines: dict[str, list[str]] = {}
    for c in comparisons:
        for host, value in c.odd.items():
            lines.setdefault(host, []).append(why(c, value))
    return lines


def why(c: Comparison, value: str | None) -> str:
    """`driver 570.86.15 (15 others 575.57.08)`; a tie: `driver 570.86.15 (no majority: 575.57.08 on 8)`."""
    shown = value if value is not None else "not observed"
    if c.majority is not None:
        return f"{c.label} {shown} ({len(c.alike)} other{'s' if len(c.alike) != 1 else ''} {c.majority})"
    rivals = Counter(v for v in c.odd.values() if v is not None and v != value)
    said = ", ".join(f"{v} on {n}" for v, n in sorted(rivals.items()))
    return f"{c.label} {shown} (no majority{': ' + said if said else ''})"


# --- a run's rack: its hosts' settings compared, the odd ones out, and `--uniform`'s verdict on them ------------


def host_settings(host: HostReport | None) -> dict[str, str | None] | None:
    """A host's settings compared (`fleet.model.uniformity.node_settings` of its GPUs'); None where verify read no
    GPU's (it never ran, or a report of a fleet that did not read them): such a host takes no part."""
    if host is None or all(g.settings is None for g in host.gpus):
        return None
    return node_settings([g.settings for g in host.gpus], listed=len(host.gpus), fabric_manager=host.fabric_manager)


def _settings(hosts: Mapping[str, HostReport | None]) -> dict[str, Mapping[str, str | None]]:
    found = {name: host_settings(h) for name, h in hosts.items()}
    return {name: values for name, values in found.items() if values is not None}


@dataclass(frozen=True)
class Rack:
    """A run's hosts' settings (those verify read) and each property compared across them: made once a report
    (`rack`) for the JSON report, the summary's line and the page, which each show it."""

    read: Mapping[str, Mapping[str, str | None]]
    found: tuple[Comparison, ...]


def rack(hosts: Mapping[str, HostReport | None]) -> Rack:
    read = _settings(hosts)
    return Rack(read, compare(read))


def comparisons(hosts: Mapping[str, HostReport | None]) -> tuple[Comparison, ...]:
    """Each property compared across the hosts whose settings verify read; () for fewer than two."""
    return rack(hosts).found


def odd(hosts: Mapping[str, HostReport | None], compared: Rack | None = None) -> dict[str, list[str]]:
    """The odd hosts out, each with why (`driver 570.86.15 (15 others 575.57.08)`, one a property); `compared`:
    `rack(hosts)` when the caller has it."""
    return odd_hosts((compared or rack(hosts)).found)


def fail_odd(report: RunReport) -> RunReport:
    """`--uniform`: every odd host out that ended clean fails, reason `not_uniform`, its error naming each property
    it differs by; a host that failed already keeps its own reason."""
    lines = odd(report.hosts)
    hosts = {name: _failed(host, lines[name]) if name in lines and host.status is HostStatus.CLEAN else host
             for name, host in report.hosts.items()}
    return replace(report, hosts=hosts)


def _failed(host: HostReport, why: list[str]) -> HostReport:
    return replace(host, status=HostStatus.FAILED, reason=Reason.NOT_UNIFORM,
                   error=f"not uniform with the run's other hosts: {'; '.join(why)}")
