"""What a reset would do on a host, as data: the dry run prints it, tests check it without an event loop."""

from __future__ import annotations

from fleet.models import Host, StepName
from fleet.steps import ESCALATION_WINDOW_S, SIGKILL_WAIT_S


def plan_steps(host: Host) -> list[tuple[StepName, str]]:
    """One line per step saying what it would run and how long it may take."""
    units = ", ".join(host.services)
    drain = (
        f"stop {units} (systemctl stop --no-block), wait up to {host.drain_timeout:g} s, "
        f"then SIGKILL the unit and wait up to {ESCALATION_WINDOW_S:g} s"
        if host.services else "no services to stop"
    )
    kill = (
        f"SIGTERM every process holding {' '.join(host.devices)} except protected "
        f"({', '.join(host.protected_names)}), wait up to {host.kill_grace:g} s, SIGKILL the rest "
        f"(up to {SIGKILL_WAIT_S:g} s), scan again"
    )
    settle = (
        f"poll {host.nvidia_smi} until every GPU is at or under {host.memory_threshold_mib} MiB, "
        f"up to {host.settle_timeout:g} s"
    )
    expected = f"{host.gpus} GPUs, " if host.gpus is not None else ""
    verify = f"expect {expected}every GPU at or under {host.memory_threshold_mib} MiB and no compute apps"
    return [(StepName.DRAIN, drain), (StepName.KILL, kill), (StepName.SETTLE, settle), (StepName.VERIFY, verify)]
