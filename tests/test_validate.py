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
        (validate.device_glob, "/dev/dri/renderD?"),
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


def test_rejects_non_strings() -> None:
    """A number or None where a string belongs is refused, not converted."""
    with pytest.raises(ValueError, match="expected a string"):
        validate.host_name(7)  # type: ignore[arg-type]


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
