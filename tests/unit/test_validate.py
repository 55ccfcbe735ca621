"""The validators that guard every value reaching a remote command or a file name."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.inventory import validate

Validator = Callable[[str], str]


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (validate.host_name, "gpu-b01"),
        (validate.host_name, "gpu-b01.rack-a.example.com"),
        (validate.host_name, "node_7"),
        (validate.group_name, "rack-a"),
        (validate.unit_name, "sglang.service"),
        (validate.unit_name, "vllm@8000.service"),
        (validate.unit_name, "user-1000.slice"),
        (validate.unit_name, "nvidia-persistenced.service"),
        (validate.device_glob, "/dev/nvidia*"),
        (validate.device_glob, "/dev/nvidia[0-7]"),
        (validate.device_glob, "/dev/nvidiactl"),
        (validate.device_glob, "/dev/nvidia-caps/*"),
        (validate.device_glob, "/dev/nvidia-caps/nvidia-cap[0-9]"),
        (validate.device_glob, "/dev/nvidia-caps-imex-channels/channel*"),
        (validate.device_glob, "/tmp/fleet-sim/gpu-b01/dev/nvidia*"),
        (validate.service_unit, "sglang.service"),
        (validate.service_unit, "vllm@8000.service"),
        (validate.service_unit, "sshguard.service"),
        (validate.lock_file, "/run/fleet/reset.lock"),
        (validate.lock_file, "/var/lock/fleet/reset.lock"),
        (validate.lock_file, "/var/run/fleet/reset.lock"),
        (validate.lock_file, "/tmp/fleet/reset.lock"),
        (validate.lock_file, "/var/tmp/fleet/reset.lock"),
        (validate.lock_file, "/tmp/fleet-sim/gpu-b01/run/fleet-reset.lock"),
        (validate.process_name, "python3"),
        (validate.process_name, "ray::IDLE"),
        (validate.process_name, "node_exporter"),
        (validate.executable, "nvidia-smi"),
        (validate.executable, "/usr/bin/nvidia-smi"),
        (validate.user_name, "root"),
        (validate.user_name, "Ops_team-1"),
        (validate.user_name, "jane.doe"),
        (validate.address, "gpu-b01.example.com"),
        (validate.address, "192.0.2.11"),
        (validate.address, "2001:db8::1"),
        (validate.address, "::1"),
    ],
)
def test_accepts_valid_values_unchanged(check: Validator, value: str) -> None:
    """A good value comes back as it went in."""
    assert check(value) == value


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (validate.host_name, ""),
        (validate.host_name, "gpu/b01"),
        (validate.host_name, "gpu;reboot"),
        (validate.host_name, "gpu b01"),
        (validate.host_name, "-gpu"),
        (validate.host_name, ".hidden"),
        (validate.host_name, ".."),
        (validate.host_name, "gpu-b[01-02]"),
        (validate.host_name, "a" * 254),
        (validate.unit_name, "sglang"),
        (validate.unit_name, "sglang.service;reboot"),
        (validate.unit_name, "$(reboot).service"),
        (validate.unit_name, "-x.service"),
        (validate.unit_name, ".service"),
        (validate.unit_name, "vllm@.service"),
        (validate.unit_name, "sglang*.service"),
        (validate.unit_name, "a b.service"),
        (validate.device_glob, "dev/nvidia*"),
        (validate.device_glob, "/dev/../etc/passwd"),
        (validate.device_glob, "/"),
        (validate.device_glob, "/*"),
        (validate.device_glob, "/dev"),
        (validate.device_glob, "/*/nvidia0"),
        (validate.device_glob, "/dev/nvidia*;reboot"),
        (validate.device_glob, "/dev/nvidia 0"),
        (validate.device_glob, "/dev/*"),
        (validate.device_glob, "/dev/pts/*"),
        (validate.device_glob, "/dev/*nvidia*"),
        (validate.device_glob, "/dev/?vidia*"),
        (validate.device_glob, "/dev/[n]vidia*"),
        (validate.device_glob, "/dev/dri/card*"),
        (validate.device_glob, "/dev/dri/renderD?"),
        (validate.device_glob, "/dev/sda"),
        (validate.device_glob, "/dev/nvidia*/x"),
        (validate.device_glob, "/dev/*/nvidia0"),
        (validate.device_glob, "/home/nvidia/*"),
        (validate.device_glob, "/dev/nvidia/*"),
        (validate.service_unit, "user.slice"),
        (validate.service_unit, "session-4.scope"),
        (validate.service_unit, "ssh.socket"),
        (validate.service_unit, "home.mount"),
        (validate.service_unit, "proc-sys-fs-binfmt_misc.automount"),
        (validate.service_unit, "dev-sda2.swap"),
        (validate.service_unit, "sys-devices-pci0000:00.device"),
        (validate.service_unit, "multi-user.target"),
        (validate.service_unit, "sglang.path"),
        (validate.service_unit, "sglang.timer"),
        (validate.service_unit, "ssh.service"),
        (validate.service_unit, "sshd.service"),
        (validate.service_unit, "sshd@0-10.0.0.1:22-10.0.0.2:5555.service"),
        (validate.service_unit, "ssh@1.service"),
        (validate.service_unit, "sshd-keygen.service"),
        (validate.service_unit, "sglang"),
        (validate.service_unit, "x.service;reboot"),
        (validate.lock_file, "/etc/nologin"),
        (validate.lock_file, "/var/lock/fleet.lock"),
        (validate.lock_file, "/run/fleet.lock"),
        (validate.lock_file, "/var/run/fleet.lock"),
        (validate.lock_file, "/tmp/fleet.lock"),
        (validate.lock_file, "/var/tmp/fleet.lock"),
        (validate.lock_file, "/etc/run/fleet.lock"),
        (validate.lock_file, "/dev/shm/run/fleet.lock"),
        (validate.lock_file, "/dev/null"),
        (validate.lock_file, "/proc/self/run/lock"),
        (validate.lock_file, "/sys/run/fleet.lock"),
        (validate.lock_file, "/var/lib/fleet.lock"),
        (validate.lock_file, "/home/me/fleet.lock"),
        (validate.lock_file, "/fleet.lock"),
        (validate.lock_file, "/run"),
        (validate.process_name, ""),
        (validate.process_name, "-9"),
        (validate.process_name, "python3;reboot"),
        (validate.process_name, "a|b"),
        (validate.process_name, "$HOME"),
        (validate.process_name, "has space"),
        (validate.process_name, "tab\there"),
        (validate.process_name, "x" * 65),
        (validate.executable, "bin/nvidia-smi"),
        (validate.executable, "-nvidia-smi"),
        (validate.executable, "/usr/bin/../bin/nvidia-smi"),
        (validate.executable, "/usr/bin/"),
        (validate.executable, "nvidia-smi*"),
        (validate.executable, "nvidia-smi -q"),
        (validate.user_name, "root;id"),
        (validate.user_name, "1root"),
        (validate.user_name, "x" * 33),
        (validate.address, "999.0.2.1"),
        (validate.address, "2001:db8::zz"),
        (validate.address, "a host"),
        (validate.address, "host;id"),
        (validate.path, "key\nfile"),
        (validate.path, "key\0file"),
        (validate.path, ""),
    ],
)
def test_rejects_invalid_values(check: Validator, value: str) -> None:
    """A bad value raises ValueError with a one-line reason."""
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        check(value)


@pytest.mark.parametrize(
    ("unit", "why"),
    [
        ("user.slice", "user.slice is a slice: drain's SIGKILL escalation would kill every process in it"),
        ("session-4.scope", "session-4.scope is a scope"),
        ("ssh.socket", "ssh.socket is a socket"),
        ("home.mount", "home.mount is a mount"),
        ("multi-user.target", "multi-user.target is a target: it owns no processes"),
        ("sglang.timer", "sglang.timer is a timer: it owns no processes"),
        ("sshd.service", "sshd.service is an SSH server unit"),
        ("sshd@0-10.0.0.1:22-10.0.0.2:5555.service", "is an SSH server unit"),
    ],
)
def test_services_refuse_units_whose_stop_turns_against_the_node(unit: str, why: str) -> None:
    """Only a .service drain may stop, never sshd's; the reason says why and what to name instead."""
    with pytest.raises(ValueError, match=r"^[^\n]+$") as caught:
        validate.service_unit(unit)
    assert why in str(caught.value)
    assert validate.unit_name(unit) == unit  # a valid unit name all the same (the probes read such names)


