"""No inventory value can change a remote command's meaning (property-based).

Every value that reaches a node (unit names, device globs, process names for
the kill policy, the nvidia-smi path, the lock file) passes a validator first;
whatever passes is then one argv element, and the command line the transport
sends parses back, under a POSIX shell's rules, to exactly the argv fleet meant.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.inventory import validate
from fleet.node.probes import procs, smi, units
from fleet.transport import reap
from fleet.transport.base import bounded_argv, command_line

# Text that tries hard: shell metacharacters, quotes, whitespace, globs, option-looking prefixes.
HOSTILE = st.text(
    alphabet=st.sampled_from(list("abcXYZ019._-@:/*?[]!$`'\"\\;|&<>(){}~#% \t\n=,+")), min_size=1, max_size=40
)


UNITS = st.one_of(HOSTILE, st.from_regex(r"[a-z][a-z0-9@_.:-]{0,20}\.(service|scope|target)", fullmatch=True))
GLOBS = st.one_of(HOSTILE, st.from_regex(r"/dev/nvidia[0-9*?]{0,3}|/tmp/[a-z0-9_.-]{1,12}/dev/nvidia\*",
                                         fullmatch=True))
EXECUTABLES = st.one_of(HOSTILE, st.from_regex(r"(/usr/(local/)?bin/)?nvidia-smi[a-z0-9._-]{0,6}", fullmatch=True))
NAMES = st.one_of(HOSTILE, st.from_regex(r"[A-Za-z][A-Za-z0-9._+-]{0,30}", fullmatch=True))


def accepted(validator: Callable[[str], str], value: str) -> str | None:
    try:
        return validator(value)
    except ValueError:
        return None


def assert_round_trip(argv: list[str], *, become: bool) -> None:
    wire = bounded_argv(argv, 10.0, become=become, mark=reap.marker("0123456789abcdef"))
    assert shlex.split(command_line(wire)) == wire
    assert wire[-len(argv):] == argv
    assert wire[0] == "timeout" or wire[:3] == ["env", "FLEET_CMD=0123456789abcdef", "timeout"]
    assert (wire[4:6] == ["sudo", "-n"]) is become  # sudo itself inside the node's bound


@settings(max_examples=300)
@given(UNITS, st.booleans())
def test_unit_names_stay_one_word_in_every_systemctl_command(value: str, become: bool) -> None:
    unit = accepted(validate.unit_name, value)
    if unit is None:
        return
    assert not unit.startswith("-")
    for argv in (units.unit_state_argv(unit), units.unit_stop_argv(unit), units.unit_kill_argv(unit)):
        assert argv[-2:] == ["--", unit]  # after "--": never read as an option
        assert_round_trip(argv, become=become)


@settings(max_examples=300)
@given(st.lists(GLOBS, min_size=1, max_size=3), st.booleans())
def test_device_globs_reach_find_as_lname_patterns_only(values: list[str], become: bool) -> None:
    globs = [g for g in (accepted(validate.device_glob, v) for v in values) if g is not None]
    if not globs:
        return
    argv = procs.holders_scan_argv(globs)
    assert argv[6:] == globs  # positional parameters of scan.sh: each reaches find as one -lname pattern
    assert_round_trip(argv, become=become)


@settings(max_examples=300)
@given(EXECUTABLES)
def test_nvidia_smi_path_is_the_command_and_nothing_more(value: str) -> None:
    path = accepted(validate.executable, value)
    if path is None:
        return
    for argv in (smi.gpu_query_argv(path, smi.SETTLE_FIELDS), smi.compute_apps_argv(path)):
        assert argv[0] == path
        assert_round_trip(argv, become=False)


@settings(max_examples=300)
@given(NAMES)
def test_process_names_accepted_are_plain_words(value: str) -> None:
    name = accepted(validate.process_name, value)
    if name is None:
        return
    assert shlex.split(shlex.quote(name)) == [name]
    assert not set(name) & set(validate.SHELL_METACHARACTERS)


# What a holder's identity may hold: its exe and owner are read off the node, anything at all.
IDENTITIES = st.builds(
    procs.Identity,
    pid=st.integers(min_value=2, max_value=4_194_304),
    start=st.integers(min_value=0, max_value=2**63),
    exe=st.one_of(st.none(), HOSTILE.map(os.fsencode), st.binary(min_size=1).filter(lambda b: b"\0" not in b)),
    user=st.one_of(HOSTILE, st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True)),
)


@settings(max_examples=200)
@given(st.lists(IDENTITIES, min_size=1, max_size=20))
def test_pid_lists_are_numbers_only(targets: list[procs.Identity]) -> None:
    """pids (and start times) reach ps and signal.sh as numbers; an exe or user read off the node, whatever
    it holds, is one argument of signal.sh, never shell code (the program itself is one `sh -c` word); an exe,
    any bytes, goes as ASCII `printf %b` escapes that give those bytes back."""
    pids = [t.pid for t in targets]
    for name in ("SIGKILL", "TERM", procs.ALIVE):
        argv = procs.signal_argv(name, targets)
        assert argv[:4] == ["sh", "-c", procs.SIGNAL_SH, "fleet-signal"]
        assert argv[5:] == [w for t in targets for w in (str(t.pid), str(t.start), procs.printf_b(t.exe or b""),
                                                         t.user)]
        assert all(argv[7 + 4 * i].isascii() for i in range(len(targets)))
        assert_round_trip(argv, become=True)
    assert_round_trip(procs.ps_argv(pids), become=True)


def test_the_strategies_do_reach_accepted_values() -> None:
    """Not vacuous: each validator accepts some of what the properties above are fed."""
    assert accepted(validate.unit_name, "sglang@1.service")
    assert accepted(validate.device_glob, "/dev/nvidia*")
    assert accepted(validate.executable, "/usr/bin/nvidia-smi")
    assert accepted(validate.process_name, "nv-fabricmanager")
    for bad in ("x.service; rm -rf /", "-x.service", "$(id).service"):
        assert accepted(validate.unit_name, bad) is None


@given(st.binary(max_size=24) | st.text("abcXYZ019/._+-", max_size=24).map(str.encode))
def test_printf_b_of_a_plain_path_is_every_byte_as_its_escape_reads(raw: bytes) -> None:
    each = "".join(chr(b) if b in procs._PLAIN else f"\\0{b:03o}" for b in raw)
    assert procs.printf_b(raw) == each
