"""The rack compared: a host's settings folded over its GPUs, the majority per property, the odd ones out, ties and
values not observed (fleet.model.uniformity); the summary line, the JSON and --uniform (fleet.report.uniform)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from support.paths import FIXTURES
from support.report_page import ODD_HOST, demo_document, synthetic_document

from fleet.model import uniformity
from fleet.model.codec import run_from_document
from fleet.model.fabric import FabricManager
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import GpuReport, HostReport, HostStatus, Reason, RunReport
from fleet.model.uniformity import (
    ABSENT,
    PROPERTIES,
    Comparison,
    _fold,
    compare,
    compare_groups,
    node_settings,
    odd_hosts,
    why,
)
from fleet.node.probes.health import parse_all_health
from fleet.report import uniform
from fleet.report.html_report import RunPage, page
from fleet.report.render import human_lines, render, to_document

SMI = FIXTURES / "nvidia-smi"

H100 = GpuSettings(name="NVIDIA H100 80GB HBM3", vbios="96.00.A5.00.01", driver="575.57.08", persistence=True,
                   compute_mode="Default", mig=False, mig_pending=False, ecc=True, ecc_pending=True,
                   power_limit_w=700.0, enforced_power_limit_w=700.0, default_power_limit_w=700.0,
                   app_clocks_setting=False)


def node(gpu: GpuSettings = H100, count: int = 8) -> dict[str, str | None]:
    return node_settings([gpu] * count)


def test_a_node_alike_over_its_gpus_reads_as_one_value_each() -> None:
    assert node() == {"gpus": "8", "driver": "575.57.08", "vbios": "96.00.A5.00.01", "model": "NVIDIA H100 80GB HBM3",
                      "power_limit": "700 W", "clocks": "default", "mig": "off", "ecc": "on",
                      "fabric_manager": None}  # not read: not observed


def test_gpus_that_differ_make_a_mixed_value_and_one_unobserved_gpu_makes_the_host_unobserved() -> None:
    low = replace(H100, enforced_power_limit_w=450.0)
    assert node_settings([H100, low, H100])["power_limit"] == "mixed: 450 W, 700 W"
    assert node_settings([H100, replace(H100, vbios=None)])["vbios"] is None
    assert node_settings([], listed=0)["driver"] is None


def test_clocks_pending_modes_and_the_listed_count() -> None:
    set_ = replace(H100, app_clock_graphics_mhz=1755, app_clock_memory_mhz=2619)
    assert node_settings([set_])["clocks"] == "1755/2619 MHz"
    assert node_settings([replace(H100, app_clocks_setting=True)])["clocks"] == "application clocks set"
    assert node_settings([replace(H100, mig_pending=True)])["mig"] == "off (pending on)"
    assert node_settings([H100] * 7, listed=8)["gpus"] == "8"


def test_one_host_on_another_driver_is_the_odd_one_out() -> None:
    hosts = {f"gpu-b{i:02d}": node() for i in range(1, 17)}
    hosts["gpu-b07"] = node(replace(H100, driver="570.86.15"))
    found = {c.name: c for c in compare(hosts)}
    driver = found["driver"]
    assert driver.majority == "575.57.08" and len(driver.alike) == 15
    assert dict(driver.odd) == {"gpu-b07": "570.86.15"}
    assert why(driver, "570.86.15") == "driver 570.86.15 (15 others 575.57.08)"
    assert all(not c.odd for name, c in found.items() if name != "driver")
    assert odd_hosts(found.values()) == {"gpu-b07": ["driver 570.86.15 (15 others 575.57.08)"]}


def test_a_tie_has_no_majority_and_names_every_host() -> None:
    hosts = {"a1": node(), "a2": node(), "b1": node(replace(H100, vbios="96.00.61.00.01")),
             "b2": node(replace(H100, vbios="96.00.61.00.01"))}
    vbios = next(c for c in compare(hosts) if c.name == "vbios")
    assert vbios.majority is None and vbios.tie and set(vbios.odd) == {"a1", "a2", "b1", "b2"}
    assert why(vbios, "96.00.A5.00.01") == "VBIOS 96.00.A5.00.01 (no majority: 96.00.61.00.01 on 2)"
    two = {c.name: c for c in compare({"x": node(), "y": node(count=7)})}
    assert two["gpus"].tie and set(two["gpus"].odd) == {"x", "y"}


def test_not_observed_is_never_the_same() -> None:
    hosts = {"a": node(), "b": node(), "c": node(replace(H100, driver=None))}
    driver = next(c for c in compare(hosts) if c.name == "driver")
    assert dict(driver.odd) == {"c": None} and driver.majority == "575.57.08"
    assert why(driver, None) == "driver not observed (2 others 575.57.08)"
    # one observed and one not: the one observed is the majority, the other named
    pair = next(c for c in compare({"a": node(), "c": hosts["c"]}) if c.name == "driver")
    assert pair.majority == "575.57.08" and dict(pair.odd) == {"c": None}


def test_a_property_no_host_gave_is_not_compared_and_one_host_compares_nothing() -> None:
    hosts = {"a": node(replace(H100, app_clocks_setting=None)), "b": node(replace(H100, app_clocks_setting=None))}
    clocks = next(c for c in compare(hosts) if c.name == "clocks")
    assert clocks.unobserved and not clocks.odd and not clocks.tie
    assert compare({"a": node()}) == ()


def test_per_group_compares_within_each_group_of_two_or_more() -> None:
    h200 = replace(H100, name="NVIDIA H200", driver="570.86.15")
    hosts = {"a1": node(), "a2": node(), "b1": node(h200), "b2": node(h200), "c1": node()}
    groups = compare_groups(hosts, {"h100": ["a1", "a2", "gone"], "h200": ["b1", "b2"], "c": ["c1"]})
    assert set(groups) == {"h100", "h200"}
    assert all(not c.odd for comparisons in groups.values() for c in comparisons)
    assert any(c.odd for c in compare(hosts))


def test_settings_from_real_captures_a_535_node_among_590_nodes() -> None:
    """Two real -q captures read as verify's fallback reads them: the 535.183.01 H100 node stands out among 590.48.01
    H200 nodes by driver, VBIOS, model, GPU count and clocks (the 590 driver says no application clocks)."""
    h100 = [GpuSettings.of(g) for g in parse_all_health((SMI / "8x-h100-80gb-hbm3_drv535.183.01_q_one-gpu-busy.txt")
                                                        .read_text())]
    h200 = [GpuSettings.of(g) for g in parse_all_health((SMI / "h200_drv590.48.01_1gpu_q_idle.txt").read_text())]
    hosts = {"h200-a": node_settings(h200), "h200-b": node_settings(h200), "h100": node_settings(h100)}
    assert hosts["h100"]["clocks"] == "1980/2619 MHz" and hosts["h200-a"]["clocks"] == "default"
    odd = odd_hosts(compare(hosts))
    assert set(odd) == {"h100"}
    assert odd["h100"][:3] == ["GPUs 8 (2 others 1)", "driver 535.183.01 (2 others 590.48.01)",
                               "VBIOS 96.00.74.00.01 (2 others 96.00.A5.00.03)"]


def report_of(settings: dict[str, list[GpuSettings | None]], failed: tuple[str, ...] = ()) -> RunReport:
    """A run whose hosts' GPUs verify read with these settings (an empty list: no GPU read), on nodes without a
    fabric manager (no NVSwitch)."""
    hosts = {name: HostReport(name=name, status=HostStatus.FAILED if name in failed else HostStatus.CLEAN,
                              reason=Reason.MEMORY_HELD if name in failed else None,
                              gpus=tuple(GpuReport(index=i, memory_used_mib=0, settings=s) for i, s in enumerate(gpus)),
                              fabric_manager=FabricManager.absent())
             for name, gpus in settings.items()}
    return RunReport(run_id="r", command="reset", started_at="2026-12-04T00:00:00+00:00", duration_s=1.0, hosts=hosts,
                     groups={"rack": tuple(settings)})


def gpus(gpu: GpuSettings = H100, count: int = 8) -> list[GpuSettings | None]:
    return [gpu] * count


def test_a_host_takes_part_only_with_settings_read() -> None:
    assert uniformity.host_settings(None) is None
    assert uniformity.host_settings(HostReport(name="x", status=HostStatus.CLEAN,
                                               gpus=(GpuReport(index=0, memory_used_mib=0),))) is None  # older fleet
    one_unread = HostReport(name="x", status=HostStatus.CLEAN,
                            gpus=(GpuReport(index=0, memory_used_mib=0, settings=H100),
                                  GpuReport(index=1, memory_used_mib=0)))
    assert uniformity.host_settings(one_unread) == {**node_settings([H100, None]), "gpus": "2"}
    assert (uniformity.host_settings(one_unread) or {})["driver"] is None


def test_the_summary_line_folds_the_odd_hosts_of_one_value_and_says_what_no_host_said() -> None:
    old = gpus(replace(H100, driver="570.86.15", app_clocks_setting=None))
    usual = gpus(replace(H100, app_clocks_setting=None))
    report = report_of({f"gpu-b{i:02d}": old if i in (3, 7) else usual for i in range(1, 17)} | {"gpu-x": []})
    assert uniform.settings_line(report) == ("settings: gpu-b[03,07] driver 570.86.15 (14 others 575.57.08);"
                                             " not said by any host: clocks")
    alike = report_of({"a": gpus(), "b": gpus()})
    assert uniform.settings_line(alike) == "settings: 2 hosts alike"
    assert uniform.settings_line(report_of({"a": gpus(), "b": []})) is None
    assert uniform.document(report_of({"a": gpus()})) is None


def test_the_json_document_per_run_and_per_group() -> None:
    document = uniform.document(report_of({"a": gpus(), "b": gpus(), "c": gpus(count=7)}))
    assert document is not None and document["hosts"] == 3
    assert document["properties"]["gpus"] == {"majority": "8", "alike": 2, "odd": {"c": "7"}, "tie": False,
                                              "unobserved": False, "absent": 0}
    assert document["groups"]["rack"]["properties"]["gpus"]["odd"] == {"c": "7"}


def test_uniform_fails_the_odd_ones_that_were_clean_and_leaves_a_failed_ones_reason() -> None:
    odd = gpus(replace(H100, vbios="96.00.61.00.01"))
    report = uniformity.fail_odd(report_of({"a": gpus(), "b": gpus(), "c": odd, "d": odd, "e": gpus()}, failed=("d",)))
    assert {n: (h.status, h.reason) for n, h in report.hosts.items() if h.status is not HostStatus.CLEAN} == {
        "c": (HostStatus.FAILED, Reason.NOT_UNIFORM), "d": (HostStatus.FAILED, Reason.MEMORY_HELD)}
    assert report.hosts["c"].error == ("not uniform with the run's other hosts: VBIOS 96.00.61.00.01"
                                       " (3 others 96.00.A5.00.01)")


# --- the fabric manager's version (a host's own, from verify's nv-fabricmanager --version) --------------------------

FM = FabricManager.present("575.57.08")


def rack(found: Mapping[str, FabricManager | None]) -> dict[str, dict[str, str | None]]:
    return {host: node_settings([H100] * 8, fabric_manager=fm) for host, fm in found.items()}


def fabric(found: Mapping[str, FabricManager | None]) -> Comparison:
    return next(c for c in compare(rack(found)) if c.name == "fabric_manager")


def test_the_fabric_manager_is_its_version_absent_or_not_observed() -> None:
    assert node_settings([H100], fabric_manager=FM)["fabric_manager"] == "575.57.08"
    assert node_settings([H100], fabric_manager=FabricManager.absent())["fabric_manager"] == ABSENT
    assert node_settings([H100], fabric_manager=FabricManager.unread("exited 1: x"))["fabric_manager"] is None


def test_a_host_on_an_older_fabric_manager_is_the_odd_one_out() -> None:
    found = fabric({f"gpu-b{i:02d}": FM for i in range(1, 17)} | {"gpu-b07": FabricManager.present("535.183.01")})
    assert found.majority == "575.57.08" and len(found.alike) == 15
    assert dict(found.odd) == {"gpu-b07": "535.183.01"}
    assert why(found, "535.183.01") == "fabric manager 535.183.01 (15 others 575.57.08)"


def test_a_host_without_a_fabric_manager_is_no_difference_and_no_unknown() -> None:
    found = fabric({"hgx-1": FM, "hgx-2": FM, "pcie-1": FabricManager.absent()})
    assert found.majority == "575.57.08" and found.alike == ("hgx-1", "hgx-2") and not found.odd
    assert found.absent == ("pcie-1",)
    none = fabric({"pcie-1": FabricManager.absent(), "pcie-2": FabricManager.absent()})
    assert not none.odd and not none.unobserved and not none.tie and none.absent == ("pcie-1", "pcie-2")
    assert uniform.settings_line(report_of({"pcie-1": gpus(), "pcie-2": gpus()})) == "settings: 2 hosts alike"
    unread = {n: replace(h, fabric_manager=None) for n, h in report_of({"a": gpus(), "b": gpus()}).hosts.items()}
    assert uniform.settings_line(replace(report_of({}), hosts=unread)) == \
        "settings: 2 hosts alike; not said by any host: fabric manager"  # a fleet that did not read it


def test_a_fabric_manager_not_observed_equals_nothing_and_fails_closed() -> None:
    found = fabric({"a": FM, "b": FM, "c": FabricManager.unread("nv-fabricmanager --version exited 1: x")})
    assert found.majority == "575.57.08" and dict(found.odd) == {"c": None}
    assert why(found, None) == "fabric manager not observed (2 others 575.57.08)"
    two = fabric({"a": FabricManager.unread("timed out"), "b": FabricManager.unread("timed out")})
    assert two.unobserved and not two.odd  # no host said it: not compared (and the line says so)


def test_the_summary_line_json_and_uniform_name_the_fabric_manager() -> None:
    report = report_of({f"gpu-b{i:02d}": gpus() for i in range(1, 5)})
    older = FabricManager.present("535.183.01")
    hosts = {n: replace(h, fabric_manager=older if n == "gpu-b03" else FM) for n, h in report.hosts.items()}
    report = replace(report, hosts=hosts)
    assert uniform.settings_line(report) == "settings: gpu-b03 fabric manager 535.183.01 (3 others 575.57.08)"
    document = uniform.document(report)
    assert document is not None
    assert document["properties"]["fabric_manager"] == {"majority": "575.57.08", "alike": 3,
                                                        "odd": {"gpu-b03": "535.183.01"}, "tie": False,
                                                        "unobserved": False, "absent": 0}
    assert uniformity.odd(report.hosts) == {"gpu-b03": ["fabric manager 535.183.01 (3 others 575.57.08)"]}
    failed = uniformity.fail_odd(report).hosts["gpu-b03"]
    assert failed.reason is Reason.NOT_UNIFORM and "fabric manager 535.183.01" in (failed.error or "")
def test_the_rack_compared_once_shows_what_each_part_computing_it_shows() -> None:
    """A run compares its rack once (`uniformity.rack`) for the JSON report, the summary and the page: each the same,
    byte for byte, as when it compares the rack itself (a synthetic 512-host report with an odd host, and the
    demo's summary.json)."""
    for document in (synthetic_document(), demo_document()):
        report = run_from_document(document)
        rack = uniformity.rack(report.hosts)
        assert render(to_document(report, rack)) == render(to_document(report))
        assert human_lines(report, rack) == human_lines(report)
        racked = page(RunPage(report=report, fleet_version="0", rack=rack))
        assert racked == page(RunPage(report=report, fleet_version="0"))
        assert uniformity.odd(report.hosts, rack) == uniformity.odd(report.hosts)
    assert uniformity.odd(report.hosts) == {"gpu-b07": ["driver 535.183.01 (15 others 550.90.07)",  # the demo's
                                                     "fabric manager 535.183.01 (15 others 550.90.07)"]}
    odd = uniformity.odd(run_from_document(synthetic_document()).hosts)
    assert list(odd) == [ODD_HOST]


def node_settings_gpu_by_gpu(gpus: Sequence[GpuSettings | None]) -> dict[str, str | None]:
    """`node_settings` the straightforward way: every property of every GPU worked out (fabric manager not read)."""
    values: dict[str, str | None] = {"gpus": str(len(gpus))}
    for prop in PROPERTIES:
        seen = [prop.of(g) if g is not None else None for g in gpus]
        values[prop.name] = _fold(seen) if seen else None
    return {**values, "fabric_manager": None}


def test_a_gpus_values_like_the_one_befores_are_its_own() -> None:
    other = replace(H100, driver="580.95.05", enforced_power_limit_w=300.0, mig=True)
    for gpus in ([H100] * 8, [H100, other] * 4, [H100] * 3 + [None] + [H100] * 4, [other, H100, H100, None, None],
                 [None], []):
        assert node_settings(gpus) == node_settings_gpu_by_gpu(gpus)
