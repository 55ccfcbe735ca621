"""fleet as a user installs it: the wheel built from a copy of this checkout (`python -m build`, as `make dist`),
installed into a fresh venv outside the checkout, and run from there: `fleet --version`, `fleet demo --nodes 2`,
`fleet inventory` on an example inventory. What a wheel can leave out (the awk and sh programs sent to the nodes,
the simulator's templates) shows here, never in the editable install the rest of the suite runs from.

Marked `wheel` (`make test-fast` leaves it out): it builds in an isolated environment and installs fleet's
dependencies from the package registry into the new venv, both at the versions requirements/lock.txt pins."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support.demo_run import demo_env
from support.paths import REPO

import fleet

pytestmark = pytest.mark.timeout(900)

DISTRIBUTION = "gpu-fleet"
LOCK = Path("requirements") / "lock.txt"
# What a checkout holds that is no part of the source: environments, caches, build output.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", ".pytest_cache",
                                    ".mypy_cache", ".ruff_cache", ".bench-venv", "*.pyc")


def clean_env() -> dict[str, str]:
    """This process's environment without what would point the installed fleet back at the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FLEET_INVENTORY")}


def run(argv: list[str], cwd: Path, timeout: float = 600,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env() if env is None else env
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    said = f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{said}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the checkout, as `make dist` builds it (its build backend at the locked
    version), and what the build printed."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    env = {**clean_env(), "PIP_CONSTRAINT": str(source / LOCK)}  # the isolated build environment's pip reads it
    proc = run([sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(source)], cwd=root, env=env)
    (wheel,) = (root / "dist").glob("gpu_fleet-*.whl")
    assert wheel.name.startswith(f"gpu_fleet-{fleet.__version__}-")
    return wheel, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def installed(built: tuple[Path, str]) -> Path:
    """The venv's bin folder, fleet installed in it from the wheel, its dependencies at the locked versions."""
    wheel, _ = built
    root = wheel.parent.parent
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    bin_dir = root / "venv" / "bin"
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--constraint", str(REPO / LOCK), str(wheel)],
        cwd=root)
    return bin_dir


def test_the_build_says_nothing_is_deprecated(built: tuple[Path, str]) -> None:
    """The build backend's deprecations (a license table, say) are fixed, not printed on every `make dist`."""
    _, said = built
    assert [line for line in said.splitlines() if re.search(r"deprecat|BuildBackendWarning", line, re.I)] == []


def test_the_installed_dependencies_are_the_locked_ones(installed: Path, tmp_path: Path) -> None:
    listing = run([str(installed / "python"), "-m", "pip", "list", "--format=json"], cwd=tmp_path).stdout
    pins = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", (REPO / LOCK).read_text(), re.M))
    pins = {normal(name): version for name, version in pins.items()}
    ours = {normal(p["name"]): p["version"] for p in json.loads(listing)}.items()
    # pip and setuptools are the venv's own (venv's bundled pip), not fleet's dependencies
    assert {name: version for name, version in ours
            if name not in ("pip", "setuptools", "gpu-fleet") and pins.get(name) != version} == {}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_installed_wheel_runs_from_its_own_site_packages(installed: Path, tmp_path: Path) -> None:
    where = run([str(installed / "python"), "-c", "import fleet; print(fleet.__file__)"], cwd=tmp_path).stdout
    assert Path(where.strip()).is_relative_to(installed.parent) and not Path(where.strip()).is_relative_to(REPO)
    meta = run([str(installed / "python"), "-c", f"import importlib.metadata as m; print(m.version({DISTRIBUTION!r}))"],
               cwd=tmp_path).stdout
    assert meta.strip() == fleet.__version__
    assert run([str(installed / "fleet"), "--version"], cwd=tmp_path).stdout == f"fleet {fleet.__version__}\n"


def test_the_installed_wheel_resets_a_simulated_fleet(installed: Path, tmp_path: Path) -> None:
    """The demo sends the awk and sh programs the package carries to its nodes: a wheel without them fails here."""
    with demo_env(tmp_path, clean_env()) as env:
        proc = run([str(installed / "fleet"), "demo", "--nodes", "2", "--log-dir", str(tmp_path / "logs")],
                   cwd=tmp_path, env=env)
    assert "as planned" in proc.stderr


def test_the_installed_wheel_reads_an_example_inventory(installed: Path, tmp_path: Path) -> None:
    inventory = shutil.copy(REPO / "inventory" / "site.yaml", tmp_path / "site.yaml")
    proc = run([str(installed / "fleet"), "inventory", "-i", str(inventory), "-g", "all", "--json"], cwd=tmp_path)
    assert '"hosts"' in proc.stdout and "gpu-" in proc.stdout
