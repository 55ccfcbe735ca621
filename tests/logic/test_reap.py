"""The marker that lets an interrupted command be found and ended on a node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import Children
from support.processes import children as children  # the fixture: children killed by pid after the test

from fleet.transport import reap, sessions
from fleet.transport.base import bounded_argv


def test_marker_goes_inside_sudo_and_before_the_inner_timeout() -> None:
    argv = bounded_argv(["nvidia-smi"], 10, become=True, mark=reap.marker("ab12cd34ef56ab78"))
    assert argv == ["timeout", "-k", "1", "10.0", "sudo", "-n", "env", "FLEET_CMD=ab12cd34ef56ab78",
                    "timeout", "-k", "1", "10.0", "nvidia-smi"]
    plain = bounded_argv(["nvidia-smi"], 10, mark=reap.marker("ab12cd34ef56ab78"))
    assert plain == ["env", "FLEET_CMD=ab12cd34ef56ab78", "timeout", "-k", "1", "10.0", "nvidia-smi"]


@pytest.mark.parametrize("token", ["", "xyz", "ab12;rm", "AB12CD34", "a" * 65])
def test_token_must_be_plain_hex(token: str) -> None:
    with pytest.raises(ValueError, match="bad command token"):
        reap.marker(token)


def test_find_marked_finds_exactly_the_marked_process() -> None:
    """Run the real find on this machine: it names the marked sleep and nothing else."""
    token = os.urandom(8).hex()
    marked = subprocess.Popen(["env", reap.marker(token), "sleep", "30"])
    other = subprocess.Popen(["env", reap.marker(os.urandom(8).hex()), "sleep", "30"])
    try:
        found = subprocess.run(reap.find_marked_argv(token), capture_output=True, text=True, check=False)
        assert reap.parse_marked(found.stdout) == [marked.pid]
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()


def test_parse_marked_ignores_noise() -> None:
    noise = "/proc/12/environ\nfind: '/proc/1/environ': Permission denied\n/proc/7/environ\n"
    assert reap.parse_marked(noise) == [7, 12]


def test_a_session_is_found_whatever_bytes_a_member_names_itself(children: Children) -> None:
    """A process of the session whose name (its comm) is not UTF-8 is still counted a member, and is not a
    reason for the session's end to fail (another user's process chooses its name)."""
    code = ("import sys, time; open('/proc/self/comm', 'wb').write(b'\\xff\\xfe)x (y'); print(flush=True); "
            "time.sleep(60)")
    child = children.track(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                            start_new_session=True))
    assert child.stdout is not None
    child.stdout.readline()  # renamed
    assert Path(f"/proc/{child.pid}/comm").read_bytes() == b"\xff\xfe)x (y\n"
    assert sessions.session_members(child.pid) == [child.pid]
