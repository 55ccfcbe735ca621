"""A fake `sudo` for a simulated node: what fleet runs on a `become` host as `sudo -n ARGV`.

ROOT/bin/sudo runs `python -m fleet.sim.sudo --node ROOT -n ARGV...`. On a simulated node every command already
runs as the node's one user, its root: `sudo -n ARGV` runs ARGV as it is, with the node's environment (bin/ first
on PATH, which the real sudo's `env_reset` and `secure_path` would drop, and with them the node's nvidia-smi,
systemctl and journalctl). So a `become` host costs on a simulated node the remote commands it costs on a real
one. As the real one does in the auth log, it logs each command it runs: one line in ROOT/log/sudo.log, the
ARGV as a JSON list. Only `-n` (never ask for a password) is answered: anything else is refused, one
line on stderr, exit 1. Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

LOG = Path("log") / "sudo.log"


def parse(args: list[str]) -> tuple[Path, list[str]] | None:
    """(ROOT, ARGV) out of `--node ROOT -n ARGV...`; None when it is not that."""
    if args[:1] != ["--node"] or args[2:3] != ["-n"] or len(args) < 4 or args[3].startswith("-"):
        return None
    return Path(args[1]), args[3:]


def main(args: list[str] | None = None) -> NoReturn:
    parsed = parse(sys.argv[1:] if args is None else args)
    if parsed is None:
        print("sudo: the simulated node answers only `sudo -n COMMAND...`", file=sys.stderr)
        sys.exit(1)
    root, argv = parsed
    with (root / LOG).open("a") as log:
        log.write(json.dumps(argv) + "\n")
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"sudo: {argv[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
