"""The GPU settings a host is expected to have (`gpu_settings:` in the inventory), and how a GPU differs from them.

Pure. `GpuProfile` is the expected profile (default: persistence on, compute mode Default, MIG off, the GPU's default
power limit, no locked or application clocks; ECC not judged unless set). `differences` compares what nvidia-smi
said of one GPU (`GpuSettings`, read in verify's reads) with it: one `Difference` per setting that differs, or that
nvidia-smi did not say ("not observed", never "fine"); `findings` are its lines, the unsaid ones folded into one.
The health gate weighs them as the check `gpu_settings`
(`fleet.reset.health_gate`); `fleet.reset.restore` turns them into the nvidia-smi commands that restore the profile.

Persistence mode off where the profile wants it on is left to the health check `persistence`, which judges exactly
that already: one finding per fact.

A leaf of the model: it imports only `fleet.model.gpu_facts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleet.model.gpu_facts import GpuSettings

__all__ = ["COMPUTE_MODES", "DEFAULT_PROFILE", "Clocks", "Difference", "GpuProfile", "Setting", "differences",
           "findings"]

COMPUTE_MODES = ("Default", "Exclusive_Process", "Prohibited")  # as nvidia-smi prints them (and `-c` takes them)
WATTS_SLACK = 0.5  # nvidia-smi prints limits to the hundredth of a watt; `-pl` takes whole or fractional watts


@dataclass(frozen=True)
class Clocks:
    """Locked clocks the profile expects (`nvidia-smi -lgc G,G` / `-lmc M,M`), in MHz; None: that one not locked."""

    graphics_mhz: int | None = None
    memory_mhz: int | None = None


@dataclass(frozen=True, kw_only=True)
class GpuProfile:
    """The expected settings of every GPU of a host (see the module)."""

    persistence: bool = True
    compute_mode: str = "Default"
    mig: bool = False
    power_limit_w: float | None = None  # None: the GPU's default power limit
    clocks: Clocks | None = None  # None: no locked and no application clocks
    ecc: bool | None = None  # None: not judged


DEFAULT_PROFILE = GpuProfile()


class Setting(StrEnum):
    """What a difference is about: what `fleet.reset.restore` restores with one command (or a GPU reset)."""

    PERSISTENCE = "persistence"
    COMPUTE_MODE = "compute_mode"
    MIG = "mig"
    POWER_LIMIT = "power_limit"
    CLOCKS = "clocks"
    APP_CLOCKS = "app_clocks"
    ECC = "ecc"


@dataclass(frozen=True)
class Difference:
    """One setting of one GPU that is not the profile's: what it is about, the line a finding says, and whether
    nvidia-smi did not say it (nothing to restore then: nothing is known to differ)."""

    setting: Setting
    detail: str  # "power limit 450 W, default 700 W"
    observed: bool = True


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _w(watts: float) -> str:
    return f"{watts:g} W"


_UNSAID = " (nvidia-smi did not say it)"


def _not_observed(setting: Setting, what: str) -> Difference:
    return Difference(setting, f"{what} not observed{_UNSAID}", observed=False)


def _persistence(profile: GpuProfile, gpu: GpuSettings) -> list[Difference]:
    if gpu.persistence is None:
        return [_not_observed(Setting.PERSISTENCE, "persistence mode")]
    if profile.persistence is False and gpu.persistence:
        return [Difference(Setting.PERSISTENCE, "persistence mode on, profile off")]
    return []  # off where the profile wants it on: the health check `persistence` says it


def _compute_mode(profile: GpuProfile, gpu: GpuSettings) -> list[Difference]:
    if gpu.compute_mode is None:
        return [_not_observed(Setting.COMPUTE_MODE, "compute mode")]
    if gpu.compute_mode != profile.compute_mode:
        return [Difference(Setting.COMPUTE_MODE, f"compute mode {gpu.compute_mode}, profile {profile.compute_mode}")]
    return []


def _switch(setting: Setting, what: str, want: bool, now: bool | None, pending: bool | None) -> list[Difference]:
    """MIG and ECC: the mode now, and the mode pending the next GPU reset."""
    if now is None:
        return [_not_observed(setting, what)]
    if now != want:
        after = "" if pending is None or pending == now else f" ({_on(pending)} pending a GPU reset)"
        return [Difference(setting, f"{what} {_on(now)}{after}, profile {_on(want)}")]
    if pending is not None and pending != want:
        return [Difference(setting, f"{what} {_on(pending)} pending a GPU reset, profile {_on(want)}")]
    return []


def _power_limit(profile: GpuProfile, gpu: GpuSettings) -> list[Difference]:
    want, against = (profile.power_limit_w, "profile") if profile.power_limit_w is not None else \
        (gpu.default_power_limit_w, "default")
    if gpu.power_limit_w is None or want is None:
        missing = "power limit" if gpu.power_limit_w is None else "default power limit"
        return [_not_observed(Setting.POWER_LIMIT, missing)]
    if abs(gpu.power_limit_w - want) > WATTS_SLACK:
        return [Difference(Setting.POWER_LIMIT, f"power limit {_w(gpu.power_limit_w)}, {against} {_w(want)}")]
    return []


def _clocks(profile: GpuProfile, gpu: GpuSettings) -> list[Difference]:
    """No locked or application clocks (the default), or the locked ones the profile names. nvidia-smi shows clocks
    set by `-lgc`/`-lmc`/`-ac` as the clock event reason "Applications Clocks Setting"; it does not say the locked
    values, so a profile's locked values are never said to hold."""
    found: list[Difference] = []
    app, default = (gpu.app_clock_graphics_mhz, gpu.app_clock_memory_mhz), \
        (gpu.default_app_clock_graphics_mhz, gpu.default_app_clock_memory_mhz)
    if None not in app and None not in default and app != default:
        found.append(Difference(Setting.APP_CLOCKS, f"application clocks {app[0]}/{app[1]} MHz, default "
                                                    f"{default[0]}/{default[1]} MHz"))
    if profile.clocks is not None:
        locked = [f"{what} {mhz} MHz" for what, mhz in (("graphics", profile.clocks.graphics_mhz),
                                                          ("memory", profile.clocks.memory_mhz)) if mhz is not None]
        found.append(_not_observed(Setting.CLOCKS, f"locked clocks ({', '.join(locked)} in the profile)"))
    elif gpu.app_clocks_setting is None:
        found.append(_not_observed(Setting.CLOCKS, "clock event reason Applications Clocks Setting"))
    elif gpu.app_clocks_setting and not found:
        found.append(Difference(Setting.CLOCKS, "locked or application clocks in force (clock event reason "
                                                "Applications Clocks Setting)"))
    return found


