"""The GPU reset (`--gpu-reset`, opt in): the remedy for memory that never comes back.

When settle's window passes and a GPU still holds memory that no process holds (a leaked context, as one
complete look at the node shows: `fleet.reset.leaks`), `nvidia-smi -r` clears it short of a reboot. It is only
tried where it can work:

Decides (pure, below): `nvidia-smi -r -i N` (N: nvidia-smi's index) for each GPU left holding memory, or
`nvidia-smi -r` for all of them together on an NVSwitch baseboard (HGX/DGX: the GPUs of one baseboard are reset
as one; on Ampere, Fabric Manager must be running for it, on Hopper and later it is not needed); refused, naming
them, while any process (a protected one too: nvidia-persistenced, DCGM's nv-hostengine hold the GPUs open)
holds a GPU to be reset, which the look tells by each device file's minor number, never by taking it for an
index: the real tool refuses then, and fleet never stops a protected daemon on its own. Asks the node: the
resets, each bounded by what is left of `gpu_reset_timeout` (a whole baseboard's reset takes far longer than
`command_timeout`). Reports: what was reset, or why not.

Runs under the node's reset lock (it is part of settle). After it, settle waits again and verify judges.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.report import StepName
from fleet.node.bounds import Bound
from fleet.node.budget import Room
from fleet.node.node import Node
from fleet.node.probe import ANY_EXIT, Probe
from fleet.node.probes import smi
from fleet.reset.protection import Holder

# What a reset that does not end within its bound means (`{s}`: the bound in seconds).
RESET_HANG = "nvidia-smi -r did not end within {s} s ({bound})"


def reset_room(host: Host) -> Room:
    """The GPU resets, all together within `gpu_reset_timeout`, and a command's room past it."""
    return Room(0.0, host.gpu_reset_timeout + host.command_timeout)


@dataclass(frozen=True)
class GpuReset:
    """What to reset: `gpus` (nvidia-smi indexes), all of them at once on an NVSwitch baseboard; or, in
    `blocked`, why not (`pid 77 nvidia-cuda-mps-server (...) still hold gpu 3`)."""

    gpus: tuple[int, ...] = ()
    together: bool = False
    blocked: str | None = None


def reset_argv(nvidia_smi: str, gpu: int | None) -> list[str]:
    """`nvidia-smi -r [-i N]`: one GPU by its nvidia-smi index, or (None) every GPU of the node."""
    return [nvidia_smi, "-r"] if gpu is None else [nvidia_smi, "-r", "-i", str(int(gpu))]


def reset_probe(nvidia_smi: str, gpu: int | None) -> Probe[str]:
    what = "nvidia-smi -r" if gpu is None else f"nvidia-smi -r -i {gpu}"
    return Probe(argv=tuple(reset_argv(nvidia_smi, gpu)), what=what, parse=str, needs_root=True, ok_exits=ANY_EXIT,
                 hang=RESET_HANG)


def choose_gpu_reset(leaked: Collection[int], held: Mapping[int, Sequence[Holder]], nvswitch: bool | None,
               all_gpus: Collection[int]) -> GpuReset:
    """Which GPUs to reset for the `leaked` ones, or why a reset must not be tried (pure). `held`: GPU index ->
    the processes with its device file open; `nvswitch` None: `nvidia-smi -q` could not be read."""
    if nvswitch is None:
        return GpuReset(blocked="nvidia-smi -q could not be read: which GPUs a reset takes with it is unknown")
    targets = set(all_gpus) if nvswitch else set(leaked)
    blocking = list(dict.fromkeys(h for gpu in sorted(targets) for h in held.get(gpu, ())))
    if blocking:
        names = ", ".join(f"{h.label()}{f' ({h.protected_by})' if h.protected_by else ''}" for h in blocking[:3])
        more = f" and {len(blocking) - 3} more" if len(blocking) > 3 else ""
        scope = "the baseboard's GPUs" if nvswitch else "gpu " + ",".join(map(str, sorted(targets)))
        return GpuReset(blocked=f"{names}{more} still hold {scope}")
    return GpuReset(tuple(sorted(targets)), together=nvswitch)


@dataclass(frozen=True)
class ResetOutcome:
    """Whether the reset ran, and one line: what it reset, or why it did not."""

    ran: bool
    line: str


async def reset_gpus(node: Node, chosen: GpuReset) -> ResetOutcome:
    """Run the chosen resets, all within `gpu_reset_timeout` (and one command's room): each `nvidia-smi -r` is
    bounded by what is left of it, not by `command_timeout`."""
    host = node.host
    if chosen.blocked is not None:
        node.log.warning("gpu_reset_refused", step="settle", reason=chosen.blocked)
        return ResetOutcome(False, f"gpu reset refused: {chosen.blocked}")
    node.log.warning("gpu_reset", step="settle", gpus=list(chosen.gpus), together=chosen.together)
    budget = reset_room(host).start()
    for gpu in [None] if chosen.together else list(chosen.gpus):
        probe = reset_probe(host.nvidia_smi, gpu)
        answers = await node.batch([(probe, Bound(host.gpu_reset_timeout, "gpu_reset_timeout"))], step=StepName.SETTLE,
                                   budget=budget)
        try:
            res = answers.result(probe)
        except StepFailed as exc:  # it hung: what state it left the GPUs in is unknown
            return ResetOutcome(False, f"gpu reset failed: {exc}")
        if res.exit_status != 0:
            why = smi.classify_smi_failure(res.exit_status, res.stdout, res.stderr)
            return ResetOutcome(False, f"gpu reset failed: {why}")
    scope = "all GPUs (NVSwitch baseboard)" if chosen.together else "gpu " + ",".join(map(str, chosen.gpus))
    return ResetOutcome(True, f"reset {scope} with nvidia-smi -r")
