"""An in-process SSH server for one simulated node.

Each exec request runs `/bin/sh -c COMMAND` in the node's root with the
node's environment, in a session of its own, stdout and stderr sent back
apart, and the exit status (or signal) reported. What the client sends on
the channel goes to the command's stdin, and the client's EOF closes it, as
sshd does: a command that reads stdin until EOF ends when the client says so.
When the client closes the channel or the connection drops before the command
ends, every process of that session is SIGKILLed and reaped: nothing started
over SSH outlives its SSH session. Only the one authorized client key is
accepted.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio

from fleet.transport.sessions import REAP_TIMEOUT_S, signal_session
from fleet.transport.ssh.asyncssh_quiet import asyncssh

_READ_CHUNK = 64 * 1024
_STDERR = asyncssh.EXTENDED_DATA_STDERR
_EXIT_NOT_RUN = 127


def authorized_keys(key: asyncssh.SSHKey | Path) -> asyncssh.SSHAuthorizedKeys:
    """The keys a server accepts: one public (or private) key, or an authorized_keys file."""
    if isinstance(key, Path):
        return asyncssh.import_authorized_keys(key.read_text())
    return asyncssh.import_authorized_keys(key.export_public_key().decode())


class SimServer:
    """An SSH server for one node: `async with SimServer(...)` or start()/stop()."""

    def __init__(
        self,
        root: Path,
        env: Mapping[str, str],
        authorized_key: asyncssh.SSHKey | Path,
        *,
        host_key: asyncssh.SSHKey | None = None,
    ) -> None:
        self.root = root
        self.env = dict(env)
        self.host_key = host_key or asyncssh.generate_private_key("ssh-ed25519")
        self.commands: list[str] = []  # every exec request received, in order
        self.address = ""
        self.port = 0
        self._authorized = authorized_keys(authorized_key)
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._stall_listener: asyncio.Server | None = None
        self._stalled: set[asyncio.StreamWriter] = set()
        self._conns: set[asyncssh.SSHServerConnection] = set()
        self._procs: set[asyncio.subprocess.Process] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def host_key_line(self) -> str:
        """`ssh-ed25519 AAAA...`: the public host key as known_hosts writes it."""
        return self.host_key.export_public_key().decode().strip()

    @property
    def connection_count(self) -> int:
        """Client connections open now."""
        return len(self._conns)

    def known_hosts_line(self) -> str:
        """The known_hosts line for this server's address and port."""
        return f"[{self.address}]:{self.port} {self.host_key_line}"

    async def start(self, address: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on address:port (0: a free port, then read `.port`)."""
        self._acceptor = await asyncssh.create_server(
            lambda: _NodeSshServer(self),
            address,
            port,
            server_host_keys=[self.host_key],
            authorized_client_keys=self._authorized,
            encoding=None,
            password_auth=False,
            kbdint_auth=False,
            login_timeout=30,
        )
        self.address, self.port = address, self._acceptor.get_port()

    async def stall(self) -> None:
        """From now on accept TCP on the same port and never say a word."""
        self._close_acceptor()
        self._stall_listener = await asyncio.start_server(self._hold, self.address, self.port)

    def drop_connections(self) -> None:
        """Abort every client connection now, as a crashed host would."""
        for conn in list(self._conns):
            conn.abort()

    async def stop(self) -> None:
        """Stop listening, end every connection and kill what they started (shielded)."""
        with anyio.move_on_after(REAP_TIMEOUT_S, shield=True):
            self._close_acceptor()
            self._close_stalled()
            for conn in list(self._conns):
                conn.close()
            for proc in list(self._procs):
                signal_session(proc.pid)
            if self._tasks:
                await asyncio.wait(list(self._tasks))
            for conn in list(self._conns):
                await conn.wait_closed()

    def _close_acceptor(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None

    def _close_stalled(self) -> None:
        if self._stall_listener is not None:
            self._stall_listener.close()
            self._stall_listener = None
        for writer in self._stalled:
            writer.close()
        self._stalled.clear()

    async def _hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._stalled.add(writer)

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conns.add(conn)

    def connection_lost(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conns.discard(conn)

    def run_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run one session's command in a task that stop() waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def spawn(self, command: str) -> asyncio.subprocess.Process:
        """`/bin/sh -c command` in the node's root and environment, in its own session."""
        self.commands.append(command)
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            env=self.env,
            cwd=self.root,
            start_new_session=True,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._procs.add(proc)
        return proc

    def reaped(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.discard(proc)


class _NodeSshServer(asyncssh.SSHServer):
    """Per-connection callbacks: track the connection, hand out exec sessions."""

    def __init__(self, sim: SimServer) -> None:
        self._sim = sim
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._sim.connection_made(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._sim.connection_lost(self._conn)

    def session_requested(self) -> _ExecSession:
        return _ExecSession(self._sim)


class _ExecSession(asyncssh.SSHServerSession[bytes]):
    """One exec channel: a command in its own session, ended with the channel."""

    def __init__(self, sim: SimServer) -> None:
        self._sim = sim
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._command = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._open = True
        self._stdin: list[bytes] = []  # received before the command started
        self._eof = False

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def exec_requested(self, command: str) -> bool:
        self._command = command
        return True

    def session_started(self) -> None:
        self._sim.run_task(self._run())

    def data_received(self, data: bytes, datatype: int | None) -> None:
        self._stdin.append(data)
        self._feed()

    def eof_received(self) -> bool:
        self._eof = True
        self._feed()
        return True  # stdin ended; the command's output may still come

    def _feed(self) -> None:
        """Pass what the client sent to the command's stdin; close it after the client's EOF."""
        stdin = self._proc.stdin if self._proc is not None else None
        if stdin is None or stdin.is_closing():
            return
        for chunk in self._stdin:
            stdin.write(chunk)
        self._stdin.clear()
        if self._eof:
            stdin.close()

    def signal_received(self, signal_name: str) -> None:
        with suppress(KeyError):
            self._signal(signal.Signals[f"SIG{signal_name}"])

    def connection_lost(self, exc: Exception | None) -> None:
        self._open = False
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            signal_session(self._proc.pid, signum)

    async def _run(self) -> None:
        try:
            self._proc = await self._sim.spawn(self._command)
        except OSError as exc:
            self._write(f"sim: cannot run: {exc}\n".encode(), _STDERR)
            self._exit(_EXIT_NOT_RUN)
            return
        if not self._open:
            self._signal(signal.SIGKILL)
        self._feed()
        await self._finish(self._proc)

    async def _finish(self, proc: asyncio.subprocess.Process) -> None:
        try:
            await asyncio.gather(self._forward(proc.stdout, None), self._forward(proc.stderr, _STDERR))
            code = await proc.wait()
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            self._sim.reaped(proc)
        self._exit(code)

    async def _forward(self, stream: asyncio.StreamReader | None, datatype: int | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(_READ_CHUNK):
            self._write(chunk, datatype)

    def _write(self, data: bytes, datatype: int | None) -> None:
        if self._open and self._chan is not None:
            with suppress(OSError):
                self._chan.write(data, datatype)

    def _exit(self, code: int) -> None:
        if not self._open or self._chan is None:
            return
        with suppress(OSError):
            if code < 0:
                self._chan.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
            else:
                self._chan.exit(code)
