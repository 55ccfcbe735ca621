"""The console script's warning filters: a library's warning never reaches the operator, fleet's own and the
operator's other filters still do."""

from __future__ import annotations

import re
import tomllib
import warnings
from importlib.metadata import packages_distributions

import pytest
from packaging.requirements import Requirement
from support.paths import REPO

from fleet.cli.library_warnings import LIBRARIES, quiet_libraries


def warn_from(category: type[Warning], module: str, operator: str = "default") -> list[str]:
    """The warnings that get through when `module` raises `category`, under the operator's `operator` filter."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter(operator)  # type: ignore[arg-type]
        quiet_libraries()
        warnings.warn_explicit("a message", category, filename="x.py", lineno=1, module=module,
                               registry={})
    return [str(w.category.__name__) for w in caught]


@pytest.mark.parametrize("module", ["asyncssh.crypto.misc", "cryptography.utils", "pydantic", "typer.main",
                                    "yaml.constructor", "ClusterShell.NodeSet"])
@pytest.mark.parametrize("category", [UserWarning, DeprecationWarning, RuntimeWarning, FutureWarning])
def test_every_warning_a_library_fleet_runs_on_raises_is_ignored(category: type[Warning], module: str) -> None:
    assert warn_from(category, module) == []


@pytest.mark.parametrize("module", ["some_plugin", "asyncio.base_events", "__main__"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_a_deprecation_from_any_module_outside_fleet_is_ignored(category: type[Warning], module: str) -> None:
    assert warn_from(category, module) == []


@pytest.mark.parametrize("category", [DeprecationWarning, UserWarning, RuntimeWarning])
@pytest.mark.parametrize("module", ["fleet", "fleet.engine.run"])
def test_fleet_s_own_warnings_still_show(category: type[Warning], module: str) -> None:
    assert warn_from(category, module) == [category.__name__]


def test_other_categories_of_other_modules_follow_the_operator_s_filters() -> None:
    """An asyncio ResourceWarning is shown, or raised under `-W error`: only the two rules are put in front."""
    assert warn_from(ResourceWarning, "asyncio.sslproto") == ["ResourceWarning"]
    with pytest.raises(RuntimeWarning):
        warn_from(RuntimeWarning, "asyncio.events", operator="error")
    assert warn_from(UserWarning, "fleetish") == ["UserWarning"]  # a name that only begins like fleet's is not fleet


def test_a_library_s_warning_is_not_raised_even_under_an_operator_s_w_error() -> None:
    assert warn_from(UserWarning, "asyncssh.crypto.misc", operator="error") == []


def test_libraries_names_every_dependency_s_import_package() -> None:
    """pyproject.toml's dependencies and LIBRARIES are one fact: a new dependency must be named there too."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {normal(Requirement(line).name) for line in dependencies}
    imported_as = {top for top, dists in packages_distributions().items() for dist in dists
                   if normal(dist) in wanted and top.isidentifier() and not top.startswith("_")}
    assert imported_as, "no dependency is installed"
    assert imported_as <= set(LIBRARIES), sorted(imported_as - set(LIBRARIES))


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
