"""Every host variable is declared once (the fields of `Host`); HostVars and docs/operating.md's table come from it."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
from support.paths import REPO

from fleet.inventory.host import Host
from fleet.inventory.load import load_inventory
from fleet.inventory.schema import VARIABLES, host_vars_model
from fleet.inventory.variables import HOST_VARIABLES, markdown_table
from fleet.model.errors import InventoryError

README = REPO / "docs" / "operating.md"  # the operator's reference, where the table lives
PACKAGE = REPO / "fleet" / "inventory"


def readme_table() -> str:
    """The table under docs/operating.md's "## Host variables": its consecutive lines starting with '|'."""
    lines = README.read_text().splitlines()
    start = lines.index("## Host variables")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("| variable |"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:end])


def test_readme_table_is_the_declaration() -> None:
    """Regenerate with `python -m fleet.inventory.variables` when this fails."""
    assert readme_table() == markdown_table()


def test_every_host_field_but_name_groups_and_plug_variables_is_a_variable() -> None:
    """The loader sets name, groups and the plugs' variables; every other field has its Var, and the level's model
    checks exactly those, then each plug's under its name, then a plug variable's old spelling."""
    declared = [v.name for v in HOST_VARIABLES]
    assert declared == [f.name for f in fields(Host) if f.name not in {"name", "groups", "plug_variables"}]
    assert list(VARIABLES) == declared
    assert list(host_vars_model().model_fields) == [*declared, "slurm", "slurm_node"]
    assert all(v.var.help and "\n" not in v.var.help and "|" not in v.var.help for v in HOST_VARIABLES)


def load(tmp_path: Path, text: str) -> Host:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return load_inventory(path).hosts["n1"]


def test_simulated_defaults_to_false(tmp_path: Path) -> None:
    """A node is real unless the inventory says it is simulated."""
    assert load(tmp_path, "hosts: {n1: null}").simulated is False
    assert load(tmp_path, "groups: {sim: {hosts: [n1], vars: {simulated: true}}}").simulated is True


def test_simulated_is_true_or_false(tmp_path: Path) -> None:
    """A string is not a bool, as for every bool variable."""
    with pytest.raises(InventoryError, match=r"hosts\.n1\.simulated: expected true or false, got 'yes'"):
        load(tmp_path, "hosts: {n1: {simulated: 'yes'}}")


BOUNDED = [(v.name, op, n) for v in HOST_VARIABLES for op, n in (("ge", v.var.ge), ("gt", v.var.gt)) if n is not None]


@pytest.mark.parametrize(("name", "op", "bound"), BOUNDED, ids=[b[0] for b in BOUNDED])
def test_declared_lower_bounds_are_enforced(tmp_path: Path, name: str, op: str, bound: int) -> None:
    """Each lower bound in the declaration refuses the value just past it, naming the key."""
    bad = bound - 1 if op == "ge" else bound
    with pytest.raises(InventoryError, match=rf"defaults\.{name}: must be greater than"):
        load(tmp_path, f"defaults: {{{name}: {bad}}}\nhosts: {{n1: null}}")


def test_declared_upper_bound_is_enforced(tmp_path: Path) -> None:
    """port's `le=65535`."""
    with pytest.raises(InventoryError, match=r"defaults\.port: must be less than or equal to 65535"):
        load(tmp_path, "defaults: {port: 65536}\nhosts: {n1: null}")


def _imports(path: Path) -> set[str]:
    """The fleet.inventory modules a file imports (at any level, TYPE_CHECKING blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fleet.inventory"):
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "fleet.inventory" else []
            found.update(names or [node.module])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fleet.inventory"))
    return found


def test_the_inventory_package_has_no_import_cycle() -> None:
    """No module of fleet.inventory imports, even indirectly, a module that imports it."""
    graph = {f"fleet.inventory.{p.stem}": _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            new = graph.get(todo.pop(), set()) - seen
            seen |= new
            todo += new
        return seen

    assert [m for m in graph if m in reachable(m)] == []


def test_loading_an_inventory_does_not_import_targeting() -> None:
    """load no longer re-exports targeting's `select`, so it does not pull targeting in."""
    code = "import sys, fleet.inventory.load; print('fleet.inventory.targeting' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_the_readme_lists_the_built_in_protected_names_as_declared() -> None:
    from fleet.inventory.host import BUILTIN_PROTECTED

    text = " ".join(README.read_text().split())
    assert f"Built-in protected names: {', '.join(BUILTIN_PROTECTED)}; and each scheduler's job daemons" in text