def test_unit_stem_is_the_name_before_instance_and_suffix() -> None:
    assert validate.unit_stem("sglang.service") == "sglang"
    assert validate.unit_stem("vllm@8000.service") == "vllm"
    assert validate.unit_stem("nvidia-persistenced.service") == "nvidia-persistenced"
    assert validate.unit_stem("a@b.c.service") == "a"


@pytest.mark.parametrize("glob", ["/dev/*", "/dev/pts/*", "/dev/*nvidia*", "/dev/dri/card*"])
def test_device_globs_that_reach_past_nvidia_files_say_so(glob: str) -> None:
    with pytest.raises(ValueError, match=r"more than NVIDIA device files|too broad"):
        validate.device_glob(glob)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/nologin", "must not be under /etc"),
        ("/dev/shm/run/fleet.lock", "must not be under /dev"),
        ("/var/lib/fleet.lock", "must be in a lock, run or tmp directory"),
    ],
)
def test_lock_file_outside_a_lock_run_or_tmp_directory_says_where_it_belongs(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"^lock file '{path}' {why}"):
        validate.lock_file(path)


def test_rejects_non_strings() -> None:
    """A number or None where a string belongs is refused, not converted."""
    with pytest.raises(ValueError, match="expected a string"):
        validate.host_name(7)  # type: ignore[arg-type]  # the wrong type is the point


