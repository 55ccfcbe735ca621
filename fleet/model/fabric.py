"""A node's NVIDIA Fabric Manager as verify read it (the rack compared by its version). Pure: no I/O.

Three states, never guessed one from another:

- `present`: `nv-fabricmanager --version` answered with its version line (`Fabric Manager version is :
  535.161.08`): `version` holds it;
- `absent`: the node has no `nv-fabricmanager` (no NVSwitch: PCIe GPUs, or a platform whose fabric is managed off
  the node): no fabric manager, which is a fact of the node and never a difference from the others;
- `not_observed`: it was there but gave no version (it failed, timed out, was not run or printed something
  unreadable): `why` says which. Never equal to anything (`fleet.model.uniformity` fails it closed).

A host whose verify did not read it (it never reached verify, or a report of a fleet before this read) has none
(`HostReport.fabric_manager` is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FabricManager", "FmState"]


class FmState(StrEnum):
    PRESENT = "present"
    ABSENT = "absent"
    NOT_OBSERVED = "not_observed"


@dataclass(frozen=True)
class FabricManager:
    """`{"state", "version", "why"}`: `version` set only when present, `why` only when not observed."""

    state: FmState
    version: str | None = None
    why: str | None = None

    def __post_init__(self) -> None:
        if (self.state is FmState.PRESENT) != (self.version is not None):
            raise ValueError(f"a fabric manager {self.state} has {'no' if self.version is None else 'a'} version")
        if (self.state is FmState.NOT_OBSERVED) != (self.why is not None):
            raise ValueError(f"a fabric manager {self.state} says {'no' if self.why is None else 'a'} why")

    @classmethod
    def present(cls, version: str) -> FabricManager:
        return cls(FmState.PRESENT, version=version)

    @classmethod
    def absent(cls) -> FabricManager:
        return cls(FmState.ABSENT)

    @classmethod
    def unread(cls, why: str) -> FabricManager:
        return cls(FmState.NOT_OBSERVED, why=why)
