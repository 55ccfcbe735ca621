"""The fabric manager's version, one section of verify's batch (the rack compared by it).

`nv-fabricmanager --version` prints one line, `Fabric Manager version is : 535.161.08` (every release since 450;
from ~610 a second one, `Build Info - Branch: rel/gpu_drv/r610/r610_85-4, Changelist: 0`, with no final newline):
tests/fixtures/fabricmanager/SOURCES.md names the captures. It prints a version compiled into the binary: it asks
neither the driver nor the running service, so it is cheap (command_timeout's bound, not nvidia-smi's) and answers
the same whether the service runs or not (docs/report-and-history.md says why the binary's version is the one read).

Read (`reading`, pure) as:

- exit 0 and exactly one version line (dotted digits), any other line a `Build Info` one: present, that version;
- exit 127 with nothing on stdout (`timeout`, and the shell, exit 127 for a command not found): absent, the node
  has no fabric manager (no NVSwitch): not a difference from the others. (A binary whose ELF interpreter is
  missing fails to start with the same ENOENT and exit 127: it reads as absent too; its service could not run
  either, and the GPUs' fabric state, the `fabric` health check, says so where the node has NVSwitches.)
- anything else (another exit status, no version line or two, a line of another shape, a value that is not a
  version, a byte that was not UTF-8) and a section that timed out, was cut or never ran (`observed`): not observed,
  with why. Never guessed.
"""

from __future__ import annotations

import functools
import re

from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.fabric import FabricManager
from fleet.node.node import Answers
from fleet.node.probe import ANY_EXIT, Probe, first_line
from fleet.node.probes.parse import ProbeParseError, lines
from fleet.transport.base import CommandResult

__all__ = ["ARGV", "NOT_FOUND", "observed", "probe", "reading", "version_of"]

ARGV = ("nv-fabricmanager", "--version")
NOT_FOUND = 127  # timeout(1) and sh: the command was not found
_VERSION_LINE = re.compile(r"Fabric Manager version is\s*:\s*(.*?)\s*")
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)+")
_BUILD_INFO = "Build Info - "


@functools.cache
def probe() -> Probe[str]:
    """The read: every exit status is an answer (`reading` tells them apart); never through sudo. The same for every
    host: made once (a probe is a value: frozen, no answer)."""
    return Probe(argv=ARGV, what="nv-fabricmanager --version", parse=str, ok_exits=ANY_EXIT)


def observed(answers: Answers, asked: Probe[str]) -> FabricManager:
    """What the batch's section says: its `reading`, or not observed when it has no answer (it timed out, was cut,
    never ran because a section before it hung)."""
    try:
        result = answers.result(asked)
    except (StepFailed, CommandTimeout) as exc:
        return FabricManager.unread(str(exc))
    return reading(result)


def reading(result: CommandResult) -> FabricManager:
    """Present, absent or not observed, from the command's exit status and what it printed (see the module)."""
    status = result.exit_status
    if status == NOT_FOUND and not result.stdout.strip():
        return FabricManager.absent()
    if status != 0:
        said = result.stderr if result.stderr.strip() else result.stdout
        return FabricManager.unread(f"nv-fabricmanager --version exited {status}: {first_line(said)}")
    try:
        return FabricManager.present(version_of(result.stdout))
    except ProbeParseError as exc:
        return FabricManager.unread(f"unreadable nv-fabricmanager --version: {exc}")


def version_of(stdout: str) -> str:
    """The version of `Fabric Manager version is : X`; ProbeParseError for no such line, two, a value that is no
    version, or a line of any other shape but `Build Info - ...`."""
    found: list[str] = []
    for lineno, line in lines(stdout):
        text = line.strip()
        match = _VERSION_LINE.fullmatch(text)
        if match is None:
            if not text.startswith(_BUILD_INFO):
                raise ProbeParseError(lineno, line, "not a version line")
            continue
        if found:
            raise ProbeParseError(lineno, line, "a second version line")
        if _VERSION.fullmatch(match.group(1)) is None:
            raise ProbeParseError(lineno, line, "not a version")
        found.append(match.group(1))
    if not found:
        raise ProbeParseError(1, stdout.strip(), "no version line")
    return found[0]
