"""`--restore-settings`: after the kill, give every GPU the host's `gpu_settings` profile back (opt in).

Asks the node, in one command (a batch): each GPU's index and bus id and its settings (the health gate's
`--query-gpu`; the whole `nvidia-smi -q` on a driver that lacks a field). Decides (`fleet.reset.restore_changes`,
pure) the nvidia-smi commands that restore the profile; runs each as its own command, as root (through `sudo -n` on
a `become` host, as the kill's signals), bounded by nvidia-smi's bound (a GPU reset by `gpu_reset_timeout`) and all
of them together by `gpu_reset_timeout` (and one command's room: the reset lock's bound counts it), logged as its
own `settings_restore` event with its exit status and first line. A command the driver refuses, or one that does not
end within its bound, is said per GPU with what nvidia-smi printed (`gpu 3: nvidia-smi -i 3 -pl 700 exited 4: Failed
to set power management limit for GPU 00000000:18:00.0: Insufficient Permissions`): verify weighs it as a
`gpu_settings` finding. Verify's own read is the read-back: a setting the restore did not take still differs there.
A dry run lists the changes and makes none (`planned`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.inventory.host import Host
from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.gpu_facts import GpuSettings
from fleet.model.report import StepName
from fleet.node.bounds import Bound, commands_s, smi_bound
from fleet.node.budget import BudgetSpent, Room, TimeBudget
from fleet.node.node import Node
from fleet.node.probe import ANY_EXIT, Probe, first_line
from fleet.node.probes import health, smi
from fleet.reset.restore_changes import Change, Restoration, restoration

__all__ = ["Restored", "read_settings", "restore_settings"]

STEP = StepName.SETTLE  # the restore runs as settle begins (before its wait): its commands are logged there


# The nvidia-smi reads of the settings: the GPU query and the facts, or `-q` on an older driver.
READ_SMI = 3


def room(host: Host) -> Room:
    """Every change, the resets its mode changes need included, within `gpu_reset_timeout`, and a command's room."""
    return Room(0.0, host.gpu_reset_timeout + host.command_timeout)


def longest_s(host: Host, *, planned: bool = False) -> float:
    """The longest the restore can take: the settings read, each read at its bound, then (unless only planned)
    the changes."""
    return commands_s(host, smi=READ_SMI) + (0.0 if planned else room(host).seconds)


@dataclass(frozen=True)
class Restored:
    """What the restore did: the changes that took (their lines), those the driver refused or that hung, by GPU
    index, and the differences held back for want of `--gpu-reset`."""

    done: tuple[str, ...] = ()
    refused: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    held: tuple[str, ...] = ()

    @property
    def detail(self) -> str:
        """`; settings: 3 nvidia-smi changes took, 1 refused, held back: gpu 1: MIG mode on, ...`: settle's."""
        if not (self.done or self.refused or self.held):
            return ""
        refused = sum(len(r) for r in self.refused.values())
        parts = [f"settings: {len(self.done)} nvidia-smi change{'' if len(self.done) == 1 else 's'} took"]
        parts += [f"{refused} refused"] if refused else []
        parts += [f"held back: {'; '.join(self.held)}"] if self.held else []
        return "; " + ", ".join(parts)


async def read_settings(node: Node) -> list[tuple[int, GpuSettings]]:
    """Each GPU's nvidia-smi index and settings, joined by bus id (one batch; `-q` instead on an older driver)."""
    nvidia_smi = node.host.nvidia_smi
    rows_probe, facts_probe = smi.gpu_query(nvidia_smi, smi.VERIFY_FIELDS), health.facts(nvidia_smi)
    answers = await node.batch([rows_probe, facts_probe], step=STEP)
    rows, facts = answers.read(rows_probe), answers.read(facts_probe)
    if facts is health.FIELDS_UNKNOWN:
        facts = await node.ask(health.health(nvidia_smi), step=STEP)
    by_bus = {g.bus_id: g for g in facts}
    unread = [r.index for r in rows if r.pci_bus_id not in by_bus]
    if unread:  # never "nothing to restore": said, and left to verify's read, which judges them not observed
        node.log.warning("settings_unread", step=str(STEP), gpus=unread,
                         detail="nvidia-smi's facts name no GPU at these GPUs' bus ids: their settings not read")
    return [(r.index, GpuSettings.of(by_bus[r.pci_bus_id]) if r.pci_bus_id in by_bus else GpuSettings())
            for r in rows]


def _probe(nvidia_smi: str, change: Change) -> Probe[str]:
    return Probe(argv=(nvidia_smi, *change.args), what=f"nvidia-smi {' '.join(change.args)}", parse=str,
                 needs_root=True,
                 ok_exits=ANY_EXIT, driver=True)


async def _apply(node: Node, change: Change, budget: TimeBudget) -> str | None:
    """Run one change within what is left of the restore's budget; None when it took, else why not (nvidia-smi's
    exit status and first line, or the bound that ended it)."""
    host = node.host
    bound = Bound(host.gpu_reset_timeout, "gpu_reset_timeout") if change.reset else smi_bound(host)
    probe = _probe(host.nvidia_smi, change)
    try:
        answers = await node.batch([(probe, bound)], step=STEP, budget=budget)
        result = answers.result(probe)
    except (CommandTimeout, StepFailed, BudgetSpent) as exc:
        node.log.warning("settings_restore", step=str(STEP), gpu=change.gpu, command=probe.what, error=str(exc))
        return f"{probe.what} did not take: {exc}"
    said = first_line(result.stderr) if result.exit_status != 0 and result.stderr.strip() else first_line(result.stdout)
    log = node.log.info if result.exit_status == 0 else node.log.warning
    log("settings_restore", step=str(STEP), gpu=change.gpu, command=probe.what, what=change.what,
        exit_status=result.exit_status, said=said)
    return None if result.exit_status == 0 else f"{probe.what} exited {result.exit_status}: {said}"


async def restore_settings(node: Node, *, gpu_reset: bool = False,
                           planned: bool = False) -> tuple[Restoration, Restored]:
    """Read the settings, decide the changes and (unless `planned`: a dry run) make them; the changes decided and
    what came of them."""
    wanted = restoration(await read_settings(node), node.host.gpu_settings, gpu_reset=gpu_reset)
    for line in wanted.held:
        node.log.warning("settings_held", step=str(STEP), detail=line)
    if planned:
        return wanted, Restored(held=wanted.held)
    done: list[str] = []
    refused: dict[int, list[str]] = {}
    failed_gpus: set[int] = set()
    budget = room(node.host).start()
    for change in wanted.changes:
        if change.reset and change.gpu in failed_gpus:
            continue  # its mode change was refused: nothing pending to apply
        why = await _apply(node, change, budget)
        if why is None:
            done.append(change.line)
        else:
            refused.setdefault(change.gpu, []).append(f"{why} (restoring {change.what})")
            failed_gpus.add(change.gpu)
    return wanted, Restored(tuple(done), {gpu: tuple(lines) for gpu, lines in refused.items()}, wanted.held)
