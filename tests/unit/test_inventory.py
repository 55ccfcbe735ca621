"""Loading and resolving inventories: one frozen Host per node, one-line errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from support.paths import REPO

from fleet.cli.commands import main
from fleet.inventory.files import check_files
from fleet.inventory.host import DEFAULT_DEVICES, Connection, Host
from fleet.inventory.load import Inventory, host_vars, inventory_path, inventory_source, load_inventory
from fleet.inventory.schema import VARIABLES
from fleet.inventory.targeting import select
from fleet.model.errors import InventoryError, UsageError
from fleet.slurm.variables import node_name

EXAMPLES = REPO / "inventory"


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, name: str = "inv.yaml") -> Inventory:
    return load_inventory(write(tmp_path, text, name))


# ---------------------------------------------------------------- examples


@pytest.mark.parametrize("path", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_every_example_inventory_loads(path: Path) -> None:
    """Each shipped example is valid and names at least one host."""
    inv = load_inventory(path)
    assert inv.hosts
    assert all(isinstance(h, Host) for h in inv.hosts.values())


def test_slurm_example_names_its_scheduler_and_slurm_nodes() -> None:
    inv = load_inventory(EXAMPLES / "slurm.yaml")
    assert inv.scheduler == "slurm"
    assert node_name(inv.hosts["gpu-h01"]) == "gpu-h01" and node_name(inv.hosts["bmc-h01"]) == "gpu-h09"
    assert load_inventory(EXAMPLES / "blackwell.yaml").scheduler is None


def test_blackwell_example_is_one_rack_of_sixteen() -> None:
    """gpu-b[01-16], eight GPUs each, SGLang drained."""
    inv = load_inventory(EXAMPLES / "blackwell.yaml")
    assert list(inv.hosts) == [f"gpu-b{i:02d}" for i in range(1, 17)]
    assert {h.gpus for h in inv.hosts.values()} == {8}
    assert {h.services for h in inv.hosts.values()} == {("sglang.service",)}


def test_yaml_and_toml_of_the_same_site_resolve_alike() -> None:
    """The TOML twin gives exactly the same hosts and groups."""
    yaml_inv = load_inventory(EXAMPLES / "site.yaml")
    toml_inv = load_inventory(EXAMPLES / "site.toml")
    assert yaml_inv.hosts == toml_inv.hosts
    assert yaml_inv.groups == toml_inv.groups


# ---------------------------------------------------------------- resolution


def test_unset_variables_take_the_documented_defaults(tmp_path: Path) -> None:
    """A bare host gets its own name as address; port and user stay unset (ssh_config's, else 22 and the
    current user, when it connects: fleet.transport.ssh)."""
    host = load(tmp_path, "hosts: {gpu-x01: null}").hosts["gpu-x01"]
    assert host == Host(name="gpu-x01", address="gpu-x01") and node_name(host) == "gpu-x01"
    assert (host.port, host.user) == (None, None)
    assert host.devices == DEFAULT_DEVICES
    assert host.known_hosts is None
    assert host.connection == Connection.SSH


def test_precedence_defaults_parent_child_host(tmp_path: Path) -> None:
    """defaults < parent group < child group < host, each overriding only what it sets."""
    inv = load(
        tmp_path,
        """
        defaults: {port: 1, user: d, gpus: 1, kill_grace: 1}
        groups:
          child:
            hosts: [n1, n2]
            vars: {port: 3, user: c}
          parent:
            children: [child]
            vars: {port: 2, user: p, gpus: 2}
        hosts:
          n1: {port: 4}
        """,
    )
    n1, n2 = inv.hosts["n1"], inv.hosts["n2"]
    assert (n1.port, n1.user, n1.gpus, n1.kill_grace) == (4, "c", 2, 1.0)
    assert (n2.port, n2.user, n2.gpus, n2.kill_grace) == (3, "c", 2, 1.0)


def test_groups_at_the_same_depth_apply_by_name(tmp_path: Path) -> None:
    """Two unrelated groups: the later name wins, whatever the file order."""
    inv = load(
        tmp_path,
        """
        groups:
          zeta: {hosts: [n1], vars: {gpus: 2}}
          alpha: {hosts: [n1], vars: {gpus: 1, port: 2200}}
        """,
    )
    assert (inv.hosts["n1"].gpus, inv.hosts["n1"].port) == (2, 2200)


def test_a_host_can_unset_a_group_value_with_null(tmp_path: Path) -> None:
    """`gpus: null` on the host turns the group's count check off for that host."""
    inv = load(tmp_path, "groups: {g: {hosts: [n1], vars: {gpus: 8}}}\nhosts: {n1: {gpus: null}}")
    assert inv.hosts["n1"].gpus is None


