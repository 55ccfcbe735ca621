"""A simulated GPU node in a directory: fake nvidia-smi and systemctl, real processes.

`SimNode` builds and drives one node (see `fleet.sim.node`); the node-side
programs are `fleet.sim.worker`, `fleet.sim.unitd`, `fleet.sim.systemctl` and
`fleet.sim.nvidia_smi`. The names below load lazily so that those programs,
which the node starts often, do not pay for importing the Python API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet.sim.node import NodeSpec, SimError, SimNode, UnitSpec, WorkerSpec
    from fleet.sim.nvidia_smi import SMI_MODES

__all__ = ["SMI_MODES", "NodeSpec", "SimError", "SimNode", "UnitSpec", "WorkerSpec"]


def __getattr__(name: str) -> object:
    if name == "SMI_MODES":
        from fleet.sim import nvidia_smi

        return nvidia_smi.SMI_MODES
    if name in __all__:
        from fleet.sim import node

        return getattr(node, name)
    raise AttributeError(f"module 'fleet.sim' has no attribute {name!r}")
