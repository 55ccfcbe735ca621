"""known_hosts as OpenSSH reads it: the files a host's keys are checked against, each parsed once per version.

The file `known_hosts` names, else every default file that exists (the user's and the system's); a line that
cannot be parsed is skipped (the notes name those lines, for the host's log once) and the rest is used; no
usable line at all is a HostKeyError.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from fleet.inventory.host import Host, default_known_hosts
from fleet.model.errors import (
    HostKeyChanged,
    HostKeyError,
)
from fleet.transport.base import (
    Note,
)
from fleet.transport.ssh.asyncssh_quiet import asyncssh

T = TypeVar("T")

def known_hosts_paths(host: Host) -> tuple[Path, ...]:
    """The known_hosts files host's keys are checked against: the one `known_hosts` names, else every default file
    that exists, the user's and the system's (as OpenSSH reads them); HostKeyError when there is none."""
    keyscan = f"ssh-keyscan -p {host.port} {host.address}" if host.port else f"ssh-keyscan {host.address}"
    hint = f"host keys are always checked (add the key of {host.address}, e.g. {keyscan})"
    if host.known_hosts:
        path = Path(host.known_hosts).expanduser()
        if not path.is_file():
            raise HostKeyError(f"known_hosts file {path} does not exist: {hint}")
        return (path,)
    defaults = default_known_hosts()
    found = tuple(f.path for f in defaults if f.path.is_file())
    if not found:
        raise HostKeyError(f"no known_hosts file ({', '.join(f.written for f in defaults)}) exists: {hint}")
    return found


@dataclass(frozen=True)
class KnownHostsFile:
    """One known_hosts file as OpenSSH reads it: the lines that parse, the numbers of those skipped."""

    path: str
    lines: tuple[str, ...]
    skipped: tuple[int, ...] = ()

    def notes(self) -> tuple[Note, ...]:
        """What the host's log says once about this file: the lines that were skipped, if any."""
        if not self.skipped:
            return ()
        return (Note("known_hosts_skipped", {"path": self.path, "lines": list(self.skipped)}),)


@dataclass(frozen=True)
class KnownHosts:
    """The known_hosts files a host's keys are checked against, and the entries of every line of them that parses."""

    files: tuple[KnownHostsFile, ...]
    entries: asyncssh.SSHKnownHosts | None  # None: not one line could be read

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def notes(self) -> tuple[Note, ...]:
        """What the host's log says once about connecting: each file's skipped lines, one note a file."""
        return tuple(note for f in self.files for note in f.notes())


def read_known_hosts(path: str) -> KnownHostsFile:
    """Parse known_hosts line by line, keeping every line asyncssh can read and skipping the rest, as OpenSSH does
    (a bare `@cert-authority`, a broken hashed entry); lines are numbered from 1."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from exc
    good: list[str] = []
    skipped: list[int] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _parses(line):
            good.append(line)
        else:
            skipped.append(number)
    return KnownHostsFile(path, tuple(good), tuple(skipped))


def _parses(line: str) -> bool:
    try:
        asyncssh.import_known_hosts(line)
    except Exception:  # whatever asyncssh cannot read in a line, that line is skipped (OpenSSH skips it too)
        return False
    return True


# Parsed files, shared by every connection of the run: a fleet's known_hosts has a line a host, so parsing it
# again for each connection cost O(hosts^2) (3 ms a connection at 512 lines). One entry a (kind, path),
# stamped with mtime and size: a file that changes is read again and replaces its old entry.
_FILE_CACHE: dict[tuple[str, str], tuple[tuple[int, int], object]] = {}
# The entries of each set of known_hosts files, kept while every file of the set is the version parsed.
_KNOWN_CACHE: dict[tuple[str, ...], KnownHosts] = {}


def cached(kind: str, path: Path, load: Callable[[str], T]) -> T:
    stat = path.stat()
    key, stamp = (kind, str(path)), (stat.st_mtime_ns, stat.st_size)
    entry = _FILE_CACHE.get(key)
    if entry is None or entry[0] != stamp:
        entry = _FILE_CACHE[key] = (stamp, load(str(path)))
    return cast(T, entry[1])


def known_hosts(host: Host) -> KnownHosts:
    """host's known_hosts files, each parsed once per version; HostKeyError when there is none, or not one line
    of them can be read (no key can be trusted then, as when the host's key is not in them)."""
    files = tuple(cached("known_hosts", path, read_known_hosts) for path in known_hosts_paths(host))
    paths = tuple(f.path for f in files)
    known = _KNOWN_CACHE.get(paths)
    if known is None or any(old is not new for old, new in zip(known.files, files, strict=True)):
        lines = [line for f in files for line in f.lines]
        entries = asyncssh.import_known_hosts("\n".join(lines)) if lines else None
        known = _KNOWN_CACHE[paths] = KnownHosts(files, entries)
    if known.entries is None:
        raise HostKeyError(_unreadable(known, host))
    return known


def untrusted(known: KnownHosts, hostname: str, port: int) -> HostKeyError:
    """Why the key `hostname:port` showed was not trusted, in OpenSSH's terms: CHANGED when the files hold another
    key for the name looked up (`[name]:port` off port 22), else unknown; each names the files read, the name
    looked up, and what to run once the key is checked."""
    lookup = hostname if port == 22 else f"[{hostname}]:{port}"
    files = ", ".join(known.paths)
    address = hostname if _is_address(hostname) else ""
    listed = known.entries.match(hostname, address, None if port == 22 else port)[0] if known.entries else ()
    if listed:
        return HostKeyChanged(
            f"host key of {lookup} CHANGED: {files} holds another key for {lookup} (the node reinstalled, or"
            f" someone in between); once you know which, remove the old one: ssh-keygen -R '{lookup}' -f"
            f" {known.paths[0]}")
    port_option = "" if port == 22 else f" -p {port}"
    return HostKeyError(f"host key of {lookup} unknown: {lookup} is not in {files}; once checked, add it:"
                        f" ssh-keyscan -t ed25519{port_option} {hostname} >> {known.paths[0]}")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _unreadable(known: KnownHosts, host: Host) -> str:
    if len(known.files) == 1:
        (only,) = known.files
        lines = f" (lines skipped: {', '.join(map(str, only.skipped))})" if only.skipped else ""
        return f"known_hosts file {only.path} has no line that can be read{lines}: no host key of {host.address} " \
               "can be checked"
    skipped = "; ".join(f"{f.path}: {', '.join(map(str, f.skipped))}" for f in known.files if f.skipped)
    lines = f" (lines skipped: {skipped})" if skipped else ""
    return f"known_hosts files {', '.join(known.paths)} have no line that can be read{lines}: no host key of " \
           f"{host.address} can be checked"