def test_path_expands_the_home_directory() -> None:
    """`~` means the home directory of whoever runs fleet."""
    assert validate.path("~/.ssh/id_ed25519") == os.path.expanduser("~/.ssh/id_ed25519")
    assert validate.path("/etc/ssh/known") == "/etc/ssh/known"


# Strings close to what each validator accepts, plus noise full of shell syntax.
_NOISE = st.text(alphabet=st.sampled_from("ab.-_/:@*?[]0;|&$`'\"<>\\(){}! \t\n~#"), max_size=24)
_CANDIDATES: dict[str, tuple[Validator, st.SearchStrategy[str], frozenset[str]]] = {
    "unit_name": (
        validate.unit_name,
        st.from_regex(r"[A-Za-z0-9:_.@-]{1,20}\.(service|scope|target|slice)", fullmatch=True),
        validate.SHELL_METACHARACTERS,
    ),
    "process_name": (
        validate.process_name,
        st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64),
        validate.SHELL_METACHARACTERS,
    ),
    "device_glob": (
        validate.device_glob,
        st.from_regex(r"/[a-z]{1,5}/[A-Za-z0-9_./*?\[\]-]{1,20}", fullmatch=True),
        validate.SHELL_METACHARACTERS - frozenset("*?[]"),  # globs on purpose; quoting keeps them
    ),
}


def _roundtrip_checker(kind: str) -> Callable[[str], None]:
    check, _, forbidden = _CANDIDATES[kind]

    def run(value: str) -> None:
        try:
            accepted = check(value)
        except ValueError:
            return
        assert shlex.split(shlex.join([accepted])) == [accepted]
        assert not forbidden.intersection(accepted)
        assert not accepted.startswith("-")

    return run


@pytest.mark.parametrize("kind", sorted(_CANDIDATES))
def test_accepted_values_stay_one_shell_word(kind: str) -> None:
    """Whatever a validator accepts is one shell word after quoting, with no shell syntax in it."""
    _, candidates, _ = _CANDIDATES[kind]
    given(st.one_of(candidates, _NOISE))(_roundtrip_checker(kind))()


@given(st.one_of(st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True), _NOISE))
def test_accepted_host_names_are_safe_file_names(value: str) -> None:
    """A host name that passes can name a log file: no '/', never '.' or '..', no leading '-'."""
    try:
        name = validate.host_name(value)
    except ValueError:
        return
    assert "/" not in name
    assert name not in {".", ".."}
    assert name[0].isalnum()
    assert not validate.SHELL_METACHARACTERS.intersection(name)
