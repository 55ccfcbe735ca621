"""The reset lock against a node's other users, through a stock OpenSSH sshd (integration suite, marker `sshd`).

fleet runs as root on the node; the unprivileged user `nobody` (real processes run with `setpriv --reuid=nobody
--regid=nogroup --clear-groups`) plants a symlink as the owner file, pre-creates the lock file, flocks it, or puts
a link where the lock's folder goes. Each must end fail-closed at once, with one line naming what is wrong (the
folder and its mode; the file, its owner and the holding pid), and nothing written through a link, whatever
fs.protected_symlinks says (this machine's value is in each failure's message). Every process a test starts is
ended by its pid, every folder removed, also on failure.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import pytest
from support.keys import ClientKey
from support.processes import lock_held
from support.scripted_node import Log
from support.sshd import Sshd

from fleet.inventory.host import Host
from fleet.model.report import Reason
from fleet.node.node import Node
from fleet.reset.lock import LockError, host_lock
from fleet.transport.ssh import open_ssh

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
SECRET = "root's own file\n"


def protected_symlinks() -> str:
    return Path("/proc/sys/fs/protected_symlinks").read_text().strip()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder like /run/lock (root's, mode 1777) in a folder every user may enter; removed after."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a process as nobody")
    top = Path(tempfile.mkdtemp(prefix="fleet-untrusted-"))
    try:
        top.chmod(0o755)
        (top / "lock").mkdir(mode=0o755)
        (top / "lock").chmod(0o1777)
        yield top / "lock"
    finally:
        shutil.rmtree(top)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root-only file a planted link points at: it must never change."""
    path = tmp_path / "secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def host(sshd: Sshd, client_key: ClientKey) -> Host:
    sshd.authorize(client_key.public_line)
    return Host(name="sshd", address="127.0.0.1", port=sshd.port, user=getpass.getuser(),
                identity_file=str(client_key.path), known_hosts=str(sshd.known_hosts), connect_timeout=5)


def as_nobody(*argv: str) -> None:
    subprocess.run([*NOBODY, *argv], check=True, capture_output=True, timeout=30)


def root_only(folder: Path) -> None:
    """What an admin does to a shared lock folder: root's own, mode 0700 (what was in it stays)."""
    folder.chmod(0o700)


def seen(path: Path) -> str:
    """What is at `path` now: `link`, `missing`, a folder's entries, or a file's text."""
    if path.is_symlink():
        return "link"
    if not path.exists():
        return "missing"
    return f"folder {sorted(p.name for p in path.iterdir())}" if path.is_dir() else path.read_text()