def test_lists_replace_rather_than_append(tmp_path: Path) -> None:
    """A host's services replace its group's; a single device string is a list of one."""
    inv = load(
        tmp_path,
        """
        groups: {g: {hosts: [n1, n2], vars: {services: [a.service, b.service], devices: /dev/nvidia-caps/*}}}
        hosts: {n1: {services: [c.service]}}
        """,
    )
    assert inv.hosts["n1"].services == ("c.service",)
    assert inv.hosts["n2"].services == ("a.service", "b.service")
    assert inv.hosts["n2"].devices == ("/dev/nvidia-caps/*",)


def test_values_convert_to_host_types(tmp_path: Path) -> None:
    """Whole seconds become floats, connection a transport's name, relative key paths follow the file."""
    inv = load(
        tmp_path,
        """
        defaults: {connection: local, become: true, settle_timeout: 90, identity_file: keys/id_ed25519}
        hosts: {n1: {known_hosts: ~/kh, address: "2001:db8::1"}}
        """,
    )
    host = inv.hosts["n1"]
    assert host.connection == Connection.LOCAL
    assert host.become is True
    assert host.settle_timeout == 90.0
    assert isinstance(host.settle_timeout, float)
    assert host.identity_file == str(tmp_path / "keys" / "id_ed25519")
    assert host.known_hosts == str(Path("~/kh").expanduser())
    assert host.address == "2001:db8::1"


def test_node_sets_expand_in_natural_order(tmp_path: Path) -> None:
    """Ranges expand with ClusterShell; hosts come out in node-set order, not file order."""
    inv = load(tmp_path, 'groups: {g: {hosts: ["n[9-11]", "gpu-b[02,01]", "n2"]}}')
    assert list(inv.hosts) == ["gpu-b01", "gpu-b02", "n2", "n9", "n10", "n11"]


def test_children_resolve_through_every_level(tmp_path: Path) -> None:
    """A group holds its children's hosts; a host lists every group above it, sorted."""
    inv = load(
        tmp_path,
        """
        groups:
          site: {children: [rack-a, rack-b]}
          rack-a: {children: [blackwell]}
          rack-b: {hosts: [h1]}
          blackwell: {hosts: ["b[1-2]"]}
          empty: null
        """,
    )
    assert inv.groups["site"] == ("b1", "b2", "h1")
    assert inv.groups["rack-a"] == ("b1", "b2")
    assert inv.groups["empty"] == ()
    assert inv.hosts["b1"].groups == ("blackwell", "rack-a", "site")
    assert inv.hosts["h1"].groups == ("rack-b", "site")


def test_a_diamond_of_groups_is_not_a_cycle(tmp_path: Path) -> None:
    """Two parents sharing a child is fine; the child applies after both."""
    inv = load(
        tmp_path,
        """
        groups:
          top: {children: [left, right], vars: {gpus: 1}}
          left: {children: [leaf], vars: {gpus: 2}}
          right: {children: [leaf], vars: {gpus: 3}}
          leaf: {hosts: [n1], vars: {port: 2022}}
        """,
    )
    assert (inv.hosts["n1"].gpus, inv.hosts["n1"].port) == (3, 2022)


def test_host_vars_is_json_ready(tmp_path: Path) -> None:
    """Every variable plus groups, as plain JSON types."""
    inv = load(tmp_path, "groups: {g: {hosts: [n1], vars: {services: [a.service]}}}")
    data = json.loads(json.dumps(host_vars(inv.hosts["n1"])))
    assert set(data) == {*VARIABLES, "groups"}
    assert data["services"] == ["a.service"]
    assert data["connection"] == "ssh"
    assert data["groups"] == ["g"]


# ---------------------------------------------------------------- errors


