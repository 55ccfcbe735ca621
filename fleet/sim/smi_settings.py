"""The fake nvidia-smi's settings commands: what `--restore-settings` runs, answered with the real tool's texts.

    nvidia-smi -i N -pm 0|1          Enabled persistence mode for GPU <bus>.   / All done.
    nvidia-smi -i N -pl W            Power limit for GPU <bus> was set to W.00 W from OLD.00 W. / All done.
    nvidia-smi -i N -c MODE          Set compute mode to MODE for GPU <bus>.   / All done.
    nvidia-smi -i N -rgc|-rmc|-rac   All done.
    nvidia-smi -i N -lgc G[,G]       GPU clocks set to "(gpuClkMin G, gpuClkMax G)" for GPU <bus> / All done.
    nvidia-smi -i N -mig 0|1         Disabled MIG Mode for GPU <bus>           / All done.
    nvidia-smi -i N -e 0|1           Enabled ECC support for GPU <bus>.        / All done. / Reboot required.

Each text is from a real capture (tests/fixtures/nvidia-smi/settings_*.txt, SOURCES.md says where); `-pm 0`,
`-rmc` and `-rac`'s are built the same way and say so there. What a command sets is recorded per GPU
(`state.set_settings`) and printed by every later query, `-q` too; a MIG or ECC mode goes to `pending`, and the
next `nvidia-smi -r` makes it current (`applied`). A node whose spec has `power_limit_refused` refuses `-pl` as
a driver does for a caller without the permission (exit 4, NVML_ERROR_NO_PERMISSION). Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from fleet.sim import state

DONE = "All done.\n"
NO_PERMISSION = 4  # nvidia-smi's exit status is NVML's return code: NVML_ERROR_NO_PERMISSION
COMPUTE_MODES = {"0": "Default", "DEFAULT": "Default", "2": "Prohibited", "PROHIBITED": "Prohibited",
                 "3": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process"}
APP_CLOCKS = ("clocks.applications.graphics", "clocks.applications.memory")
DEFAULT_APP_CLOCKS = ("clocks.default_applications.graphics", "clocks.default_applications.memory")
REASON = "clocks_event_reasons.applications_clocks_setting"
# Application clocks (graphics, memory MHz) a driver before 590 prints, current and default alike, by GPU model:
# the H100's from the 535.183.01 capture, the H200's from the 580.159.04 one. 590 prints them as deprecated (the
# 590 captures), as does a model not listed here.
APP_CLOCKS_DEPRECATED_FROM = 590
APP_CLOCKS_MHZ = {"NVIDIA H100 80GB HBM3": ("1980", "2619"), "NVIDIA H200": ("1980", "3201")}


def app_clocks(driver: str, model: str) -> dict[str, str]:
    """The application clock fields a node on `driver` with GPUs of `model` prints (none: the table's deprecated
    text stands)."""
    major = driver.split(".", 1)[0]
    mhz = APP_CLOCKS_MHZ.get(model)
    if mhz is None or not major.isdigit() or int(major) >= APP_CLOCKS_DEPRECATED_FROM:
        return {}
    return dict(zip(APP_CLOCKS + DEFAULT_APP_CLOCKS, mhz + mhz, strict=True))

# The options, as `nvidia-smi -h` spells them, by the key `fleet.sim.nvidia_smi.parse_args` gives them.
OPTIONS = {
    "-pm": "persistence-mode", "--persistence-mode": "persistence-mode",
    "-pl": "power-limit", "--power-limit": "power-limit",
    "-c": "compute-mode", "--compute-mode": "compute-mode",
    "-rgc": "reset-gpu-clocks", "--reset-gpu-clocks": "reset-gpu-clocks",
    "-rmc": "reset-memory-clocks", "--reset-memory-clocks": "reset-memory-clocks",
    "-rac": "reset-applications-clocks", "--reset-applications-clocks": "reset-applications-clocks",
    "-lgc": "lock-gpu-clocks", "--lock-gpu-clocks": "lock-gpu-clocks",
    "-mig": "multi-instance-gpu", "--multi-instance-gpu": "multi-instance-gpu",
    "-e": "ecc-config", "--ecc-config": "ecc-config",
}
FLAGS = {"reset-gpu-clocks", "reset-memory-clocks", "reset-applications-clocks"}


class Target(NamedTuple):
    """One selected GPU: its index, bus id and what it prints now (--query-gpu fields, nounits)."""

    number: int
    bus_id: str
    facts: Mapping[str, str]


class Refused(Exception):
    """What the real tool prints, and its exit status, when the driver refuses."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code


