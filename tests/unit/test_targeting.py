"""Targeting: host patterns, groups, --limit and --exclude resolved against a loaded inventory."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleet.inventory.host import Host
from fleet.inventory.load import Inventory, load_inventory
from fleet.inventory.targeting import named, select, select_with, unlisted
from fleet.model.errors import UsageError
from fleet.slurm.variables import node_name


def load(tmp_path: Path, text: str, name: str) -> Inventory:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_inventory(path)


def names(hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts]


SITE = """
groups:
  blackwell: {hosts: ["gpu-b[01-04]"]}
  hopper: {hosts: ["gpu-h[01-02]"]}
  rack-a: {children: [blackwell, hopper]}
  spare: {hosts: [gpu-s01]}
  empty: {}
"""


@pytest.fixture
def site(tmp_path: Path) -> Inventory:
    return load(tmp_path, SITE, "site.yaml")


def test_select_needs_a_target(site: Inventory) -> None:
    """No host and no group is a usage error, even with --limit."""
    with pytest.raises(UsageError, match=r"^no target: name hosts or use -g/--group$"):
        select(site, limit="gpu-b01")


def test_select_unions_patterns_and_groups(site: Inventory) -> None:
    """Positional patterns and -g groups add up, in node-set order, without duplicates."""
    chosen = select(site, patterns=["gpu-s01,gpu-b0[3-4]"], groups=["hopper", "blackwell"])
    assert names(chosen) == ["gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04", "gpu-h01", "gpu-h02", "gpu-s01"]


def test_select_groups_include_children_and_all(site: Inventory) -> None:
    """A parent group targets its children's hosts; `all` targets everything."""
    assert names(select(site, groups=["rack-a"])) == [*(f"gpu-b0{i}" for i in range(1, 5)), "gpu-h01", "gpu-h02"]
    assert len(select(site, groups=["all"])) == 7
    assert len(select(site, patterns=["all"])) == 7


def test_select_limit_intersects_and_exclude_removes(site: Inventory) -> None:
    """(groups) & limit - exclude."""
    chosen = select(site, groups=["rack-a"], limit="gpu-b[01-03],@hopper", exclude="gpu-b02,gpu-h02")
    assert names(chosen) == ["gpu-b01", "gpu-b03", "gpu-h01"]


def test_select_pattern_forms(site: Inventory) -> None:
    """Node sets, ClusterShell operators, @group and shell globs all work as patterns."""
    assert names(select(site, patterns=["gpu-b[01-04]!gpu-b02"])) == ["gpu-b01", "gpu-b03", "gpu-b04"]
    assert names(select(site, patterns=["@hopper"])) == ["gpu-h01", "gpu-h02"]
    assert names(select(site, patterns=["gpu-h*"])) == ["gpu-h01", "gpu-h02"]
    assert names(select(site, patterns=[" gpu-s01 , gpu-h01"])) == ["gpu-h01", "gpu-s01"]


