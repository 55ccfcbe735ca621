"""A run's outcome as Prometheus metrics, for node_exporter's textfile collector (`--metrics-file PATH`).

`render_metrics` is pure: the text exposition format (version 0.0.4), every family with `# HELP` and
`# TYPE`, all gauges (each file describes one run; nothing here counts across runs, so no `_total`), base
units (seconds, bytes), no sample timestamps (node_exporter refuses them in text files). A family with no
sample is left out. `write_metrics` replaces the file atomically, since node_exporter may read it at any moment.

Run:  fleet_run_info{run_id,command,fleet_version} 1, fleet_run_timestamp_seconds (when the run ended),
      fleet_run_duration_seconds, fleet_run_exit_code, fleet_run_hosts{status} (every status, 0 included).
Host: fleet_host_status{host,status} (one-hot: a series per status, 1 for the host's, 0 for the others),
      fleet_host_reason{host,reason} 1 (only for a host whose report carries a reason, i.e. that did not end
      clean or planned: a clean host has no reason series), fleet_host_duration_seconds,
      fleet_host_killed_processes, fleet_host_health_findings{host,level} (both levels, 0 included, the host's
      own findings counted too; only for a host that reported its GPUs or findings of its own),
      fleet_host_pci_health_findings{host,pci,level} (findings on a PCI address no listed GPU has: an NVSwitch,
      a GPU that fell off the bus; only the levels found).
GPU:  fleet_gpu_memory_used_bytes{host,gpu} (after the run, where known), fleet_gpu_settle_seconds{host,gpu}
      (where the GPU settled during the run).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fleet.model.report import HostReport, HostStatus, Level, RunReport
from fleet.version import __version__

MIB = 1024 * 1024

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One line of a family: its labels, in order, and its value."""

    labels: Labels
    value: float


@dataclass(frozen=True)
class Family:
    """One metric family: a gauge's name, its help text and its samples."""

    name: str
    help: str
    samples: tuple[Sample, ...]


def render_metrics(report: RunReport, *, exit_code: int, finished_at: float) -> str:
    """The Prometheus text of a run: `finished_at` is the run's end (seconds since the epoch), `exit_code`
    fleet's exit status for it."""
    families = [*run_families(report, exit_code=exit_code, finished_at=finished_at), *host_families(report)]
    return "".join(render_family(f) for f in families if f.samples)


def run_families(report: RunReport, *, exit_code: int, finished_at: float) -> list[Family]:
    """The families that describe the run as a whole."""
    info = (("run_id", report.run_id), ("command", report.command), ("fleet_version", __version__))
    return [
        Family("fleet_run_info", "The last fleet run: its id, command and fleet's version (always 1).",
               (Sample(info, 1),)),
        Family("fleet_run_timestamp_seconds", "When the last fleet run ended, in seconds since the epoch.",
               (Sample((), finished_at),)),
        Family("fleet_run_duration_seconds", "How long the last fleet run took.", (Sample((), report.duration_s),)),
        Family("fleet_run_exit_code", "The last fleet run's exit status (0: every host clean).",
               (Sample((), exit_code),)),
        Family("fleet_run_hosts", "Hosts of the last fleet run by the status they ended with.",
               tuple(Sample((("status", s.value),), report.count(s)) for s in HostStatus)),
    ]


