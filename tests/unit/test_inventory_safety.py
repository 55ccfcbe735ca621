"""Config that would turn a reset against the node is an inventory error: one line naming file and key, exit 2.

Units drain must never stop, device globs that reach past NVIDIA device files, lock
files outside a lock/run/tmp folder, unbounded timeouts, and (for the commands that
connect) a missing identity_file or known_hosts.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from fleet.inventory import host as host_module
from fleet.inventory.files import check_files
from fleet.inventory.host import BUILTIN_PROTECTED
from fleet.inventory.load import Inventory, load_inventory
from fleet.model.errors import InventoryError


def write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def refused(path: Path) -> str:
    """The one-line error loading path raises."""
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


# ---------------------------------------------------------------- one level's values

REFUSED = [
    ("slice", "defaults: {services: [user.slice]}",
     "defaults.services[0]: user.slice is a slice: drain's SIGKILL escalation would kill every process in it"
     " (fleet's own session included); name the .service"),
    ("scope", "groups: {g: {hosts: [n1], vars: {services: [a.service, session-3.scope]}}}",
     "groups.g.vars.services[1]: session-3.scope is a scope"),
    ("mount", "hosts: {n1: {services: [home.mount]}}", "hosts.n1.services[0]: home.mount is a mount"),
    ("device-unit", "hosts: {n1: {services: [dev-nvidia0.device]}}", "dev-nvidia0.device is a device unit"),
    ("socket", "hosts: {n1: {services: [ssh.socket]}}", "ssh.socket is a socket"),
    ("target", "hosts: {n1: {services: [multi-user.target]}}", "multi-user.target is a target: it owns no"),
    ("timer", "hosts: {n1: {services: [sglang.timer]}}", "sglang.timer is a timer: it owns no processes"),
    ("sshd", "defaults: {services: [sshd.service]}", "defaults.services[0]: sshd.service is an SSH server unit"),
    ("ssh", "defaults: {services: [ssh.service]}", "ssh.service is an SSH server unit"),
    ("sshd-instance", "defaults: {services: ['sshd@1-10.0.0.1:22.service']}", "is an SSH server unit"),
    ("dev-all", "defaults: {devices: '/dev/*'}",
     "defaults.devices[0]: device glob '/dev/*' could match more than NVIDIA device files"),
    ("dev-pts", "hosts: {n1: {devices: ['/dev/nvidia*', '/dev/pts/*']}}",
     "hosts.n1.devices[1]: device glob '/dev/pts/*' could match more than NVIDIA device files"),
    ("dev-star-nvidia", "defaults: {devices: '/dev/*nvidia*'}", "could match more than NVIDIA device files"),
    ("dri", "defaults: {devices: '/dev/dri/card*'}", "could match more than NVIDIA device files"),
    ("lock-nologin", "defaults: {lock_file: /etc/nologin}",
     "defaults.lock_file: lock file '/etc/nologin' must not be under /etc"),
    ("lock-dev", "hosts: {n1: {lock_file: /dev/shm/run/x.lock}}", "hosts.n1.lock_file: lock file"),
    ("lock-elsewhere", "defaults: {lock_file: /var/lib/fleet/reset.lock}", "must be in a lock, run or tmp"),
    ("lock-tmp", "defaults: {lock_file: /tmp/fleet/reset.lock}",
     "defaults.lock_file: /tmp/fleet/reset.lock is under /tmp, where any user may create its folder first and block"
     " every reset of the node: put it in a folder only root may write to (the default /run/fleet/reset.lock)"),
    ("lock-var-tmp", "hosts: {n1: {lock_file: /var/tmp/fleet/run.lock}}", "hosts.n1.lock_file: /var/tmp/fleet/run"),
    ("lock-run-lock", "defaults: {lock_file: /run/lock/fleet/reset.lock}", "is under /run/lock, where any user"),
    ("lock-var-lock", "defaults: {lock_file: /var/lock/fleet/reset.lock}", "is under /var/lock, where any user"),
    ("lock-run-user", "defaults: {lock_file: /run/user/1000/fleet/reset.lock}", "is under /run/user, where any"),
    ("lock-home", "defaults: {lock_file: /home/alice/run/reset.lock}", "is under /home, where any user"),
    ("command-timeout-huge", "defaults: {command_timeout: 1.0e+12}",
     "defaults.command_timeout: must be less than or equal to 3600"),
    ("connect-timeout", "defaults: {connect_timeout: 301}", "defaults.connect_timeout: must be less than or equal"),
    ("drain-timeout", "hosts: {n1: {drain_timeout: 86400}}", "hosts.n1.drain_timeout: must be less than or equal"),
    ("kill-grace", "defaults: {kill_grace: 1000}", "defaults.kill_grace: must be less than or equal to 300"),
    ("settle-timeout", "defaults: {settle_timeout: 3601}", "defaults.settle_timeout: must be less than or equal"),
    ("memory-threshold", "defaults: {memory_threshold_mib: 4294967296}",
     "defaults.memory_threshold_mib: must be less than or equal to 1048576"),
    ("gpus", "groups: {g: {hosts: [n1], vars: {gpus: 100000}}}", "groups.g.vars.gpus: must be less than or equal"),
]


@pytest.mark.parametrize(("text", "expected"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_values_that_turn_a_reset_against_the_node_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    with_a_host = text if "hosts:" in text else text + "\nhosts: {n1: null}\n"
    assert expected in refused(write(tmp_path, with_a_host))


def test_toml_1e12_is_refused_too(tmp_path: Path) -> None:
    """TOML reads `1e12` as a number (YAML as a string): the bound catches it."""
    path = write(tmp_path, "[defaults]\ncommand_timeout = 1e12\n[hosts.n1]\n", "site.toml")
    assert "defaults.command_timeout: must be less than or equal to 3600" in refused(path)


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    text = """
        defaults: {connect_timeout: 300, command_timeout: 3600, drain_timeout: 3600, kill_grace: 300,
                   settle_timeout: 3600, memory_threshold_mib: 1048576, gpus: 1024}
        hosts: {n1: {services: ['vllm@8000.service', sglang.service],
                     devices: [/dev/nvidia*, /dev/nvidiactl, /dev/nvidia-caps/*], lock_file: /var/run/fleet/x.lock}}
    """
    host = load_inventory(write(tmp_path, text)).hosts["n1"]
    assert (host.command_timeout, host.gpus, host.memory_threshold_mib) == (3600.0, 1024, 1048576)
    assert host.services == ("vllm@8000.service", "sglang.service")


def test_a_simulated_nodes_lock_lies_in_its_own_root_wherever_that_is(tmp_path: Path) -> None:
    """A simulated node (fleet.sim) keeps everything under its root, a test's folder in /tmp: its lock may too."""
    host = load_inventory(write(tmp_path, "hosts: {n1: {simulated: true, lock_file: /tmp/sim/n1/run/reset.lock}}"))
    assert host.hosts["n1"].lock_file == "/tmp/sim/n1/run/reset.lock"


# ---------------------------------------------------------------- services against protected, per host


@pytest.mark.parametrize("name", ["nvidia-persistenced", "dcgm-exporter", "nv-fabricmanager"])
def test_the_unit_of_a_built_in_protected_process_is_refused(tmp_path: Path, name: str) -> None:
    assert name in BUILTIN_PROTECTED
    path = write(tmp_path, f"groups: {{g: {{hosts: [n1], vars: {{services: [a.service, {name}.service]}}}}}}")
    message = refused(path)
    assert f"groups.g.vars.services[1]: {name}.service is the unit of {name}, a built-in protected process" in message


def test_the_unit_of_a_host_s_own_protected_process_names_both_keys(tmp_path: Path) -> None:
    """services from defaults, protected from the host: the key where services was set, and where protected was."""
    path = write(
        tmp_path,
        """
        defaults: {services: [sglang.service, 'node_exporter@1.service']}
        hosts:
          n1: null
          n2: {protected: [node_exporter]}
        """,
    )
    message = refused(path)
    assert message == (
        f"{path}: defaults.services[1]: node_exporter@1.service is the unit of node_exporter, which n2 protects"
        " (hosts.n2.protected): fleet never kills it, so drain must not stop it"
    )


def test_a_host_that_replaces_the_services_is_judged_on_its_own(tmp_path: Path) -> None:
    """The check runs on the merged values: n1's own services win over the group's."""
    text = """
        groups: {g: {hosts: [n1], vars: {services: [vllm.service], protected: [vllm]}}}
        hosts: {n1: {services: [sglang.service]}}
    """
    assert load_inventory(write(tmp_path, text)).hosts["n1"].services == ("sglang.service",)
    text = "groups: {g: {hosts: [n1], vars: {protected: [vllm]}}}\nhosts: {n1: {services: [vllm.service]}}"
    expected = "hosts.n1.services[0]: vllm.service is the unit of vllm, which n1 protects (groups.g.vars.protected)"
    assert expected in refused(write(tmp_path, text))


# ---------------------------------------------------------------- provenance


def test_inventory_knows_which_key_set_each_variable(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        defaults: {gpus: 8, known_hosts: kh}
        groups:
          parent: {children: [child], vars: {gpus: 4, port: 2200}}
          child: {hosts: [n1, n2], vars: {port: 2222}}
        hosts: {n1: {gpus: 2}}
        """,
    )
    inv = load_inventory(path)
    assert inv.source("n1", "gpus") == "hosts.n1.gpus"
    assert inv.source("n2", "gpus") == "groups.parent.vars.gpus"
    assert inv.source("n2", "port") == "groups.child.vars.port"
    assert inv.source("n2", "known_hosts") == "defaults.known_hosts"
    assert not inv.is_default("n2", "known_hosts")
    assert inv.source("n2", "identity_file") == "defaults.identity_file"
    assert inv.is_default("n2", "identity_file")


# ---------------------------------------------------------------- files an SSH connection needs


def connecting(tmp_path: Path, text: str) -> Inventory:
    return load_inventory(write(tmp_path, text))


def files_error(inv: Inventory, *names: str) -> str:
    with pytest.raises(InventoryError) as caught:
        check_files(inv, [inv.hosts[n] for n in names or inv.hosts])
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_identity_file_names_the_key_that_set_it(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text("")
    inv = connecting(tmp_path, "defaults: {known_hosts: kh}\nhosts: {gpu-b01: {identity_file: id_fleet}}")
    key = tmp_path / "id_fleet"
    assert files_error(inv) == f"{tmp_path / 'site.yaml'}: hosts.gpu-b01.identity_file: {key} does not exist"
    key.write_text("key")
    check_files(inv, list(inv.hosts.values()))


def test_a_missing_known_hosts_names_the_group_that_set_it(tmp_path: Path) -> None:
    inv = connecting(tmp_path, "groups: {rack: {hosts: [n1], vars: {known_hosts: /nonexistent/kh}}}")
    assert files_error(inv).endswith(
        "groups.rack.vars.known_hosts: /nonexistent/kh does not exist"
        " (host keys are always checked; set known_hosts or run ssh-keyscan)"
    )


@pytest.fixture
def system_known_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The system's default known_hosts files, moved under tmp_path (absent until a test writes them); HOME too."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    files = (tmp_path / "etc" / "ssh_known_hosts", tmp_path / "etc" / "ssh_known_hosts2")
    monkeypatch.setattr(host_module, "SYSTEM_KNOWN_HOSTS", tuple(map(str, files)))
    files[0].parent.mkdir()
    return files


def test_the_default_known_hosts_is_named_as_the_default(tmp_path: Path, system_known_hosts: tuple[Path, Path]) -> None:
    """With known_hosts unset, every default file is read as OpenSSH reads them: that none exists is the error."""
    inv = connecting(tmp_path, "hosts: {n1: null}")
    system, system2 = system_known_hosts
    assert files_error(inv) == (
        f"{tmp_path / 'site.yaml'}: defaults.known_hosts: ~/.ssh/known_hosts (the default,"
        f" {tmp_path / 'home/.ssh/known_hosts'}), like ~/.ssh/known_hosts2, the system's {system} and {system2},"
        " does not exist (host keys are always checked; set known_hosts or run ssh-keyscan)"
    )
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text("")
    check_files(inv, list(inv.hosts.values()))


@pytest.mark.parametrize("which", ["~/.ssh/known_hosts2", "system", "system2"])
def test_any_one_default_known_hosts_will_do(tmp_path: Path, system_known_hosts: tuple[Path, Path],
                                             which: str) -> None:
    inv = connecting(tmp_path, "hosts: {n1: null}")
    path = {"system": system_known_hosts[0], "system2": system_known_hosts[1]}.get(which)
    if path is None:
        path = tmp_path / "home" / ".ssh" / "known_hosts2"
        path.parent.mkdir(parents=True)
    path.write_text("")
    check_files(inv, list(inv.hosts.values()))


def test_a_default_known_hosts_that_exists_but_is_no_file_is_named(tmp_path: Path,
                                                                   system_known_hosts: tuple[Path, Path]) -> None:
    (tmp_path / "home" / ".ssh" / "known_hosts2").mkdir(parents=True)
    system_known_hosts[0].write_text("")
    inv = connecting(tmp_path, "hosts: {n1: null}")
    assert files_error(inv) == (
        f"{tmp_path / 'site.yaml'}: defaults.known_hosts: ~/.ssh/known_hosts2 (a default known_hosts,"
        f" {tmp_path / 'home/.ssh/known_hosts2'}) is not a file"
        " (host keys are always checked; set known_hosts or run ssh-keyscan)"
    )


def test_a_folder_or_an_unreadable_file_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "kh").mkdir()
    inv = connecting(tmp_path, "hosts: {n1: {known_hosts: kh}}")
    assert "hosts.n1.known_hosts: " in files_error(inv) and "is not a file" in files_error(inv)
    if os.geteuid() != 0:  # root reads anything
        (tmp_path / "key").write_text("")
        (tmp_path / "key").chmod(0)
        (tmp_path / "kh2").write_text("")
        inv = connecting(tmp_path, "hosts: {n1: {known_hosts: kh2, identity_file: key}}")
        assert "cannot be read" in files_error(inv)


def test_only_targeted_ssh_hosts_are_asked(tmp_path: Path) -> None:
    """A local host reads no key; an untargeted host's files do not matter."""
    (tmp_path / "kh").write_text("")
    inv = connecting(
        tmp_path,
        """
        defaults: {known_hosts: kh}
        hosts:
          here: {connection: local, known_hosts: /nonexistent/kh}
          ok: null
          broken: {identity_file: /nonexistent/key}
        """,
    )
    check_files(inv, [inv.hosts["here"], inv.hosts["ok"]])
    assert "hosts.broken.identity_file: /nonexistent/key does not exist" in files_error(inv, "ok", "broken")


def test_loading_alone_does_not_ask_for_the_files(tmp_path: Path) -> None:
    """`fleet inventory` lists hosts on a machine without their keys: only check_files asks."""
    inv = connecting(tmp_path, "hosts: {n1: {identity_file: /nonexistent/key, known_hosts: /nonexistent/kh}}")
    assert inv.hosts["n1"].identity_file == "/nonexistent/key"
