"""fleet's own nvidia-smi reads, as a real H200 on driver 580.159.04 answered them (captured on that
machine, 2026-12-04: each probe's exact argv run there, its stdout kept byte for byte; SOURCES.md), read by
fleet's parsers: the health fields, the `-q` they fall back to, the settle and verify queries and the compute
apps of a process holding 8802 MiB; and the two reads of the same GPU agree."""

from __future__ import annotations

from support.paths import FIXTURES

from fleet.node.probes import health, smi

SMI = FIXTURES / "nvidia-smi"
PREFIX = "h200_drv580.159.04_1gpu"
BUS = "00000000:00:06.0"
UUID = "GPU-86273323-6e04-1af6-1cc6-6c475d01207f"

# What nvidia-smi said, read once by hand from the capture (`[N/A]` retired pages and N/A fabric: absent facts).
FACTS = {
    "persistence": True, "ecc_corrected": 0, "ecc_uncorrected": 0, "pcie_gen": 5, "pcie_gen_max": 5,
    "pcie_width": 16, "pcie_width_max": 16, "name": "NVIDIA H200", "vbios": "96.00.A5.00.1A",
    "driver": "580.159.04", "compute_mode": "Default", "mig": False, "mig_pending": False, "ecc": True,
    "ecc_pending": True, "power_limit_w": 700.0, "enforced_power_limit_w": 700.0, "default_power_limit_w": 700.0,
    "app_clocks_setting": False, "app_clock_graphics_mhz": 1980, "app_clock_memory_mhz": 3201,
    "default_app_clock_graphics_mhz": 1980, "default_app_clock_memory_mhz": 3201,
}


def capture(kind: str) -> str:
    return (SMI / f"{PREFIX}_{kind}").read_text(encoding="utf-8")


def test_the_health_fields_read_as_printed() -> None:
    read = health.parse_facts(capture("query-gpu-health-fields_csv-noheader-nounits_idle.csv"))
    assert read is not None and len(read) == 1
    assert read[0].bus_id == BUS and read[0].unread == ()
    assert dict(read[0].facts) == FACTS


def test_the_q_read_of_the_same_gpu_says_the_same() -> None:
    """`-q` (the fuller read a driver without a field falls back to) says every fact the CSV said, the same;
    it adds the row remapper's."""
    (q,) = health.parse_all_health(capture("q_idle.txt"))
    assert q.bus_id == BUS and q.unread == ()
    assert FACTS.keys() <= q.facts.keys()
    assert {k: q.facts[k] for k in FACTS} == FACTS
    assert (q.facts["remap_pending"], q.facts["remap_failed"]) == (False, False)


def test_the_row_remapper_read() -> None:
    (remaps,) = health.parse_all_health(capture("q-d-row-remapper_idle.txt"))
    assert remaps.bus_id == BUS
    assert dict(remaps.facts) == {"driver": "580.159.04", "remap_pending": False, "remap_failed": False}


def test_a_process_holding_memory_as_settle_verify_and_the_apps_read_it() -> None:
    (settle,) = smi.parse_gpu_query(capture("query-gpu-settle-fields_csv-noheader-nounits_load-1proc.csv"),
                                    smi.SETTLE_FIELDS)
    assert (settle.index, settle.uuid, settle.memory_used_mib, settle.mig) == (0, UUID, 8811, False)
    (verify,) = smi.parse_gpu_query(capture("query-gpu-verify-fields_csv-noheader-nounits_load-1proc.csv"),
                                    smi.VERIFY_FIELDS)
    assert (verify.pci_bus_id, verify.name, verify.memory_used_mib, verify.memory_total_mib,
            verify.ecc_uncorrected) == (BUS, "NVIDIA H200", 8811, 143771, 0)
    (app,) = smi.parse_compute_apps(capture("query-compute-apps_csv-noheader-nounits_load-1proc.csv"))
    assert (app.gpu_uuid, app.pid, app.process_name, app.used_mib) == (UUID, 675, "python3", 8802)


def test_the_busy_q_is_as_healthy_as_the_idle_one() -> None:
    """A process holding memory changes no health fact."""
    (busy,) = health.parse_all_health(capture("q_load-1proc.txt"))
    (idle,) = health.parse_all_health(capture("q_idle.txt"))
    assert busy.facts == idle.facts
