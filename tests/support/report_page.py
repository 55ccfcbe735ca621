"""Helpers for the report.html tests: a synthetic 512-host report document, the page of a report document (read
by the codec, as `fleet show --html` reads a summary.json), the page read back as a document (html.parser), and a
minimal PNG reader for Chromium's screenshots (stdlib only)."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from fleet.model.codec import run_from_document
from fleet.model.gpu_facts import GpuSettings
from fleet.report.html_report import RunPage, page
from support.paths import FIXTURES

REPORTS = FIXTURES / "report"
DEMO = REPORTS / "demo-summary.json"
DEMO_0_1 = REPORTS / "demo-summary-0.1.0.json"  # fleet 0.1.0's: no host's start in the run (start_s), no health


def demo_document(path: Path = DEMO) -> dict[str, Any]:
    """summary.json of a real `fleet demo --nodes 16` run (gpu-b16 failed by its health gate); `DEMO_0_1`: the
    same of fleet 0.1.0, an older summary."""
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def page_of(document: dict[str, Any], log_folder: str | None = None) -> str:
    """The page of a JSON report document, read back typed as `fleet show --html` reads a summary.json."""
    run = RunPage(report=run_from_document(document), fleet_version=document["fleet_version"])
    return page(run, log_folder=log_folder)


# Each synthetic GPU's settings as verify reads them (`gpus[].settings`); ODD_HOST's driver is older.
SETTINGS = {**{f.name: None for f in dataclasses.fields(GpuSettings)}, "name": "NVIDIA H100 80GB HBM3",
            "vbios": "96.00.A5.00.01", "driver": "575.57.08", "persistence": True, "compute_mode": "Default",
            "mig": False, "mig_pending": False, "ecc": True, "ecc_pending": True, "power_limit_w": 700.0,
            "enforced_power_limit_w": 700.0, "default_power_limit_w": 700.0, "app_clocks_setting": False}
ODD_HOST, ODD_DRIVER = "gpu-r03n07", "570.86.15"
WAVE_S = 15.0  # the synthetic run's waves (--batch 128): four racks each, one every 15 s


def _host(rack: int, node: int) -> tuple[str, dict[str, Any]]:
    """One host of the synthetic fleet: every field a reset fills, at the length a real one has. Its start in the run
    is its wave's (a few ms apart), after its Slurm wait where its node ran a job (every 29th host)."""
    name, k = f"gpu-r{rack:02d}n{node:02d}", rack * 100 + node
    waited = 2.0 + k % 9 if k % 29 == 0 else None
    start = round((rack - 1) // 4 * WAVE_S + node * 0.003 + (waited or 0.0), 3)
    status, reason, error = "clean", None, None
    before = [71523 if g == 0 else 70000 for g in range(8)]
    after: list[int | None] = [0] * 8
    health: list[list[dict[str, str]]] = [[] for _ in range(8)]
    if k % 37 == 0:
        status, reason, error = "failed", "memory_held", f"gpu 3 holds {1000 + k} MiB after 60 s (threshold 16 MiB)"
        after[3] = 1000 + k
    elif k % 53 == 0:
        status, reason, error = "failed", "health", "gpu 5: Xid 79 at 03:12:09: GPU has fallen off the bus"
        health[5] = [{"check": "xid", "level": "fail", "detail": "Xid 79 at 03:12:09: GPU has fallen off the bus"}]
    if k % 11 == 0:
        health[1].append({"check": "persistence", "level": "warn", "detail": "persistence mode off"})
    pid = 20000 + k * 3
    steps: list[dict[str, Any]] = [
        {"name": "drain", "status": "ok", "duration_s": round(1.0 + (k % 7) / 10, 3),
         "detail": "sglang.service inactive"},
        {"name": "kill", "status": "ok", "duration_s": round(2.0 + (k % 13) / 3, 3),
         "detail": f"killed 2 (1 on SIGTERM, 1 on SIGKILL); kept pid {pid + 2} nvidia-persistenced (protected name"
                   " nvidia-persistenced)"},
        {"name": "settle", "status": "ok" if status == "clean" or reason == "health" else "timeout",
         "duration_s": round(0.4 + (k % 5) / 4, 3), "detail": "8 GPUs at or under 16 MiB after 1.2 s"},
        {"name": "verify", "status": "ok" if status == "clean" else "failed", "duration_s": 0.7,
         "detail": "8 GPUs, max 0 MiB used, 0 compute apps, 0 unprotected holders"},
    ]
    gpus = [{"index": g, "memory_used_mib": after[g], "uuid": f"GPU-{k:08x}-58a3-03d8-e736-{g:012x}",
             "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "settle_s": 0.365, "health": health[g],
             "settings": {**SETTINGS, "driver": ODD_DRIVER} if name == ODD_HOST else SETTINGS}
            for g in range(8)]
    host: dict[str, Any] = {
        "status": status, "reason": reason, "duration_s": round(sum(s["duration_s"] for s in steps) + 0.9, 3),
        "start_s": start, "error": error, "steps": steps,
        "killed": [{"pid": pid, "name": "sglang", "user": "svc", "signal": "SIGTERM"},
                   {"pid": pid + 1, "name": "python3", "user": "root", "signal": "SIGKILL"}],
        "kept": [{"pid": pid + 2, "name": "nvidia-persistenced", "user": "root",
                  "why": "protected name nvidia-persistenced"}],
        "gpus": gpus, "health": [], "memory_before_mib": before,
        "slurm": {"node": name, "state_before": "MIXED", "reason_before": None,
                  "state_after": "IDLE" if status == "clean" else "DRAIN",
                  "reason_after": None if status == "clean" else f"fleet: run 20261203T030000Z-5e1f00: {error}",
                  "jobs": ["4711"] if waited else []},
    }
    if waited:
        host["slurm"]["waited_s"] = waited
    if k % 97 == 0:  # never reached: no GPU read, no step ran
        host.update(status="unreachable", reason="connect_timeout", error=f"no SSH session within 10 s ({name}:22)",
                    steps=[{**s, "status": "skipped", "duration_s": 0.0, "detail": ""} for s in steps], killed=[],
                    kept=[], gpus=[], duration_s=10.0)
        del host["memory_before_mib"]
    elif k % 89 == 0:  # its node's job outlived --drain-wait: never started
        error = f"slurm: job 4712 still running on {name} after 30 s: not reset"
        host.update(status="skipped", reason="jobs_running", error=error, start_s=None, duration_s=0.0, killed=[],
                    kept=[],
                    steps=[{**s, "status": "skipped", "duration_s": 0.0, "detail": ""} for s in steps], gpus=[],
                    slurm={**host["slurm"], "jobs": ["4712"], "waited_s": 30.0, "state_after": "IDLE",
                           "reason_after": None})
        del host["memory_before_mib"]
    return name, host


def synthetic_document(racks: int = 16, per_rack: int = 32) -> dict[str, Any]:
    """A 512-host reset (16 racks of 32) with every part of the page in use: failures, health findings, waves, Slurm
    (waits, and a job that outlived --drain-wait)."""
    hosts = dict(_host(r, n) for r in range(1, racks + 1) for n in range(1, per_rack + 1))
    counts = Counter(h["status"] for h in hosts.values())
    end = max((h["start_s"] or 0.0) + h["duration_s"] for h in hosts.values())
    return {"run_id": "20261203T030000Z-5e1f00", "fleet_version": "0.2.0", "command": "reset",
            "started_at": "2026-12-03T03:00:00+00:00", "duration_s": round(end + 0.2, 3),
            "summary": {"total": len(hosts), **{s: counts[s] for s in ("clean", "failed", "unreachable", "skipped")}},
            "hosts": hosts}


class Element:
    def __init__(self, tag: str, attrs: dict[str, str | None]) -> None:
        self.tag, self.attrs, self.text, self.children = tag, attrs, "", list[Element]()

    def get(self, name: str) -> str:
        return self.attrs.get(name) or ""


class Page(HTMLParser):
    """The page read back as a document: every element with a `data-row` (with the elements inside it and its
    text), the tags seen, the whole text. A `<title>` inside an element (SVG's hover text) becomes its `title`."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "wbr"})

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[Element] = []
        self.tags: Counter[str] = Counter()
        self.text: list[str] = []
        self._stack: list[Element] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        element = Element(tag, dict(attrs))
        row = next((e for e in reversed(self._stack) if e.get("data-row")), None)
        if element.get("data-row"):
            self.rows.append(element)
        elif row is not None:
            row.children.append(element)
        if tag not in self.VOID:
            self._stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            if self._stack.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        for element in self._stack:
            if element.get("data-row"):
                element.text += data
        if len(self._stack) > 1 and self._stack[-1].tag == "title":
            parent = self._stack[-2]
            parent.attrs["title"] = (parent.attrs.get("title") or "") + data

    def of(self, kind: str) -> list[Element]:
        return [r for r in self.rows if r.get("data-row") == kind]


def png_pixels(data: bytes) -> tuple[int, int, Counter[bytes]]:
    """Width, height and a count of each RGB colour of an 8-bit RGB or RGBA, non-interlaced PNG (Chromium's)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, "a PNG of another kind"
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * bpp
    previous, colours = bytearray(stride), Counter[bytes]()
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        _unfilter(kind, line, previous, bpp)
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        previous = line
    return width, height, colours


def _unfilter(kind: int, line: bytearray, up: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 255 for a, b in zip(line, up, strict=True))
        return
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + left) & 255
        elif kind == 3:
            line[i] = (line[i] + (left + up[i]) // 2) & 255
        else:
            corner = up[i - bpp] if i >= bpp else 0
            p = left + up[i] - corner
            pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
            line[i] = (line[i] + (left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner)) & 255


CELL = re.compile(r"^gpu (\d+): (?:(\S+) → )?(\S+) MiB")


def cells_of(row: Any) -> list[tuple[int, str | None, str]]:
    """(index, before, after) of each GPU cell of a grid row, read from its title."""
    found = []
    for cell in row.children:
        match = CELL.match(cell.get("title")) if cell.tag == "td" else None
        if match:
            found.append((int(match[1]), match[2], match[3]))
    return found
