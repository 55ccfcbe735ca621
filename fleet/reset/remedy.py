"""The GPU reset (`--gpu-reset`, opt in): the remedy for memory that never comes back.

When settle's window passes and a GPU still holds memory that no process of its own accounts for (a
leaked context), `nvidia-smi -r` clears it short of a reboot. It is only tried where it can work:

Asks the node: the holder scan (who still holds each GPU's device file) and `nvidia-smi -q` (does the node
have an NVSwitch fabric), then `nvidia-smi -r -i N` for each GPU left holding memory, or `nvidia-smi -r` for
all of them together on an NVSwitch baseboard (HGX/DGX: the GPUs of one baseboard are reset as one; on
Ampere, Fabric Manager must be running for it, on Hopper and later it is not needed). Decides (pure,
below): refuse, naming them, while any process (a protected one too: nvidia-persistenced, DCGM's
nv-hostengine hold the GPUs open) holds a GPU to be reset: the real tool refuses then, and fleet never
stops a protected daemon on its own. Reports: what was reset, or why not.

Runs under the node's reset lock (it is part of settle). After it, settle waits again and verify judges.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleet.node.budget import Budget
from fleet.node.node import Node
from fleet.node.probe import ANY_EXIT, Probe
from fleet.node.probes import health, smi
from fleet.report.models import StepName
from fleet.reset.holders import scan_holders
from fleet.reset.protection import Holder

_GPU_DEVICE = re.compile(r"nvidia(\d+)$")
# Commands the reset may run: a holder scan (up to 5), nvidia-smi -q, and a reset per GPU.
REMEDY_COMMANDS = 16


@dataclass(frozen=True)
class ResetPlan:
    """What to reset: `gpus` (indexes), all of them at once on an NVSwitch baseboard; or why not."""

    gpus: tuple[int, ...] = ()
    together: bool = False
    refused: str | None = None


def reset_argv(nvidia_smi: str, gpu: int | None) -> list[str]:
    """`nvidia-smi -r [-i N]`: one GPU, or (None) every GPU of the node."""
    return [nvidia_smi, "-r"] if gpu is None else [nvidia_smi, "-r", "-i", str(int(gpu))]


def reset_probe(nvidia_smi: str, gpu: int | None) -> Probe[str]:
    what = "nvidia-smi -r" if gpu is None else f"nvidia-smi -r -i {gpu}"
    return Probe(tuple(reset_argv(nvidia_smi, gpu)), what, str, needs_root=True, ok_exits=ANY_EXIT,
                 hang=smi.SMI_HANG)


def gpus_held(holder: Holder) -> set[int]:
    """The GPU indexes whose device file (`.../nvidiaN`) the holder has open."""
    found = set()
    for device in holder.devices:
        match = _GPU_DEVICE.search(device)
        if match:
            found.add(int(match.group(1)))
    return found


def plan_reset(leaked: Collection[int], holders: Sequence[Holder], nvswitch: bool,
               all_gpus: Collection[int]) -> ResetPlan:
    """Which GPUs to reset for the `leaked` ones, or why a reset must not be tried (pure)."""
    targets = set(all_gpus) if nvswitch else set(leaked)
    blocking = [h for h in holders if gpus_held(h) & targets]
    if blocking:
        names = ", ".join(f"{h.label()}{f' ({h.protected_by})' if h.protected_by else ''}" for h in blocking[:3])
        scope = "the baseboard's GPUs" if nvswitch else "gpu " + ",".join(map(str, sorted(targets)))
        return ResetPlan(refused=f"gpu reset refused: {names} still hold {scope}")
    return ResetPlan(tuple(sorted(targets)), together=nvswitch)


@dataclass(frozen=True)
class ResetOutcome:
    """Whether the reset ran, and one line: what it reset, or why it did not."""

    ran: bool
    line: str


async def reset_gpus(node: Node, leaked: Collection[int], all_gpus: Collection[int]) -> ResetOutcome:
    """Plan the reset from who holds what and whether the node has an NVSwitch fabric, then run it."""
    host = node.host
    budget = Budget(0.0, slack=REMEDY_COMMANDS * host.command_timeout)
    holders = await scan_holders(node, StepName.SETTLE, budget)
    rows = await node.ask(health.health(host.nvidia_smi), step=StepName.SETTLE, budget=budget)
    plan = plan_reset(leaked, holders, any(r.fabric_state is not None for r in rows), all_gpus)
    if plan.refused:
        node.log.warning("gpu_reset_refused", step="settle", reason=plan.refused)
        return ResetOutcome(False, plan.refused)
    node.log.warning("gpu_reset", step="settle", gpus=list(plan.gpus), together=plan.together)
    for gpu in [None] if plan.together else list(plan.gpus):
        res = await node.run(reset_probe(host.nvidia_smi, gpu), step=StepName.SETTLE, budget=budget)
        if res.exit_status != 0:
            why = smi.classify_smi_failure(res.exit_status, res.stdout, res.stderr)
            return ResetOutcome(False, f"gpu reset failed: {why}")
    scope = "all GPUs (NVSwitch baseboard)" if plan.together else "gpu " + ",".join(map(str, plan.gpus))
    return ResetOutcome(True, f"reset {scope} with nvidia-smi -r")