ERRORS = [
    ("unknown-variable", "groups: {g: {hosts: [n1], vars: {gpu: 8}}}", "groups.g.vars.gpu: unknown variable"),
    (
        "wrong-type",
        "groups: {blackwell: {hosts: [n1], vars: {gpus: eight}}}",
        "groups.blackwell.vars.gpus: expected a whole number, got 'eight'",
    ),
    ("port-as-string", "hosts: {n1: {port: '22'}}", "hosts.n1.port: expected a whole number"),
    ("port-range", "hosts: {n1: {port: 70000}}", "hosts.n1.port: must be less than or equal to 65535"),
    ("bool-as-string", "defaults: {become: 'true'}", "defaults.become: expected true or false"),
    ("negative-timeout", "defaults: {drain_timeout: -1}", "defaults.drain_timeout: must be greater than 0"),
    ("connection", "defaults: {connection: telnet}", "defaults.connection: expected 'ssh' or 'local'"),
    ("no-devices", "defaults: {devices: []}", "defaults.devices: expected at least one entry, got []"),
    ("unknown-child", "groups: {a: {children: [b]}}", "groups.a.children[0]: unknown group 'b'"),
    ("cycle", "groups: {a: {children: [b]}, b: {children: [a]}}", "cycle: a -> b -> a"),
    ("self-cycle", "groups: {a: {children: [a]}}", "groups.a.children: cycle: a -> a"),
    ("slash-host", "hosts: {gpu/b01: null}", 'hosts."gpu/b01": invalid host name'),
    ("semicolon-host", "groups: {g: {hosts: ['n1;reboot']}}", "groups.g.hosts[0]: invalid host name"),
    ("unit-metachar", "defaults: {services: ['x.service;reboot']}", "defaults.services[0]: invalid unit name"),
    ("unit-no-suffix", "defaults: {services: [sglang]}", "defaults.services[0]: unit name 'sglang' has no"),
    ("process-metachar", "defaults: {protected: ['$(id)']}", "defaults.protected[0]: process name"),
    ("device-relative", "defaults: {devices: dev/nvidia0}", "defaults.devices[0]: invalid device glob"),
    ("bad-node-set", "groups: {g: {hosts: ['gpu-b[01-']}}", "groups.g.hosts[0]: bad node set"),
    ("reversed-range", "groups: {g: {hosts: ['n[3-1]']}}", "groups.g.hosts[0]: bad node set"),
    ("runaway-range", "groups: {g: {hosts: ['n[1-1000]x[1-1000]']}}", "names more than 100000 hosts"),
    ("at-group", "groups: {g: {hosts: ['@other']}}", "groups.g.hosts[0]: '@other': include groups"),
    ("group-named-all", "groups: {all: {hosts: [n1]}}", "groups.all: 'all' is reserved"),
    ("host-named-all", "hosts: {all: null}", "hosts.all: 'all' is reserved"),
    ("bad-group-name", "groups: {'rack a': {hosts: [n1]}}", 'groups."rack a": invalid group name'),
    ("top-level-key", "host: {n1: null}", "host: unknown key; did you mean 'hosts'?"),
    ("group-key", "groups: {g: {host: [n1]}}", "groups.g.host: unknown key"),
    ("hosts-list", "hosts: [n1, n2]", "hosts: expected a mapping"),
    ("group-hosts-mapping", "groups: {g: {hosts: [{n1: {port: 1}}]}}", "groups.g.hosts[0]: expected a string"),
    ("yaml-syntax", "hosts: {n1: [}\n", "line 1"),
    ("duplicate-key", "hosts:\n  n1: null\n  n1: {port: 2}\n", "line 3, column 3: YAML syntax error: duplicate"),
    ("empty", "", "the inventory is empty"),
    ("top-level-list", "- n1\n", "expected a mapping of defaults, groups and hosts"),
    ("scheduler", "scheduler: pbs\nhosts: {n1: null}", "scheduler: no scheduler 'pbs' (known: slurm)"),
    ("slurm-node", "hosts: {n1: {slurm: {node: 'n1;id'}}}", "hosts.n1.slurm.node: invalid host name"),
    ("slurm-node-old", "hosts: {n1: {slurm_node: 'n1;id'}}", "hosts.n1.slurm_node: invalid host name"),
    ("slurm-unknown", "hosts: {n1: {slurm: {nodes: n2}}}",
     "hosts.n1.slurm.nodes: unknown variable; did you mean 'node'? (known: node)"),
    ("slurm-null", "hosts: {n1: {slurm: null}}", "hosts.n1.slurm: expected a mapping, got None"),
    ("slurm-both", "hosts: {n1: {slurm_node: a, slurm: {node: b}}}",
     "hosts.n1.slurm_node: also written as hosts.n1.slurm.node: keep that one"),
]


