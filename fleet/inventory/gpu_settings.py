"""`gpu_settings:` in the inventory: the mapping that says a host's expected GPU profile (`fleet.model.gpu_profile`).

Read strictly: an unknown key or a bad value is an inventory error naming the file and the key
(`site.yaml: defaults.gpu_settings.power_limit: ...`). Keys, each optional (unset: the default profile's):
`persistence` (on/off), `compute_mode` (Default, Exclusive_Process, Prohibited), `mig` (on/off), `power_limit`
(`default` or watts), `clocks` (`default`, or locked `{graphics: MHz, memory: MHz}`), `ecc` (on/off; unset: not
judged). YAML 1.1 reads a bare on/off as true/false: both spellings are taken.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from fleet.model.gpu_profile import Clocks, GpuProfile

__all__ = ["KEYS_OF", "WRITTEN", "GpuSettingsSpec", "LockedClocks", "as_written", "from_written"]

_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=True)


def _switch(value: object) -> object:
    """`on`/`off` (as written, or as YAML 1.1 reads them: true/false) as a bool; anything else is refused."""
    if isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    raise ValueError(f"expected on or off, got {value!r}")


Switch = Annotated[bool, BeforeValidator(_switch)]
Mhz = Annotated[int, Field(gt=0, le=100_000)]


class LockedClocks(BaseModel):
    """`clocks: {graphics: 1980, memory: 2619}`: the clocks to lock, in MHz (one of them at least)."""

    model_config = _CONFIG

    graphics: Mhz | None = None
    memory: Mhz | None = None


def _power_limit(value: object) -> object:
    if value == "default":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected 'default' or a number of watts, got {value!r}")
    if not 0 < value <= 10_000 or value != value:
        raise ValueError(f"expected a number of watts above 0 and at most 10000, got {value!r}")
    return float(value)


def _clocks(value: object) -> object:
    if value == "default":
        return None
    if not isinstance(value, dict):
        raise ValueError(f"expected 'default' or locked clocks {{graphics: MHz, memory: MHz}}, got {value!r}")
    if all(mhz is None for mhz in value.values()):
        raise ValueError("expected locked clocks with graphics or memory MHz, got none")
    return value


class GpuSettingsSpec(BaseModel):
    """What `gpu_settings:` may say (see the module)."""

    model_config = _CONFIG

    persistence: Switch = True
    compute_mode: Literal["Default", "Exclusive_Process", "Prohibited"] = "Default"
    mig: Switch = False
    power_limit: Annotated[float | None, BeforeValidator(_power_limit)] = None
    clocks: Annotated[LockedClocks | None, BeforeValidator(_clocks)] = None
    ecc: Switch | None = None

    def profile(self) -> GpuProfile:
        clocks = None if self.clocks is None else Clocks(self.clocks.graphics, self.clocks.memory)
        return GpuProfile(persistence=self.persistence, compute_mode=self.compute_mode, mig=self.mig,
                          power_limit_w=self.power_limit, clocks=clocks, ecc=self.ecc)


# The keys each mapping takes, for the error that names an unknown one.
KEYS_OF: dict[str, tuple[str, ...]] = {"gpu_settings": tuple(GpuSettingsSpec.model_fields),
                                       "clocks": tuple(LockedClocks.model_fields)}
WRITTEN = Annotated[GpuSettingsSpec, AfterValidator(GpuSettingsSpec.profile)]  # what a level writes: a profile


def from_written(value: object) -> GpuProfile:
    """The profile `as_written` wrote (`--via srun`'s document to the node); ValueError when it is not one."""
    try:
        return GpuSettingsSpec.model_validate(value).profile()
    except ValidationError as exc:
        raise ValueError(f"gpu_settings: {exc.errors()[0]['msg']}") from None


def as_written(profile: GpuProfile) -> dict[str, object]:
    """The profile as the inventory writes it (`fleet inventory`'s JSON)."""
    def on(flag: bool) -> str:
        return "on" if flag else "off"
    clocks: object = "default" if profile.clocks is None else \
        {k: v for k, v in (("graphics", profile.clocks.graphics_mhz), ("memory", profile.clocks.memory_mhz)) if v}
    return {"persistence": on(profile.persistence), "compute_mode": profile.compute_mode, "mig": on(profile.mig),
            "power_limit": "default" if profile.power_limit_w is None else profile.power_limit_w, "clocks": clocks,
            "ecc": None if profile.ecc is None else on(profile.ecc)}
