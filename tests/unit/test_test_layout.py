"""The suite's own shape: every test module in one tier folder, helpers only in tests/support, no test module
importing another, and each tier a marker pyproject declares."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
from conftest import TIERS, tier_of
from support.paths import REPO, TESTS


def python_files() -> list[Path]:
    return [p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts]


def imported_roots(path: Path) -> set[str]:
    """The top-level names a module imports, function bodies included."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_test_module_lives_in_a_tier_folder() -> None:
    tests = [p for p in python_files() if p.name.startswith("test_")]
    assert sorted({tier_of(p) for p in tests}) == sorted(TIERS)  # and tier_of raises for a module anywhere else
    stray = [p.relative_to(TESTS) for p in python_files()
             if p.parent == TESTS and p.name != "conftest.py"]
    assert stray == [], "helpers belong in tests/support, tests in a tier folder"


def test_no_test_module_imports_another_and_the_helpers_import_no_test() -> None:
    test_names = {p.stem for p in python_files() if p.name.startswith("test_")}
    offenders = {str(p.relative_to(TESTS)): sorted(imported_roots(p) & test_names) for p in python_files()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_conftest_is_imported_from_the_root_and_only_by_this_check() -> None:
    importers = [p.relative_to(TESTS) for p in python_files() if "conftest" in imported_roots(p)]
    assert importers == [Path("unit/test_test_layout.py")]


def test_each_tier_is_a_declared_marker() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [line.split(":")[0] for line in declared] == list(TIERS)


def test_a_module_outside_the_tiers_is_refused() -> None:
    with pytest.raises(pytest.UsageError, match="tier folder"):
        tier_of(TESTS / "test_stray.py")
    with pytest.raises(pytest.UsageError, match="tier folder"):
        tier_of(TESTS / "unit" / "nested" / "test_x.py")
