"""A scheduler's own host variables live under its name (`slurm: {node: gpu-h09}`): declared by the scheduler,
checked as its `Var`s say, merged key by key across defaults < groups < host, read back with `Host.variables_of`;
the older flat spelling (`slurm_node`) is still read, with one warning line for the file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fleet.cli.commands import main
from fleet.inventory.host import Host
from fleet.inventory.load import Inventory, host_from_vars, host_vars, load_inventory
from fleet.model.errors import InventoryError
from fleet.slurm.variables import SlurmVariables, node_name


def load(tmp_path: Path, text: str) -> Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(text))
    return load_inventory(path)


def test_a_host_reads_its_schedulers_variables_where_the_inventory_wrote_them(tmp_path: Path) -> None:
    inv = load(tmp_path, """
        groups: {mgmt: {hosts: ["bmc-[01-02]"], vars: {slurm: {node: gpu-h00}}}}
        hosts: {bmc-01: {slurm: {node: gpu-h09}}, gpu-h01: null}
        """)
    bmc1, bmc2, plain = inv.hosts["bmc-01"], inv.hosts["bmc-02"], inv.hosts["gpu-h01"]
    assert bmc1.variables_of("slurm", SlurmVariables) == SlurmVariables(node="gpu-h09")
    assert (node_name(bmc1), node_name(bmc2), node_name(plain)) == ("gpu-h09", "gpu-h00", "gpu-h01")
    assert plain.plug_variables == () and plain == Host(name="gpu-h01", address="gpu-h01")
    assert inv.source("bmc-01", "slurm.node") == "hosts.bmc-01.slurm.node"
    assert inv.source("bmc-02", "slurm.node") == "groups.mgmt.vars.slurm.node"
    assert inv.notes == ()


def test_the_old_spelling_is_read_and_named_once_for_the_file(tmp_path: Path) -> None:
    inv = load(tmp_path, """
        hosts:
          bmc-01: {slurm_node: gpu-h09}
          bmc-02: {slurm_node: gpu-h10}
          bmc-03: {slurm: {node: gpu-h11}}
        """)
    assert [node_name(inv.hosts[n]) for n in ("bmc-01", "bmc-02", "bmc-03")] == ["gpu-h09", "gpu-h10", "gpu-h11"]
    assert inv.source("bmc-02", "slurm.node") == "hosts.bmc-02.slurm_node"
    assert inv.notes == (f"{tmp_path / 'inv.yaml'}: hosts.bmc-01.slurm_node and 1 more: `slurm_node` is now written"
                         " `slurm: {node: ...}` (`slurm.node`); the old spelling is still read",)


def test_a_host_level_wins_over_a_groups_old_spelling(tmp_path: Path) -> None:
    inv = load(tmp_path, """
        groups: {mgmt: {hosts: [bmc-01], vars: {slurm_node: gpu-h00}}}
        hosts: {bmc-01: {slurm: {node: gpu-h09}}}
        """)
    assert node_name(inv.hosts["bmc-01"]) == "gpu-h09"


@pytest.mark.parametrize(("text", "message"), [
    ("hosts: {n1: {slurm: {node: 'n1;id'}}}", "inv.yaml: hosts.n1.slurm.node: invalid host name"),
    ("defaults: {slurm: [n1]}\nhosts: {n1: null}", "inv.yaml: defaults.slurm: expected a mapping, got ['n1']"),
    ("hosts: {n1: {slurm: {node: 7}}}", "inv.yaml: hosts.n1.slurm.node: expected a string, got 7"),
    ("hosts: {n1: {slurm_nodes: x}}", "inv.yaml: hosts.n1.slurm_nodes: unknown variable; did you mean 'slurm'?"),
])
def test_a_bad_value_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, text)
    assert str(caught.value).startswith(f"{tmp_path}/{message}")


def test_the_json_view_writes_them_under_the_schedulers_name_and_reads_them_back(tmp_path: Path) -> None:
    """`fleet inventory --json` and `--via srun`'s hosts, sent to their nodes, are the same document."""
    host = load(tmp_path, "hosts: {bmc-01: {slurm: {node: gpu-h09}, services: [a.service]}}").hosts["bmc-01"]
    document = json.loads(json.dumps(host_vars(host)))
    assert document["slurm"] == {"node": "gpu-h09"} and "plug_variables" not in document
    assert host_from_vars("bmc-01", document) == host


def test_the_command_line_warns_once_on_stderr_and_lists_the_host(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts: {bmc-01: {slurm_node: gpu-h09}}\n")
    assert main(["inventory", "-i", str(path), "-g", "all", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["hosts"]["bmc-01"]["slurm"] == {"node": "gpu-h09"}
    assert err.splitlines() == [f"fleet: warning: {path}: hosts.bmc-01.slurm_node: `slurm_node` is now written"
                                " `slurm: {node: ...}` (`slurm.node`); the old spelling is still read"]