def host_families(report: RunReport) -> list[Family]:
    """The families per host and per GPU, hosts in name order."""
    hosts = [report.hosts[name] for name in sorted(report.hosts)]
    return [
        Family("fleet_host_status", "1 for the status the host ended the last run with, 0 for the others.",
               tuple(s for h in hosts for s in status_samples(h))),
        Family("fleet_host_reason", "Why the host did not end clean in the last run (no series when it did).",
               tuple(Sample((("host", h.name), ("reason", h.reason.value)), 1) for h in hosts if h.reason is not None)),
        Family("fleet_host_duration_seconds", "How long the host took in the last run.",
               tuple(Sample((("host", h.name),), h.duration_s) for h in hosts)),
        Family("fleet_host_killed_processes", "Processes the last run killed on the host.",
               tuple(Sample((("host", h.name),), len(h.killed)) for h in hosts)),
        Family("fleet_host_health_findings", "Health findings on the host's GPUs and the host itself at the end of "
               "the last run, by level (fail: kept it from being clean; warn: reported only).",
               tuple(s for h in hosts for s in finding_samples(h))),
        Family("fleet_host_pci_health_findings", "Health findings in the last run on a PCI address of the host that "
               "no listed GPU has (an NVSwitch, a GPU that fell off the bus), by level.",
               tuple(s for h in hosts for s in pci_finding_samples(h))),
        Family("fleet_gpu_memory_used_bytes", "GPU memory in use at the end of the last run.",
               tuple(Sample(gpu_labels(h.name, g.index), g.memory_used_mib * MIB)
                     for h in hosts for g in h.gpus if g.memory_used_mib is not None)),
        Family("fleet_gpu_settle_seconds", "How long the GPU's memory took to come back in the last run.",
               tuple(Sample(gpu_labels(h.name, g.index), g.settle_s)
                     for h in hosts for g in h.gpus if g.settle_s is not None)),
    ]


def status_samples(host: HostReport) -> list[Sample]:
    """One-hot: a series for every status, 1 for the host's."""
    return [Sample((("host", host.name), ("status", s.value)), int(s is host.status)) for s in HostStatus]


def finding_samples(host: HostReport) -> list[Sample]:
    """The host's health findings (its GPUs' and its own) counted by level, both levels; none when the host reported
    neither GPUs nor findings of its own."""
    if not host.gpus and not host.health:
        return []
    levels = [f.level for g in host.gpus for f in g.health] + [f.level for f in host.health]
    return [Sample((("host", host.name), ("level", lv.value)), levels.count(lv)) for lv in Level]


def pci_finding_samples(host: HostReport) -> list[Sample]:
    """Findings on PCI addresses no listed GPU has, counted by address and level (the levels found only)."""
    counts: dict[tuple[str, str], int] = {}
    for f in host.health:
        if f.pci is not None:
            counts[(f.pci, f.level.value)] = counts.get((f.pci, f.level.value), 0) + 1
    return [Sample((("host", host.name), ("pci", pci), ("level", level)), n)
            for (pci, level), n in sorted(counts.items())]


def gpu_labels(host: str, index: int) -> Labels:
    return (("host", host), ("gpu", str(index)))


def render_family(family: Family) -> str:
    """A family's `# HELP`, `# TYPE gauge` and sample lines."""
    lines = [f"# HELP {family.name} {escape_help(family.help)}", f"# TYPE {family.name} gauge"]
    lines += [f"{family.name}{render_labels(s.labels)} {format_value(s.value)}" for s in family.samples]
    return "\n".join(lines) + "\n"


def render_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{escape_label(value)}"' for name, value in labels)
    return f"{{{inner}}}" if inner else ""


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """Help text as the text format wants it: backslash and line feed escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value: integers without a fraction, floats as Python's shortest repr, +Inf/-Inf/NaN spelled out."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def write_metrics(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically: a reader sees the old file or the new one, never a part.

    The text goes to a temporary file in the same folder (`.NAME.<random>.tmp`, which node_exporter's
    `*.prom` glob skips), is fsynced, made 0644 and renamed over `path`; the folder is fsynced after. On any
    failure the temporary file is removed and an OSError naming `path` (not the temporary file) is raised:
    a missing folder is a FileNotFoundError."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise about(exc, path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            os.fchmod(stream.fileno(), 0o644)
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise about(exc, path) from None
        raise
    sync_folder(path.parent)


def about(exc: OSError, path: Path) -> OSError:
    """The same error (errno, and so its subclass) about `path`: `[Errno 2] No such file or directory: 'PATH'`."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def sync_folder(folder: Path) -> None:
    """Make the rename durable; best effort, since the new file is already in place."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
