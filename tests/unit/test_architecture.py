"""The shape of the package, checked: its rooms in layers, no import cycle, no private helper imported across modules,
one package that imports asyncssh (fleet.transport.ssh), the simulator reached only through a host variable, and
no module over 400 lines but a named few."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from support.paths import REPO

from fleet.model import plugs

PACKAGE = REPO / "fleet"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def every_import(path: Path) -> Iterator[ast.ImportFrom | ast.Import]:
    """Every import in a module, function bodies and `if TYPE_CHECKING:` included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def imported_modules(node: ast.ImportFrom | ast.Import, known: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    found = {base} if base in known else set()
    found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports anywhere (function bodies and `if TYPE_CHECKING:` included)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        deps: set[str] = set()
        for node in every_import(path):
            deps |= imported_modules(node, known)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        graph[name] = {parent for dep in deps for parent in _with_parents(dep)} - {name}
    return graph


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def test_no_import_cycle() -> None:
    """None anywhere in fleet/, the simulator included, counting imports in function bodies and for type checking
    (a cycle hidden there is still two modules that cannot be read, or moved, apart)."""
    graph = import_graph()
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(trail: list[str]) -> None:
        name = trail[-1]
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            if dep.startswith(name + "."):  # a package importing its own submodule is no cycle
                continue
            if state.get(dep) == "open":
                cycles.append([*trail[trail.index(dep):], dep])
            elif dep not in state:
                visit([*trail, dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit([name])
    assert cycles == []


def test_no_module_imports_another_modules_private_name() -> None:
    known = modules()
    bad = []
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fleet"):
                bad += [f"{name}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and a.name != "__version__"]
    assert bad == []


def test_asyncssh_is_imported_in_one_module_and_taken_from_there() -> None:
    """fleet.transport.ssh.asyncssh_quiet imports it (without its import-time warning); every other module that
    uses it, the simulator's SSH server included, takes it from there, and only the ssh package and the simulator
    use it."""
    importers = {name for name, path in modules().items()
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import | ast.ImportFrom)
                 and any((a.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] == "asyncssh"
                         for a in node.names)}
    takers = {name for name, path in modules().items()
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.ImportFrom) and node.module == "fleet.transport.ssh.asyncssh_quiet"}
    assert importers == {"fleet.transport.ssh.asyncssh_quiet"}
    assert {t for t in takers if not t.startswith(("fleet.sim.", "fleet.transport.ssh."))} == set()
    assert {"fleet.transport.ssh.transport", "fleet.sim.server"} <= takers


def test_product_code_never_asks_the_environment_whether_it_runs_on_a_simulator() -> None:
    """The simulator is reached through the host variable `simulated`, not an environment variable."""
    product = [p for n, p in modules().items() if not n.startswith("fleet.sim")]
    assert [p.name for p in product if "FLEET_SIM_NODE" in p.read_text()] == []
    assert "ENVIRON" not in (PACKAGE / "node" / "probes" / "lineage.awk").read_text()


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]


def test_only_the_simulator_and_the_demo_import_the_simulator() -> None:
    """The simulator may know the product; the product never knows the simulator (imports anywhere in a module,
    function bodies included)."""
    users = {name for name, path in modules().items()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom | ast.Import)
             and any(m == "fleet.sim" or m.startswith("fleet.sim.") for m in imported(node))}
    assert {u for u in users if not u.startswith("fleet.sim") and u != "fleet.cli.demo"} == set()


def test_the_importable_api_is_stated_and_every_name_resolves() -> None:
    """`fleet.__all__` names the API; each name is the object its module defines (imported on first use)."""
    import importlib

    import fleet

    assert set(fleet.__all__) == {"__version__", *vars(fleet)["_API"]}
    for name in fleet.__all__:
        assert getattr(fleet, name) is not None, name
    assert fleet.RunOptions is importlib.import_module("fleet.engine.options").RunOptions


def test_the_lowest_layers_never_import_the_report_layer() -> None:
    """errors, transport and node speak of outcomes through the leaf `fleet.model.outcomes`, never `fleet.report`
    (not even for type checking), and the leaf imports nothing of fleet."""
    low = {n: p for n, p in modules().items()
           if n == "fleet.model.errors" or n.startswith(("fleet.transport", "fleet.node"))}
    bad = sorted(f"{n}: {m}" for n, p in low.items() for node in every_import(p) for m in imported(node)
                 if m == "fleet.report" or m.startswith("fleet.report."))
    assert bad == []
    leaf = [m for node in every_import(modules()["fleet.model.outcomes"]) for m in imported(node)
            if m.startswith("fleet")]
    assert leaf == []


def test_errors_and_the_transport_seam_are_no_circle_even_for_type_checking() -> None:
    errors = [m for node in every_import(modules()["fleet.model.errors"]) for m in imported(node)]
    assert not [m for m in errors if m.startswith("fleet.transport")]