def findings(profile: GpuProfile, gpu: GpuSettings) -> tuple[str, ...]:
    """The health gate's lines for one GPU: each difference, and what nvidia-smi did not say folded into one
    (`not observed: compute mode, power limit (nvidia-smi did not say them)`)."""
    found = differences(profile, gpu)
    unsaid = [d.detail.removesuffix(_UNSAID) for d in found if not d.observed]
    folded = [] if not unsaid else [f"{unsaid[0]}{_UNSAID}"] if len(unsaid) == 1 else \
        [f"not observed: {', '.join(u.removesuffix(' not observed') for u in unsaid)} (nvidia-smi did not say them)"]
    return (*(d.detail for d in found if d.observed), *folded)


def differences(profile: GpuProfile, gpu: GpuSettings) -> tuple[Difference, ...]:
    """Every setting of `gpu` that is not `profile`'s, or that nvidia-smi did not say, in a fixed order."""
    found = [*_persistence(profile, gpu), *_compute_mode(profile, gpu),
             *_switch(Setting.MIG, "MIG mode", profile.mig, gpu.mig, gpu.mig_pending),
             *_power_limit(profile, gpu), *_clocks(profile, gpu)]
    if profile.ecc is not None:
        found += _switch(Setting.ECC, "ECC mode", profile.ecc, gpu.ecc, gpu.ecc_pending)
    return tuple(found)
