"""The health gate's small reads in verify: the health fields and the row remapper, joined; an older driver's
`-q` instead; a cut read never passes (fleet.node.probes.health facts/remaps, fleet.reset.verify)."""

from __future__ import annotations

import pytest
from support import scripted_node
from support.scripted_node import Log

from fleet.inventory.host import Host
from fleet.model.errors import StepFailed
from fleet.model.report import Reason, StepStatus
from fleet.node.node import Node
from fleet.node.probes import health
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.smi import VERIFY_FIELDS
from fleet.reset.verify import verify
from fleet.transport.scripted import Reply, ScriptedTransport

BUS = "00000000:01:00.0"
# What nvidia-smi prints (stdout, exit 2) for a field its driver does not know: a real log,
# CoHDI/composable-resource-operator#37 (the field there was device_minor; tests/fixtures/nvidia-smi/SOURCES.md).
UNKNOWN_FIELD = 'Field "fabric.state" is not a valid field to query.\n\n'


def one_gpu_node(facts: Reply, remaps: Reply, q: str | None = None) -> tuple[Node, ScriptedTransport, Log]:
    t = ScriptedTransport(script=[
        (tuple(health.facts_argv("nvidia-smi")), facts),
        (tuple(health.remaps_argv("nvidia-smi")), remaps),
        (("nvidia-smi", "-q"), Reply(stdout=q if q is not None else scripted_node.healthy_q(BUS))),
        (("nvidia-smi", "--query-gpu=" + ",".join(VERIFY_FIELDS)),
         Reply(stdout=f"0, GPU-a, {BUS}, NVIDIA H100, 0, 81559, 0, Disabled\n")),
        (("nvidia-smi", "--query-compute-apps="), Reply(stdout="")),
        (scripted_node.SCAN, Reply(stdout=scripted_node.scan(""))),
        (scripted_node.KERNEL_LOG, scripted_node.kernel_log_reply()),
        scripted_node.NO_FABRIC_MANAGER,
    ])
    log = Log()
    return Node(Host(name="gpu-01", address="127.0.0.1", gpus=1, command_timeout=1.0), t, log), t, log


async def test_a_healthy_gpu_is_read_in_two_small_reads_and_one_command() -> None:
    node, t, _ = one_gpu_node(Reply(stdout=scripted_node.healthy_facts(BUS)),
                              Reply(stdout=scripted_node.healthy_remaps(BUS)))
    outcome = await verify(node)
    assert (outcome.result.status, outcome.result.error) == (StepStatus.OK, None)
    assert ("nvidia-smi", "-q") not in t.ran and node.commands == 1


async def test_a_pending_row_remap_read_from_the_remapper_section_fails_the_gpu() -> None:
    remaps = scripted_node.healthy_remaps(BUS).replace("Pending                                        : No",
                                                       "Pending                                        : Yes")
    assert remaps != scripted_node.healthy_remaps(BUS)
    node, _, _ = one_gpu_node(Reply(stdout=scripted_node.healthy_facts(BUS)), Reply(stdout=remaps))
    outcome = await verify(node)
    assert outcome.result.reason is Reason.HEALTH and "remap" in (outcome.result.error or "").lower()


async def test_a_driver_without_a_health_field_is_read_through_q_instead() -> None:
    """Not "no facts": the whole -q, one more command, and its findings count (an ECC error here)."""
    sick = scripted_node.healthy_q(BUS).replace("DRAM Uncorrectable                         : 0",
                                                "DRAM Uncorrectable                         : 1", 1)
    assert sick != scripted_node.healthy_q(BUS)
    node, t, log = one_gpu_node(Reply(stdout=UNKNOWN_FIELD, exit_status=2),
                                Reply(stdout=scripted_node.healthy_remaps(BUS)), sick)
    outcome = await verify(node)
    assert ("nvidia-smi", "-q") in t.ran and node.commands == 2
    assert outcome.result.reason is Reason.HEALTH and "ECC" in (outcome.result.error or "")
    assert ("health_fields_unknown", {"step": "verify", "fallback": "nvidia-smi -q"}) in log.events


async def test_any_other_exit_2_is_unreadable_not_a_missing_field() -> None:
    node, t, _ = one_gpu_node(Reply(stdout="", stderr="Invalid combination of input arguments.\n", exit_status=2),
                              Reply(stdout=scripted_node.healthy_remaps(BUS)))
    with pytest.raises(StepFailed, match=r"^unreadable nvidia-smi health fields: line 1: no GPU listed"):
        await verify(node)
    assert ("nvidia-smi", "-q") not in t.ran


@pytest.mark.parametrize("cut", ["facts", "remaps"])
async def test_a_read_cut_short_never_passes(cut: str) -> None:
    """A row with values missing, or a remapper read listing other GPUs than the fields did: unreadable."""
    facts = scripted_node.healthy_facts(BUS)
    remaps = scripted_node.healthy_remaps(BUS)
    if cut == "facts":
        facts = facts.rsplit(",", 3)[0] + "\n"
    else:
        remaps = remaps.replace(BUS, "00000000:02:00.0")
    node, _, _ = one_gpu_node(Reply(stdout=facts), Reply(stdout=remaps))
    with pytest.raises(StepFailed, match=r"^unreadable nvidia-smi .*(fields asked \(output cut\?\)|other GPUs)"):
        await verify(node)


def test_not_available_values_are_unknown_never_healthy_or_sick() -> None:
    row = f"{BUS}, [N/A], [N/A], [Not Supported], [N/A], N/A, N/A, [N/A], [N/A], [N/A], [N/A]"
    row += ", [N/A]" * (len(health.health_fields()) - 11) + "\n"  # the settings not said either
    (gpu,) = health.parse_facts(row) or ()
    assert gpu == health.GpuHealth(BUS)
    with pytest.raises(ProbeParseError, match="no PCI bus id"):
        health.parse_facts(row.replace(BUS, "[N/A]"))
    assert health.parse_facts(UNKNOWN_FIELD) is health.FIELDS_UNKNOWN


async def test_a_driver_that_refuses_the_row_remapper_section_is_read_through_q_instead() -> None:
    """`-q -d ROW_REMAPPER` exits non-zero (a driver without that display type): not a node that fails forever,
    and not "no facts": the whole -q, one more command, and its findings count (a pending remap here)."""
    sick = scripted_node.healthy_q(BUS).replace("Pending                                        : No",
                                                "Pending                                        : Yes", 1)
    assert sick != scripted_node.healthy_q(BUS)
    refused = Reply(stdout="", stderr="ERROR: Option -d ROW_REMAPPER is not recognized. Please run 'nvidia-smi -h'.\n",
                    exit_status=2)
    node, t, log = one_gpu_node(Reply(stdout=scripted_node.healthy_facts(BUS)), refused, sick)
    outcome = await verify(node)
    assert ("nvidia-smi", "-q") in t.ran and node.commands == 2
    assert outcome.result.reason is Reason.HEALTH and "remap" in (outcome.result.error or "").lower()
    assert [name for name, _ in log.events if name == "row_remapper_unread"] == ["row_remapper_unread"]