@pytest.mark.parametrize(("text", "expected"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_inventories_fail_in_one_line_naming_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    """Every problem is an InventoryError: `file: key: reason`, one line, nothing resolved."""
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_toml_errors_name_the_file_and_key(tmp_path: Path) -> None:
    """TOML goes through the same checks, and its syntax errors are one line too."""
    path = write(tmp_path, '[groups.g]\nhosts = ["n1"]\nvars = { gpus = "eight" }\n', "inv.toml")
    with pytest.raises(InventoryError, match=r"inv\.toml: groups\.g\.vars\.gpus: expected a whole number"):
        load_inventory(path)
    path = write(tmp_path, "[groups.g\n", "bad.toml")
    with pytest.raises(InventoryError, match=r"bad\.toml: TOML syntax error: [^\n]+$"):
        load_inventory(path)


def test_missing_file_is_an_inventory_error(tmp_path: Path) -> None:
    """No traceback text: just the path and what is wrong with it."""
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == f"{path}: no such file"


def test_unknown_suffix_is_refused(tmp_path: Path) -> None:
    """Only .yaml, .yml and .toml are read."""
    with pytest.raises(InventoryError, match="unknown inventory format"):
        load_inventory(write(tmp_path, "{}", "inv.json"))


def test_unknown_variable_lists_the_known_ones(tmp_path: Path) -> None:
    """A misspelt variable gets a suggestion and the list of valid names."""
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, "hosts: {n1: {adress: 192.0.2.1}}")
    assert caught.value.key == "hosts.n1.adress"
    assert "did you mean 'address'?" in caught.value.message
    assert "settle_timeout" in caught.value.message


def test_inventory_errors_are_usage_errors(tmp_path: Path) -> None:
    """The CLI maps both to exit 2."""
    with pytest.raises(UsageError):
        load(tmp_path, "defaults: {gpus: -1}")


# ---------------------------------------------------------------- inventory_path


def test_inventory_path_prefers_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """-i wins over $FLEET_INVENTORY, which is used when -i is absent."""
    monkeypatch.setenv("FLEET_INVENTORY", "from-env.yaml")
    assert inventory_path("cli.yaml") == Path("cli.yaml")
    assert inventory_path(None) == Path("from-env.yaml")


def test_inventory_path_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither -i nor $FLEET_INVENTORY is a usage error."""
    monkeypatch.delenv("FLEET_INVENTORY", raising=False)
    with pytest.raises(UsageError, match="no inventory"):
        inventory_path(None)
    with pytest.raises(UsageError, match="empty path"):
        inventory_path("")


def test_an_inventory_from_the_environment_is_named_so_in_its_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from another folder, `FLEET_INVENTORY=site.yaml` names no file of the command line's: every error about
    the file says where its path came from; one from -i is named by its path alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_INVENTORY", "site.yaml")
    assert inventory_source(None) == (Path("site.yaml"), "site.yaml (from $FLEET_INVENTORY)")
    assert inventory_source("site.yaml") == (Path("site.yaml"), "site.yaml")
    with pytest.raises(InventoryError) as missing:
        load_inventory(*inventory_source(None))
    assert str(missing.value) == "site.yaml (from $FLEET_INVENTORY): no such file"
    with pytest.raises(InventoryError) as from_cli:
        load_inventory(*inventory_source("site.yaml"))
    assert str(from_cli.value) == "site.yaml: no such file"
    write(tmp_path, "defaults: {gpus: 8, nosuch: 1}\nhosts: {gpu-a01: {}}\n", "site.yaml")
    with pytest.raises(InventoryError) as bad_key:
        load_inventory(*inventory_source(None))
    assert str(bad_key.value).startswith("site.yaml (from $FLEET_INVENTORY): defaults.nosuch: unknown variable")
    write(tmp_path, "hosts: {gpu-a01: {}\n", "site.yaml")
    with pytest.raises(InventoryError) as syntax:
        load_inventory(*inventory_source(None))
    assert str(syntax.value).startswith("site.yaml (from $FLEET_INVENTORY): line 2, column 1: YAML syntax error: ")


def test_an_inventory_from_the_environment_keeps_its_name_after_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is checked once it has loaded (the files its keys name, the groups asked for) names it alike."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_INVENTORY", "site.yaml")
    write(tmp_path, "hosts: {gpu-a01: {identity_file: /nonexistent/id_fleet}}\n", "site.yaml")
    inv = load_inventory(*inventory_source(None))
    assert (inv.path, inv.named) == (Path("site.yaml"), "site.yaml (from $FLEET_INVENTORY)")
    with pytest.raises(InventoryError) as missing_key:
        check_files(inv, inv.hosts.values())
    assert str(missing_key.value) == ("site.yaml (from $FLEET_INVENTORY): hosts.gpu-a01.identity_file:"
                                      " /nonexistent/id_fleet does not exist")
    with pytest.raises(UsageError, match=r"^no group 'gpus' in site\.yaml \(from \$FLEET_INVENTORY\)"):
        select(inv, groups=["gpus"])
    assert load_inventory(tmp_path / "site.yaml").named == str(tmp_path / "site.yaml")


def test_the_command_line_names_an_inventory_from_the_environment_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`FLEET_INVENTORY=site.yaml fleet check` from a folder without it: one line, exit 2, naming the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_INVENTORY", "site.yaml")
    assert main(["check", "gpu-a01", "--log-dir", str(tmp_path / "logs")]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "fleet: error: site.yaml (from $FLEET_INVENTORY): no such file\n")
    assert not (tmp_path / "logs").exists()
