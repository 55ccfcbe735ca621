"""fleet: make racks of GPU nodes clean again, many at once, and prove it.

The importable API is what `__all__` names: load an inventory, choose hosts, run, read the report.

    from fleet import RunOptions, load_inventory, run_and_report, select
    hosts = select(load_inventory("site.yaml"), groups=["blackwell"])
    code, report = anyio.run(functools.partial(run_and_report, hosts, RunOptions(), as_json=False, log_dir=None))

Each name is imported on first use (PEP 562), so `import fleet` (and `fleet --version`) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# name -> the module that defines it
_API = {
    "Host": "fleet.inventory.host",
    "Inventory": "fleet.inventory.load",
    "load_inventory": "fleet.inventory.load",
    "select": "fleet.inventory.targeting",
    "Mode": "fleet.engine.walk",
    "RunOptions": "fleet.engine.options",
    "SchedulerOptions": "fleet.engine.options",
    "run_and_report": "fleet.engine.run",
    "RunReport": "fleet.model.report",
    "HostReport": "fleet.model.report",
    "HostStatus": "fleet.model.report",
    "Reason": "fleet.model.report",
    "FleetError": "fleet.model.errors",
    "UsageError": "fleet.model.errors",
}

__all__ = [
    "FleetError", "Host", "HostReport", "HostStatus", "Inventory", "Mode", "Reason", "RunOptions", "RunReport",
    "SchedulerOptions", "UsageError", "__version__", "load_inventory", "run_and_report", "select",
]

if TYPE_CHECKING:
    from fleet.engine.options import RunOptions, SchedulerOptions
    from fleet.engine.run import run_and_report
    from fleet.engine.walk import Mode
    from fleet.inventory.host import Host
    from fleet.inventory.load import Inventory, load_inventory
    from fleet.inventory.targeting import select
    from fleet.model.errors import FleetError, UsageError
    from fleet.model.report import HostReport, HostStatus, Reason, RunReport


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'fleet' has no attribute {name!r}")
