"""Shared fixtures: a client key pair, the real OpenSSH sshd, and a real Slurm cluster."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.keys import ClientKey, make_client_key
from support.slurm import StartCluster
from support.sshd import SSHD, Sshd, start_sshd

from fleet.sim.slurmcluster import SlurmCluster


@pytest.fixture
def client_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClientKey:
    """A fresh client key; any ssh-agent is hidden so only this key is offered."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return make_client_key(tmp_path / "client_key")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """The real OpenSSH sshd on 127.0.0.1 with its own host key; killed by pid after."""
    if not SSHD.exists():
        pytest.skip(f"{SSHD} not installed (apt-get install openssh-server; CI installs it)")
    server = start_sshd(tmp_path / "sshd")
    yield server
    server.stop()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path (/tmp/fleet-XXXXXXXX), removed after: room for the unix sockets a Slurm
    cluster makes under its root (108 bytes at most), which an xdist worker's tmp_path may not leave."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def slurm_cluster(short_tmp: Path) -> Iterator[StartCluster]:
    """Start real Slurm clusters (slurmctld + a slurmd per node, on loopback) under a short folder; each is
    stopped at teardown, also when the test failed. No skip: CI installs Slurm, and a machine without
    it fails with what to install."""
    started: list[SlurmCluster] = []
    with ExitStack() as stack:

        def start(
            nodes: Mapping[str, str],
            *,
            partitions: Mapping[str, Sequence[str]] | None = None,
            task_env: Mapping[str, Mapping[str, str]] | None = None,
            gpus: Mapping[str, int] | None = None,
        ) -> SlurmCluster:
            cluster = SlurmCluster(short_tmp / f"slurm{len(started)}", nodes, partitions=partitions, task_env=task_env,
                                   gpus=gpus)
            started.append(cluster)
            stack.callback(cluster.stop)
            return cluster.start()

        yield start


# A suite started under `nohup` inherits SIGHUP ignored, and fleet keeps an ignored SIGHUP ignored (nohup's
# promise): the hang-up tests, in this process and in every fleet they start, need SIGHUP's default disposition.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# The tiers: a test's folder under tests/ is its tier, and its marker (`pytest -m unit`, `-m "not sshd"`, ...).
TIERS = ("unit", "logic", "sim", "sshd", "slurm", "wheel", "browser")
TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str:
    """The tier of a test module: the folder under tests/ it lives in (a module anywhere else is an error)."""
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) != 2 or parts[0] not in TIERS:
        raise pytest.UsageError(f"{path}: a test module lives in one tier folder: tests/{{{','.join(TIERS)}}}/")
    return parts[0]


# `make test` runs the tiers in several pytest-xdist workers at once (`--dist loadgroup`, docs/contributing.md): a
# test owns what it starts (its tmp_path, ports bound at 0, processes ended by pid), so tests run side by side. A
# tier whose tests share something runs whole in one worker, one test after another: a Slurm cluster's nodes take
# the same loopback addresses in every test, its ports are picked free and bound later by daemons (a window another
# cluster's pick could fall into), and the wheel's tests share the one wheel they build.
ONE_WORKER = ("slurm", "wheel")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(getattr(pytest.mark, tier))
        if tier in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(tier))


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without COLUMNS and LINES, as from a pipe: a shell that exports them, or an xdist worker
    (which sets COLUMNS=80), would otherwise change how `fleet runs` fits its tables. A test that wants a width
    sets one."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
