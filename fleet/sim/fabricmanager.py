"""A fake `nv-fabricmanager` for a simulated node whose spec gives it one (`NodeSpec.fabric_manager`: its version).

ROOT/bin/nv-fabricmanager runs `python -m fleet.sim.fabricmanager --node ROOT ARGS...`, and exists only on a node
with a fabric manager (an NVSwitch node): on any other, the command is not found (the shell's and `timeout`'s exit
127), as on a real node without the package. Answered: `--version` (and `-v`), with the one line the real one
prints (`Fabric Manager version is : 535.161.08`, tests/fixtures/fabricmanager), exit 0. The daemon itself is not
simulated: any other argument is refused, one line on stderr, exit 1. Stdlib only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

from fleet.sim import state

VERSION_LINE = "Fabric Manager version is : {version}\n"  # displayFabricManagerVersionInfo's printf


def version_text(version: str) -> str:
    """What `nv-fabricmanager --version` prints."""
    return VERSION_LINE.format(version=version)


def main(args: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if args is None else args
    if argv[:1] != ["--node"] or len(argv) < 2:
        print("nv-fabricmanager: the simulated node runs it as --node ROOT ...", file=sys.stderr)
        sys.exit(1)
    version = json.loads(state.config_path(Path(argv[1])).read_text()).get("fabric_manager")
    if argv[2:] not in (["--version"], ["-v"]) or not isinstance(version, str):
        print("nv-fabricmanager: the simulated node answers only --version", file=sys.stderr)
        sys.exit(1)
    sys.stdout.write(version_text(version))
    sys.exit(0)


if __name__ == "__main__":
    main()
