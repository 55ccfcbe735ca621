"""fleet: make racks of GPU nodes clean again, many at once, and prove it.

The importable API is what `__all__` names: load an inventory, choose hosts, run, read the report. `run` is the
core: it returns the run's report and writes the hosts' logs (in `log_dir`), nothing else; it prints nothing and
leaves the calling process as it was (its garbage collector, file limit and signal handlers). A benchmark sweep
that resets its rack before each benchmark, and stops when a host is not clean:

    import anyio
    import fleet

    async def sweep(benchmarks, inventory="site.yaml", log_dir=None):
        hosts = fleet.select(fleet.load_inventory(inventory), groups=["blackwell"])
        for benchmark in benchmarks:
            report = await fleet.run(hosts, fleet.RunOptions(deadline_s=600), log_dir=log_dir)
            dirty = {name: h.error for name, h in report.hosts.items() if h.status is not fleet.HostStatus.CLEAN}
            if dirty:
                return dirty  # which hosts, and why: no benchmark on a rack not proven clean
            await benchmark(hosts)
        return {}

    async def allreduce(hosts):  # a benchmark: the harness's own script, on the rack fleet proved clean
        await anyio.run_process(["./bench/allreduce.sh", *(h.name for h in hosts)])

    if __name__ == "__main__":
        print(anyio.run(sweep, [allreduce]) or "every benchmark ran on a clean rack")

`run_and_report` is the command line's run: the same, with the history, summary.json, report.html and the report
on stdout and stderr (`fleet.app.run`). Each name is imported on first use (PEP 562), so `import fleet` (and
`fleet --version`) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fleet.version import __version__

# name -> the module that defines it
_API = {
    "Host": "fleet.inventory.host",
    "Inventory": "fleet.inventory.load",
    "load_inventory": "fleet.inventory.load",
    "select": "fleet.inventory.targeting",
    "Mode": "fleet.engine.walk",
    "RunOptions": "fleet.engine.options",
    "SchedulerOptions": "fleet.engine.options",
    "run": "fleet.engine.run",
    "run_and_report": "fleet.app.run",
    "RunReport": "fleet.model.report",
    "HostReport": "fleet.model.report",
    "HostStatus": "fleet.model.report",
    "Reason": "fleet.model.report",
    "FleetError": "fleet.model.errors",
    "UsageError": "fleet.model.errors",
}

__all__ = [
    "FleetError", "Host", "HostReport", "HostStatus", "Inventory", "Mode", "Reason", "RunOptions", "RunReport",
    "SchedulerOptions", "UsageError", "__version__", "load_inventory", "run", "run_and_report", "select",
]

if TYPE_CHECKING:
    from fleet.app.run import run_and_report
    from fleet.engine.options import RunOptions, SchedulerOptions
    from fleet.engine.run import run
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
