"""Probes made once for every host that asks the same (a probe is a value: what to run and how to read it, never an
answer): the one made again is the same probe, it is what a probe made afresh is, and a change to what it depends
on (the nvidia-smi, the field list, the device globs, the table of GPU facts) makes another."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.model import gpu_facts
from fleet.node.probe import Probe
from fleet.node.probes import fabricmanager, health, kernel_log, procs, smi, units

ROW = gpu_facts.Field(name="clocks_sm", query="clocks.sm", q=(("Clocks", "SM"),), read=gpu_facts.count("SM clock"),
                      unit=" MHz", sim="1980")


def same_but_reader(made: Probe[Any], fresh: Probe[Any]) -> bool:
    """Every field but the reader alike (a lambda made afresh is another function): the reader is tried apart."""
    return all(getattr(made, f) == getattr(fresh, f) for f in ("argv", "what", "needs_root", "ok_exits", "reads",
                                                               "hang", "explain", "driver"))


@pytest.mark.parametrize("fields", [smi.SETTLE_FIELDS, smi.VERIFY_FIELDS, ("index",)])
def test_a_gpu_query_is_made_once_per_nvidia_smi_and_fields(fields: tuple[str, ...]) -> None:
    made = smi.gpu_query("/opt/bin/nvidia-smi", fields)
    assert smi.gpu_query("/opt/bin/nvidia-smi", list(fields)) is made
    assert smi.gpu_query("nvidia-smi", fields) is not made
    fresh = smi._gpu_query.__wrapped__("/opt/bin/nvidia-smi", fields)
    assert same_but_reader(made, fresh)
    text = "\n".join(", ".join(str(i) if f == "index" else "7" for f in fields) for i in range(3))
    assert made.parse(text) == fresh.parse(text) == smi.parse_gpu_query(text, fields)


def test_a_gpu_query_of_bad_fields_is_refused_each_time() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="bad nvidia-smi field list"):
            smi.gpu_query("nvidia-smi", ("index", "a b"))


def test_the_compute_apps_and_the_holder_scan_are_made_once() -> None:
    assert smi.compute_apps("/opt/bin/nvidia-smi") is smi.compute_apps("/opt/bin/nvidia-smi")
    assert smi.compute_apps("/opt/bin/nvidia-smi") == smi.compute_apps.__wrapped__("/opt/bin/nvidia-smi")
    scan = procs.holder_scan(["/dev/nvidia*"])
    assert procs.holder_scan(("/dev/nvidia*",)) is scan
    assert scan == procs._holder_scan.__wrapped__(("/dev/nvidia*",))
    assert procs.holder_scan(("/dev/nvidia*", "/dev/nvidia-caps/*")) != scan


def test_the_health_reads_are_made_once_per_table() -> None:
    facts, remaps = health.facts("/opt/bin/nvidia-smi"), health.remaps("/opt/bin/nvidia-smi")
    assert health.facts("/opt/bin/nvidia-smi") is facts and health.remaps("/opt/bin/nvidia-smi") is remaps
    assert same_but_reader(facts,
                           Probe(argv=tuple(health.facts_argv("/opt/bin/nvidia-smi")), what=facts.what,
                                 parse=facts.parse,
                                        ok_exits=facts.ok_exits, reads=facts.reads, hang=facts.hang,
                                        explain=facts.explain, driver=True))
    assert remaps.argv == tuple(health.remaps_argv("/opt/bin/nvidia-smi"))
    with gpu_facts.registered(ROW):  # another table: other probes, asking its fields
        assert health.facts("/opt/bin/nvidia-smi") is not facts
        assert "clocks.sm" in health.facts("/opt/bin/nvidia-smi").argv[1]
    assert health.facts("/opt/bin/nvidia-smi") == facts  # the table back as it was: what it asks, made again


def test_a_bus_id_is_read_as_a_pci_address_the_same_each_time() -> None:
    assert kernel_log.pci_of_bus_id("00000000:1B:00.0") == kernel_log.pci_of_bus_id.__wrapped__("00000000:1B:00.0")
    assert kernel_log.pci_of_bus_id("00000000:1B:00.0") == "0000:1b:00"
    for _ in range(2):  # one that is not a bus id is refused each time, never kept
        with pytest.raises(ValueError, match="not a PCI bus id"):
            kernel_log.pci_of_bus_id("GPU-1")


def test_the_reads_the_same_for_every_host_are_made_once() -> None:
    assert kernel_log.read() is kernel_log.read(None)
    assert kernel_log.read() == kernel_log._read(None)
    cursor = "s=0af8;i=2;b=a109;m=f4240;t=661d;x=e993"
    assert kernel_log.read(cursor) == kernel_log._read(cursor) and kernel_log.read(cursor).argv[-1] == cursor
    assert kernel_log.read(cursor) is not kernel_log.read(cursor)  # a host's own cursor: its own probe
    assert fabricmanager.probe() is fabricmanager.probe()
    assert fabricmanager.probe() == fabricmanager.probe.__wrapped__()


@pytest.mark.parametrize("made", [units.unit_state, units.unit_stop, units.unit_kill, units.unit_restart])
def test_a_units_probes_are_made_once_per_unit(made: Any) -> None:
    assert made("sglang.service") is made("sglang.service")
    assert made("sglang.service") == made.__wrapped__("sglang.service")
    assert made("vllm.service") != made("sglang.service")