def asked(opts: Mapping[str, str]) -> str | None:
    """The settings command among the options, if any."""
    return next((key for key in opts if key in set(OPTIONS.values())), None)


def _switch(value: str, what: str) -> bool:
    if value not in ("0", "1", "ENABLED", "DISABLED"):
        raise Refused(f"Invalid {what} value: {value}\n", 2)
    return value in ("1", "ENABLED")


def _one(root: Path, config: state.NodeConfig, key: str, value: str, gpu: Target) -> str:
    """Apply one command to one GPU; the lines it prints for it (before the closing "All done.")."""
    def record(**said: str) -> None:
        state.set_settings(root, config, gpu.number, said)

    if key == "persistence-mode":
        on = _switch(value, "persistence mode")
        record(persistence_mode="Enabled" if on else "Disabled")
        return f"{'Enabled' if on else 'Disabled'} persistence mode for GPU {gpu.bus_id}.\n"
    if key == "power-limit":
        if config.get("power_limit_refused"):
            raise Refused(f"Failed to set power management limit for GPU {gpu.bus_id}: Insufficient Permissions\n",
                          NO_PERMISSION)
        watts, old = float(value), float(gpu.facts.get("power.limit", "0"))
        record(**{"power.limit": f"{watts:.2f}", "enforced.power.limit": f"{watts:.2f}"})
        return f"Power limit for GPU {gpu.bus_id} was set to {watts:.2f} W from {old:.2f} W.\n"
    if key == "compute-mode":
        mode = COMPUTE_MODES.get(value.upper())
        if mode is None:
            raise Refused(f"Invalid compute mode value: {value}\n", 2)
        record(compute_mode=mode)
        return f"Set compute mode to {mode.upper()} for GPU {gpu.bus_id}.\n"
    if key == "lock-gpu-clocks":
        low, _, high = value.partition(",")
        record(**{REASON: "Active"})
        return f'GPU clocks set to "(gpuClkMin {low}, gpuClkMax {high or low})" for GPU {gpu.bus_id}\n'
    if key == "multi-instance-gpu":
        on = _switch(value, "MIG mode")
        record(**{"mig.mode.pending": "Enabled" if on else "Disabled"})
        return f"{'Enabled' if on else 'Disabled'} MIG Mode for GPU {gpu.bus_id}\n"
    if key == "ecc-config":
        on = _switch(value, "ECC mode")
        record(**{"ecc.mode.pending": "Enabled" if on else "Disabled"})
        return f"{'Enabled' if on else 'Disabled'} ECC support for GPU {gpu.bus_id}.\n"
    said = {REASON: "Not Active"}
    if key == "reset-applications-clocks":
        said |= {app: gpu.facts[default] for app, default in zip(APP_CLOCKS, DEFAULT_APP_CLOCKS, strict=True)
                 if default in gpu.facts}
    record(**said)
    return ""


def change(root: Path, config: state.NodeConfig, opts: Mapping[str, str], targets: Sequence[Target]) -> str:
    """What `nvidia-smi [-i N] <settings option>` prints on the selected GPUs (all without `-i`); `Refused`."""
    key = asked(opts)
    assert key is not None
    lines = "".join(_one(root, config, key, opts[key], gpu) for gpu in targets)
    return lines + DONE + ("Reboot required.\n" if key == "ecc-config" else "")


def applied(root: Path, config: state.NodeConfig, targets: Sequence[Target]) -> None:
    """A GPU reset makes the pending MIG and ECC modes current."""
    for gpu in targets:
        said = {now: gpu.facts[pending] for now, pending in (("mig.mode.current", "mig.mode.pending"),
                                                            ("ecc.mode.current", "ecc.mode.pending"))
                if pending in gpu.facts}
        state.set_settings(root, config, gpu.number, said)