def test_a_range_that_reaches_past_the_inventory_names_what_it_lacks(site: Inventory) -> None:
    """gpu-b[01-16] on a rack with four hosts in the file: exit 2 naming the twelve it lacks (a half-listed rack
    checked by half is a mistake that passes silently); with --missing-ok, the four it lists."""
    with pytest.raises(UsageError) as caught:
        select(site, patterns=["gpu-b[01-16]"])
    assert str(caught.value) == (f"gpu-b[05-16] not in {site.path}: list them there, name them with -w, or pass"
                                 " --missing-ok to target only the 4 it has")
    assert len(select(site, patterns=["gpu-b[01-16]"], missing_ok=True)) == 4
    assert unlisted(site, ["gpu-b[01-16]", "@hopper", "gpu-h*", "all"]) == [f"gpu-b{i:02d}" for i in range(5, 17)]
    assert len(select(site, patterns=["gpu-b[01-04]"], limit="gpu-b[01-99]")) == 4  # a limit may reach past it


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"patterns": ["gpu-z01"]}, "no host in {path} matches 'gpu-z01'"),
        ({"patterns": ["gpu-b01,gpu-z01"]}, "no host in {path} matches 'gpu-z01'"),
        ({"groups": ["nope"]}, "no group 'nope' in {path}"),
        ({"groups": ["hoper"]}, "no group 'hoper' in {path}; did you mean 'hopper'?"),
        ({"groups": ["empty"]}, "group 'empty' in {path} has no hosts"),
        ({"groups": ["all"], "limit": "gpu-z0[1-2]"}, "no host in {path} matches --limit 'gpu-z0[1-2]'"),
        ({"groups": ["all"], "exclude": "gpu-z01"}, "no host in {path} matches --exclude 'gpu-z01'"),
        ({"groups": ["all"], "limit": "spare"}, "matches --limit 'spare'"),
        ({"groups": ["hopper"], "limit": "gpu-b01"}, "no host of {path} left to target"),
        ({"groups": ["hopper"], "exclude": "@hopper"}, "no host of {path} left to target"),
        ({"groups": ["all"], "limit": " , "}, "empty --limit"),
        ({"patterns": ["gpu-b[01-"]}, "host pattern: bad node set 'gpu-b[01-'"),
        ({"patterns": ["n[1-999999999]"]}, "names more than 100000 hosts"),
    ],
)
def test_select_never_matches_nothing_silently(site: Inventory, kwargs: dict[str, object], message: str) -> None:
    """Anything that names no host is a one-line usage error naming it."""
    with pytest.raises(UsageError) as caught:
        select(site, **kwargs)  # type: ignore[arg-type]  # each case gives some of select's keywords
    assert message.format(path=site.path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_limit_hints_at_group_syntax(site: Inventory) -> None:
    """--limit takes host patterns; a bare group name gets a hint to write @group."""
    with pytest.raises(UsageError, match="for the group, write '@spare'"):
        select(site, groups=["all"], limit="spare")


# --- hosts named outright: -w, a Slurm partition ------------------------------------------------------


def test_w_expands_node_sets_and_refuses_what_no_host_may_be_called() -> None:
    assert named("gpu-c[01-03],gpu-d01") == ["gpu-c01", "gpu-c02", "gpu-c03", "gpu-d01"]
    for bad in ("gpu-c[01-", "n1;reboot", " "):
        with pytest.raises(UsageError, match="-w"):
            named(bad)


def test_unlisted_hosts_get_the_inventorys_defaults_and_their_own_name(tmp_path: Path) -> None:
    inv = load(tmp_path, """
        defaults: {user: root, gpus: 8}
        groups: {blackwell: {hosts: [gpu-b01], vars: {services: [sglang.service]}}}
        """, "inv.yaml")
    hosts = select_with(inv, named("gpu-x[01-02]"))
    assert [h.name for h in hosts] == ["gpu-x01", "gpu-x02"]
    x01 = hosts[0]
    assert (x01.address, node_name(x01), x01.user, x01.gpus) == ("gpu-x01", "gpu-x01", "root", 8)
    assert x01.groups == () and x01.services == ()  # a group's vars are not the defaults


def test_a_listed_name_keeps_its_inventory_entry(site: Inventory) -> None:
    hosts = select_with(site, ["gpu-b01", "gpu-x01"])
    assert hosts[0] == site.hosts["gpu-b01"] and hosts[1].name == "gpu-x01"


def test_without_an_inventory_the_built_in_defaults_apply() -> None:
    (host,) = select_with(None, named("gpu-x01"))
    assert host == Host(name="gpu-x01", address="gpu-x01", user=host.user)


def test_limit_and_exclude_apply_to_unlisted_hosts(site: Inventory) -> None:
    chosen = select_with(site, named("gpu-x[01-04]"), groups=["hopper"], exclude="gpu-x02,@hopper")
    assert [h.name for h in chosen] == ["gpu-x01", "gpu-x03", "gpu-x04"]
    with pytest.raises(UsageError, match="gpu-x09"):
        select_with(site, named("gpu-x01"), limit="gpu-x09")


def test_an_unlisted_hosts_relative_key_follows_the_inventory(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("defaults: {identity_file: keys/id}\nhosts: {n1: null}\n")
    (host,) = select_with(load_inventory(path), ["m7"])
    assert host.identity_file == str(tmp_path / "keys" / "id")
