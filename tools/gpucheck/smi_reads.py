"""fleet's own nvidia-smi probes on a real GPU machine: each probe's exact argv run there, its stdout and stderr
kept byte for byte (a tar.gz under OUT), and read by fleet's parsers (printed). Part of tools/gpucheck/run.sh.

    python3 tools/gpucheck/smi_reads.py OUT TAG
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.node.probe import Probe
from fleet.node.probes import fabricmanager, health, smi
from fleet.transport.base import CommandResult

PROBES: dict[str, Probe[Any]] = {
    "facts": health.facts("nvidia-smi"),
    "remaps": health.remaps("nvidia-smi"),
    "health_q": health.health("nvidia-smi"),
    "settle": smi.gpu_query("nvidia-smi", smi.SETTLE_FIELDS),
    "verify": smi.gpu_query("nvidia-smi", smi.VERIFY_FIELDS),
    "apps": smi.compute_apps("nvidia-smi"),
    "fabricmanager": fabricmanager.probe(),
}
PLAIN = {"table": ("nvidia-smi",), "q": ("nvidia-smi", "-q"), "version": ("nvidia-smi", "--version")}


def run(argv: Sequence[str]) -> tuple[int, bytes, bytes, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=60, check=False)
    except FileNotFoundError as exc:
        return 127, b"", str(exc).encode(), time.monotonic() - started
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def read(probe: Probe[Any], status: int, stdout: bytes, stderr: bytes, took: float) -> str:
    """What fleet makes of the answer: the parsed value, the probe's failure line, or the parser's error."""
    result = CommandResult(argv=probe.argv, exit_status=status, stdout=stdout.decode("utf-8", "surrogateescape"),
                           stderr=stderr.decode("utf-8", "surrogateescape"), duration_s=took)
    try:
        return repr(probe.read(result)) if probe.answered(result) else f"not answered: {probe.failure(result)}"
    except Exception as exc:  # a parser's refusal is what this check reports
        return f"PARSE ERROR {type(exc).__name__}: {exc}"


def main(out: Path, tag: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, argv in [*PLAIN.items(), *((n, p.argv) for n, p in PROBES.items())]:
            status, stdout, stderr, took = run(argv)
            for suffix, data in (("stdout", stdout), ("stderr", stderr), ("argv", json.dumps(list(argv)).encode()),
                                 ("rc", f"{status}\n".encode())):
                add(tar, f"{tag}/{name}.{suffix}", data)
            said = read(PROBES[name], status, stdout, stderr, took) if name in PROBES else ""
            print(f"== {name}: exit {status}, {len(stdout)} B in {took:.3f} s {said[:1500]}", flush=True)
    (out / f"captures-{tag}.tgz").write_bytes(buffer.getvalue())


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
