"""`fanout.py _floor`: the raw asyncssh floor, the least a Python client can do for the same commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def floor_main(argv: list[str]) -> int:
    """`_floor SPEC.json`: per host one connection, the spec's lines in order, all hosts at once."""
    import asyncio

    from fleet.transport.ssh.asyncssh_quiet import asyncssh  # its import-time warning is not the bench's news

    spec = json.loads(Path(argv[0]).read_text())
    known_hosts = asyncssh.read_known_hosts(spec["known_hosts"])
    key = asyncssh.read_private_key(spec["identity_file"])

    async def one(host: dict[str, Any]) -> tuple[int, str | None]:
        ran = 0
        try:
            async with asyncssh.connect(
                host["address"], port=spec["port"], username=spec["user"], known_hosts=known_hosts,
                client_keys=[key], agent_path=None, config=None, connect_timeout=120,
                encryption_algs=spec["encryption_algs"],
            ) as conn:
                holder = None
                if host["hold"]:
                    holder = await conn.create_process(host["hold"], stdin=asyncssh.PIPE)
                    first = await holder.stdout.readline()
                    ran += 1
                    if first.strip() != "locked":
                        return ran, f"lock: {first.strip()!r}"
                for line in host["cmds"]:
                    await conn.run(line, check=False, stdin=asyncssh.DEVNULL, timeout=300)
                    ran += 1
                if holder is not None:
                    holder.stdin.write_eof()
                    await holder.wait(timeout=30)
            return ran, None
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            return ran, f"{type(exc).__name__}: {exc}"

    async def main() -> list[tuple[int, str | None]]:
        return await asyncio.gather(*(one(h) for h in spec["hosts"]))

    results = asyncio.run(main())
    errors = [e for _, e in results if e]
    print(json.dumps({"hosts": len(results), "failed": len(errors), "commands": sum(r for r, _ in results),
                      "errors": errors[:5]}))
    return 0