MAX_MODULE_LINES = 400
# The modules over MAX_MODULE_LINES today, each with why; the list can only shrink (an entry back under the limit
# fails the test until it is taken off), and no module joins it.
OVER_THE_LIMIT = {
    "fleet.slurm.srun": "--via srun's controller: read, reserve, one job step, cleanup; in rework",
    "fleet.sim.state": "simulator: the node's files and their rules, stdlib only, imported by every fake program",
    "fleet.sim.nvidia_smi": "simulator: one fake program, nvidia-smi byte for byte (CSV, -L, -q, -r, the table)",
    "fleet.sim.slurmcluster": "simulator: a real Slurm cluster's life on loopback (config, daemons, teardown)",
}


def test_no_module_is_over_400_lines_but_the_named_ones() -> None:
    """Modules of one concern, split before they grow past ~400 lines (the style guide's measured signal)."""
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    over = {name for name, count in lines.items() if count > MAX_MODULE_LINES}
    assert sorted(over - OVER_THE_LIMIT.keys()) == []
    assert sorted(name for name in OVER_THE_LIMIT if lines.get(name, 0) <= MAX_MODULE_LINES) == []


def test_the_table_of_health_checks_is_a_leaf_the_inventory_and_the_policy_read() -> None:
    """The health gate's checks are declared once, in `fleet.model.health_checks`, and the GPU facts they read once,
    in `fleet.model.gpu_facts`: the inventory (which names the checks), the node's parsers, the policy and the
    simulator import them, and they import nothing of fleet but the leaf `fleet.model.outcomes` (the facts: nothing
    at all), so none of those reaches another, nor the report layer, through them."""
    graph = import_graph()
    assert graph["fleet.model.gpu_facts"] == set()
    assert graph["fleet.model.health_checks"] == {"fleet", "fleet.model", "fleet.model.outcomes",
                                                  "fleet.model.gpu_facts"}
    assert {"fleet.inventory.host", "fleet.reset.health_gate"} <= {n for n, deps in graph.items()
                                                              if "fleet.model.health_checks" in deps}
    assert {"fleet.node.probes.health", "fleet.sim.node"} <= {n for n, deps in graph.items()
                                                             if "fleet.model.gpu_facts" in deps}


# The rooms, lowest first: a module imports only modules of its own room or of a lower one (every import counted).
# The Slurm plug sits above the engine: it implements the engine's `Scheduler` (and its `--via srun` controller runs
# the engine), and the engine reaches it only by name, through `fleet.model.plugs.SCHEDULERS`.
# A scheduler plug's room is the package of the modules its registry row names: a new plug needs no line here.
PLUG_ROOMS = tuple(sorted({module.rpartition(".")[0] for row in plugs.SCHEDULERS.values()
                           for module in (row.plug, row.jobs, row.variables) if module}))
LAYERS = (
    ("fleet.model", "fleet.terminal", "fleet.text", "fleet.version"),  # the shared words; the terminal's one
    # writer; bytes shown; the version
    ("fleet.inventory",),
    ("fleet.transport",),
    ("fleet.node",),
    ("fleet.reset",),  # the steps of a reset
    ("fleet.runlog",),  # a run's log folder and its per-node JSONL logs: the engine writes them, the history reads
    ("fleet.report",),  # presents a run: text, JSON, HTML, metrics, progress
    ("fleet.history",),  # records the runs (and reads their run folders): of the model, never of the engine
    ("fleet.engine",),  # runs the hosts: the core, `fleet.engine.run.run`
    PLUG_ROOMS,  # scheduler plugs: each the package its registry row names (Slurm's `fleet.slurm`)
    ("fleet.app",),  # the application around a run: history, summary, page, terminal, signals, the process's limits
    ("fleet.cli", "fleet.__main__"),
    ("fleet.sim",),  # the simulator knows the product; the product never knows it (but the demo, above)
)
# Imports of a higher room, each with why; the list can only shrink (an entry no longer true fails the test).
UPWARD = {
    ("fleet.cli.demo", "fleet.sim.fleetsim"): "`fleet demo` runs a simulated fleet",
    ("fleet.cli.demo", "fleet.sim.node"): "`fleet demo` runs a simulated fleet",
    ("fleet.cli.demo", "fleet.sim.slurmcluster"): "`fleet demo` runs a simulated fleet",
}


def layer(name: str) -> int:
    found = [i for i, rooms in enumerate(LAYERS) for room in rooms if name == room or name.startswith(room + ".")]
    assert found, f"{name} is in no room of LAYERS"
    return found[0]


def test_the_rooms_are_layers_model_transport_node_reset_report_engine_plugs_cli() -> None:
    """model <- inventory <- transport <- node <- reset <- runlog <- report <- history <- engine <- scheduler plugs <-
    app <- cli: a
    module of a lower room never imports one of a higher room, but the few named in UPWARD."""
    graph = import_graph()
    upward = {(name, dep) for name, deps in graph.items() if name != "fleet"
              for dep in deps if dep != "fleet" and layer(dep) > layer(name)
              and not any(d.startswith(dep + ".") for d in deps)}  # a parent, imported for its submodule
    assert sorted(upward - UPWARD.keys()) == []
    assert sorted(UPWARD.keys() - upward) == []