@pytest.fixture
def nobody_holds(shared: Path) -> Iterator[subprocess.Popen[str]]:
    """nobody's `flock -x LOCK sh -c 'echo held; exec sleep 600'` in the shared folder, holding; its process group
    (flock and the sleep it forked, which holds the lock) killed by its recorded pid, and reaped, after."""
    process = subprocess.Popen([*NOBODY, "flock", "-x", str(shared / "reset.lock"), "sh", "-c",
                                "echo held; exec sleep 600"], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


async def refused(host: Host, lock_file: Path) -> LockError:
    """The LockError fleet's lock ends with on the node (over real sshd, as root), at once."""
    events = Log()
    at = with_lock(host, lock_file)
    async with await open_ssh(at) as ssh:
        with pytest.raises(LockError) as caught:
            async with host_lock(Node(at, ssh, events), "run-a", held_s=60, wait_s=30):
                pytest.fail("took a lock another user can touch")
    assert "\n" not in str(caught.value)
    return caught.value


def with_lock(host: Host, lock_file: Path) -> Host:
    return replace(host, lock_file=str(lock_file))


async def test_a_symlinked_owner_file_in_a_shared_folder_writes_nothing(host: Host, shared: Path, victim: Path) -> None:
    owner = shared / "reset.lock.owner"
    as_nobody("ln", "-s", str(victim), str(owner))
    error = await refused(host, shared / "reset.lock")
    assert str(error) == (f"reset lock folder {shared} (owner root, uid 0, mode 1777) must be a folder of uid 0's own,"
                          " mode 0700, not a link"), f"fs.protected_symlinks={protected_symlinks()}"
    assert error.reason is Reason.PROBE_FAILED
    assert (seen(victim), seen(owner)) == (SECRET, "link")
    assert seen(shared / "reset.lock") == "missing"  # nothing opened, nothing created


async def test_a_symlinked_owner_file_left_in_a_folder_made_root_only_is_replaced_not_followed(
        host: Host, shared: Path, victim: Path) -> None:
    """The link was planted while the folder was shared; an admin then made it root's 0700: the lock is taken and
    the owner file written anew (removed, then created with O_EXCL), the link's target untouched."""
    owner = shared / "reset.lock.owner"
    as_nobody("ln", "-s", str(victim), str(owner))
    root_only(shared)
    at = with_lock(host, shared / "reset.lock")
    async with await open_ssh(at) as ssh, host_lock(Node(at, ssh, Log()), "run-a", held_s=60, wait_s=5):
        assert lock_held(str(shared / "reset.lock"))
        assert seen(owner) == "run-a\n"
    assert seen(victim) == SECRET, f"written through a link (fs.protected_symlinks={protected_symlinks()})"


async def test_a_lock_folder_that_is_a_link_is_refused(host: Host, shared: Path, victim: Path) -> None:
    theirs = shared / "theirs"
    as_nobody("mkdir", "-m", "0700", str(theirs))
    as_nobody("ln", "-s", str(theirs), str(shared / "fleet"))
    error = await refused(host, shared / "fleet" / "reset.lock")
    assert str(error) == f"reset lock folder {shared}/fleet is a symbolic link: fleet uses only a folder of its own"
    assert seen(theirs) == "folder []"


async def test_a_lock_file_another_user_created_fails_at_once_naming_its_owner(host: Host, shared: Path) -> None:
    lock_file = shared / "reset.lock"
    as_nobody("touch", str(lock_file))
    root_only(shared)  # the folder made root's own afterwards: the file in it is still nobody's
    error = await refused(host, lock_file)
    assert str(error) == f"reset lock {lock_file} is owned by nobody (uid 65534), not uid 0; held by: no process"
    assert error.reason is Reason.LOCKED
    assert seen(shared / "reset.lock.owner") == "missing"


async def test_a_lock_file_another_user_flocks_fails_at_once_naming_the_holding_pid(
        host: Host, shared: Path, nobody_holds: subprocess.Popen[str]) -> None:
    lock_file, pid = shared / "reset.lock", nobody_holds.pid
    root_only(shared)
    error = await refused(host, lock_file)
    owned = f"reset lock {lock_file} is owned by nobody (uid 65534), not uid 0"
    assert str(error) == f"{owned}; held by: pid {pid} (nobody)"
    os.chown(lock_file, 0, 0)  # root's file now, still held by nobody's process
    error = await refused(host, lock_file)
    assert str(error) == f"reset lock {lock_file} (owner root) is held by another user's process: pid {pid} (nobody)"
    assert error.reason is Reason.LOCKED
    assert nobody_holds.poll() is None and seen(shared / "reset.lock.owner") == "missing"


async def test_a_lock_folder_under_a_folder_another_user_owns_is_refused_naming_it(host: Host, shared: Path) -> None:
    """nobody's folder above the lock's: it could rename the lock's folder away and put its own in its place. Refused
    before anything is created, naming the folder and its owner."""
    theirs = shared.parent / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    error = await refused(host, theirs / "fleet" / "reset.lock")
    assert str(error) == (f"reset lock folder {theirs}/fleet: {theirs} above it is owned by nobody (uid 65534): its "
                          "owner could replace the lock's folder")
    assert error.reason is Reason.PROBE_FAILED
    assert seen(theirs) == "folder []"


async def test_a_lock_folder_under_a_folder_anyone_may_write_is_refused(host: Host, shared: Path) -> None:
    """root's folder, but mode 0777 without the sticky bit: any user may replace what is in it."""
    open_to_all = shared.parent / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    error = await refused(host, open_to_all / "fleet" / "reset.lock")
    assert str(error) == (f"reset lock folder {open_to_all}/fleet: {open_to_all} above it (mode 777) may be written "
                          "by others: they could replace the lock's folder")
    assert seen(open_to_all) == "folder []"
