"""requirements/lock.txt is the tested set: every range pyproject.toml declares is pinned there, inside its range,
and nowhere else is a version pinned."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from support.paths import REPO

LOCK = REPO / "requirements" / "lock.txt"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    return {normal(m[1]): m[2] for line in LOCK.read_text().splitlines()
            if (m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", line))}


def declared() -> list[Requirement]:
    lines = [*PROJECT["project"]["dependencies"], *PROJECT["build-system"]["requires"]]
    lines += [line for extra in PROJECT["project"]["optional-dependencies"].values() for line in extra]
    return [Requirement(line) for line in lines]


def test_every_declared_requirement_is_pinned_inside_its_range() -> None:
    pins = locked()
    for requirement in declared():
        version = pins.get(normal(requirement.name))
        assert version is not None, f"{requirement.name} is not in {LOCK.name}: make lock"
        assert requirement.specifier.contains(version, prereleases=True), \
            f"{requirement.name}=={version} is outside {requirement.specifier}: make lock"


def test_the_lock_pins_pip_and_the_build_backend_too() -> None:
    """`make install` installs pip and setuptools from the lock before it builds fleet without isolation."""
    assert {"pip", "setuptools"} <= set(locked())


def test_every_line_of_the_lock_is_an_exact_pin_a_comment_or_blank() -> None:
    for line in LOCK.read_text().splitlines():
        assert not line.strip() or line.lstrip().startswith("#") or re.match(r"^\S+==\S+$", line), line


def test_pyproject_pins_no_version() -> None:
    """Ranges in pyproject.toml (for whoever installs the wheel into their own environment), pins in the lock."""
    assert [str(r) for r in declared() if any(s.operator in ("==", "===") for s in r.specifier)] == []


def test_the_lock_names_no_index_or_machine_path() -> None:
    """pip-compile writes the machine's index and find-links options unless told not to: the lock is portable."""
    text = LOCK.read_text()
    assert not re.search(r"^\s*(-i|--index-url|--extra-index-url|-f|--find-links|--trusted-host)\b", text, re.M)
    assert "file://" not in text


def test_the_bench_extra_is_what_make_bench_installs() -> None:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "lockfile.py"), "extra", "bench"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.splitlines() == PROJECT["project"]["optional-dependencies"]["bench"]
