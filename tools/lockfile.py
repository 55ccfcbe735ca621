"""requirements/lock.txt beside pyproject.toml's ranges, for the Makefile.

    python tools/lockfile.py extra bench                          # an extra's requirements, one a line
    python tools/lockfile.py drift requirements/lock.txt PYTHON   # what PYTHON's environment has that the lock
                                                                  # pins otherwise (or does not pin)

`extra` lets `make bench` install the bench extra's tools into their own venv without fleet itself (pip installs
a project's extra only with the project); `drift` is `make test-latest`'s first line: which newer releases the
fast tiers are about to meet.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def normal(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock_text: str) -> dict[str, str]:
    """`name==version` lines of a compiled requirements file, by normalised name."""
    return {normal(m[1]): m[2] for line in lock_text.splitlines() if (m := PIN.match(line))}


def drift(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line a distribution whose installed version is not the locked one, sorted by name."""
    return [f"{name} {version} (locked: {locked.get(name, 'not in the lock')})"
            for name, version in sorted(installed.items()) if locked.get(name) != version]


def installed_in(python: str) -> dict[str, str]:
    listing = subprocess.run([python, "-m", "pip", "list", "--format=json", "--exclude-editable"],
                             capture_output=True, text=True, check=True, timeout=120).stdout
    return {normal(item["name"]): item["version"] for item in json.loads(listing)}


def main(argv: list[str]) -> int:
    match argv:
        case ["extra", name]:
            extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
            print("\n".join(extras[name]))
        case ["drift", lock, python]:
            lines = drift(pins(Path(lock).read_text()), installed_in(python))
            print(f"lockfile: {len(lines)} installed versions differ from {lock}" + ":" * bool(lines))
            print("".join(f"  {line}\n" for line in lines), end="")
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
