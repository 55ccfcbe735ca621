"""What `--restore-settings` changes on a node (pure): the nvidia-smi commands that give each GPU its profile back.

From the differences of each GPU with the host's profile (`fleet.model.gpu_profile.differences`), each with
`-i INDEX`: `-pm 1` (or `-pm 0`) first (a limit set without persistence mode goes when the driver unloads), `-c
MODE`, `-pl W` (the default limit, or the profile's), `-rgc`, `-rmc`, `-rac` (locked and application clocks). A
setting nvidia-smi did not say is not restored (nothing is known to differ). MIG and ECC modes take effect only at
a GPU reset: with `--gpu-reset` their change (`-mig`, `-e`) is made and the GPU reset (`-r -i INDEX`); without it
they are held back, said to need one. Locked clocks a profile names are never set: nvidia-smi does not say the
locked values, so fleet cannot tell whether they differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.model.gpu_facts import GpuSettings
from fleet.model.gpu_profile import Difference, GpuProfile, Setting, differences

__all__ = ["Change", "Restoration", "restoration"]


@dataclass(frozen=True, kw_only=True)
class Change:
    """One nvidia-smi command for one GPU: its arguments after `nvidia-smi` (`-i 3 -pl 700`), what it restores, and
    whether a GPU reset (`-r`) is what applies it."""

    gpu: int
    args: tuple[str, ...]
    what: str  # "power limit 450 W, default 700 W"
    reset: bool = False  # the GPU reset that applies a pending MIG or ECC mode

    @property
    def line(self) -> str:
        return f"gpu {self.gpu}: nvidia-smi {' '.join(self.args)} ({self.what})"


@dataclass(frozen=True)
class Restoration:
    """The changes, in order; and the differences held back: needing a GPU reset that `--gpu-reset` was not given
    for, one line each (`gpu 1: MIG mode on, profile off: takes a GPU reset (--gpu-reset)`)."""

    changes: tuple[Change, ...] = ()
    held: tuple[str, ...] = ()


_NEEDS_RESET = (Setting.MIG, Setting.ECC)


def _commands(gpu: int, d: Difference, profile: GpuProfile, settings: GpuSettings) -> list[tuple[str, ...]]:
    i = ("-i", str(gpu))
    if d.setting is Setting.CLOCKS:
        return [(*i, "-rgc"), (*i, "-rmc"), (*i, "-rac")]
    if d.setting is Setting.APP_CLOCKS:
        return [(*i, "-rac")]
    if d.setting is Setting.POWER_LIMIT:
        watts = profile.power_limit_w if profile.power_limit_w is not None else settings.default_power_limit_w
        return [(*i, "-pl", f"{watts:g}")]
    if d.setting is Setting.COMPUTE_MODE:
        return [(*i, "-c", profile.compute_mode.upper())]
    if d.setting is Setting.PERSISTENCE:
        return [(*i, "-pm", "1" if profile.persistence else "0")]
    if d.setting is Setting.MIG:
        return [] if settings.mig_pending is profile.mig else [(*i, "-mig", "1" if profile.mig else "0")]
    pending_ok = settings.ecc_pending is profile.ecc
    return [] if pending_ok else [(*i, "-e", "1" if profile.ecc else "0")]


def _gpu_changes(gpu: int, settings: GpuSettings, profile: GpuProfile,
                 gpu_reset: bool) -> tuple[list[Change], list[str]]:
    changes: list[Change] = []
    held: list[str] = []
    found = [d for d in differences(profile, settings) if d.observed]
    if profile.persistence and settings.persistence is False:  # the health check `persistence` says it; restored here
        found.insert(0, Difference(Setting.PERSISTENCE, "persistence mode off, profile on"))
    resets = False
    for d in found:
        if d.setting in _NEEDS_RESET and not gpu_reset:
            held.append(f"gpu {gpu}: {d.detail}: takes a GPU reset (--gpu-reset)")
            continue
        changes += [Change(gpu=gpu, args=args, what=d.detail) for args in _commands(gpu, d, profile, settings)]
        resets = resets or d.setting in _NEEDS_RESET
    if resets:
        changes.append(Change(gpu=gpu, args=("-i", str(gpu), "-r"), what="applies the pending MIG or ECC mode",
                              reset=True))
    return changes, held


def restoration(gpus: Sequence[tuple[int, GpuSettings]], profile: GpuProfile, *,
                 gpu_reset: bool = False) -> Restoration:
    """The changes that restore `profile` on each GPU (nvidia-smi index, its settings), GPU by GPU (see the module)."""
    changes: list[Change] = []
    held: list[str] = []
    for index, settings in gpus:
        mine, waiting = _gpu_changes(index, settings, profile, gpu_reset)
        changes += mine
        held += waiting
    return Restoration(tuple(changes), tuple(held))
