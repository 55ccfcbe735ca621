"""What bounds a remote command, with its name: every bound is derived from the host's `command_timeout`.

A command gets `command_timeout`; one that asks the GPU driver (nvidia-smi: `Probe.driver`) gets
`SMI_FACTOR` times it, because nvidia-smi is the one tool whose latency on a healthy 8-GPU node can pass 10 s:
with persistence mode it answers in well under 2 s, without it every call initialises each GPU again (1-3 s
a GPU, NVIDIA's "Driver Persistence"; 30 s measured on 8-GPU VMs, Azure/aks-gpu#105; docs/operating.md's "What a
reset does on each node" has the figures and sources). A step's budget can end a command sooner (what was
left of it); the bound that ended a command is named in its error and in its log event (`Bound.name`).

Pure: `command_bound`, `smi_bound`, `of`, `within` and the budgets sized from them (`commands_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from fleet.inventory.host import Host
from fleet.node.budget import TimeBudget

# nvidia-smi's bound over command_timeout: 3 x 10 s covers an 8-GPU node without persistence mode (8 x 1-3 s,
# 30 s measured) at the default command_timeout.
SMI_FACTOR = 3
COMMAND = "command_timeout"
SMI = f"nvidia-smi's bound: {SMI_FACTOR} x command_timeout"
LEFT = "what was left of"  # a bound the step's budget set (`within`)
# What a node whose nvidia-smi ran past its bound is told to do: a GPU reset clears a hung GPU when the driver
# still takes one, a reboot the rest.
WEDGED_REMEDY = "reset its GPUs (--gpu-reset) or reboot the node"


@dataclass(frozen=True)
class Bound:
    """A command's bound in seconds and what set it (`command_timeout`, `gpu_reset_timeout`, ...)."""

    seconds: float
    name: str

    def __str__(self) -> str:
        return f"{self.seconds:g} s ({self.name})"


def command_bound(host: Host) -> Bound:
    return _named(host.command_timeout, COMMAND)


def smi_bound(host: Host) -> Bound:
    """nvidia-smi's bound: SMI_FACTOR x command_timeout (an 8-GPU node without persistence mode is slow, not dead)."""
    return _named(SMI_FACTOR * host.command_timeout, SMI)


@lru_cache(maxsize=256, typed=True)  # typed: 10 and 10.0 log apart
def _named(seconds: float, name: str) -> Bound:
    """A bound made once for all the commands and hosts that share it (a Bound is a value: frozen)."""
    return Bound(seconds, name)


def of(host: Host, driver: bool) -> Bound:
    """The bound of a command on this host: nvidia-smi's when it asks the GPU driver, else command_timeout."""
    return smi_bound(host) if driver else command_bound(host)


def within(bound: Bound, budget: TimeBudget | None, step: object = None) -> Bound:
    """The bound, or what is left of the step's budget when that is less (BudgetSpent when nothing is)."""
    if budget is None:
        return bound
    left = budget.command_timeout(bound.seconds)
    if left >= bound.seconds:
        return bound
    whose = f"{step}'s" if step is not None else "the step's"
    return Bound(left, f"{LEFT} {whose} {budget.seconds:g} s budget")


def is_budget(name: str | None) -> bool:
    """Whether a bound's name (`Bound.name`, `CommandTimeout.bound`) is what was left of a step's budget rather
    than the command's own bound: a command it ended was cut by the step's end, not found hung."""
    return name is not None and name.startswith(LEFT)


def commands_s(host: Host, *, smi: int = 0, other: int = 0) -> float:
    """Seconds for `smi` nvidia-smi commands and `other` commands, each at its bound: a step's room for them."""
    return smi * smi_bound(host).seconds + other * command_bound(host).seconds

