"""report.html in Debian's headless Chromium: the page renders with no console message, and the check that says so
sees one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from support.report_page import (
    ODD_HOST,
    Page,
    cells_of,
    demo_document,
    page_of,
    png_pixels,
    synthetic_document,
)

from fleet.report.html_report import REPORT_HTML

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"
                                    " (/usr/bin/chromium): apt-get install chromium (.ci/run installs it)")
WINDOW = (1000, 1250)
CLEAN_BADGE, FAILED_BADGE, BUSY_BEFORE = bytes.fromhex("d3f9d8"), bytes.fromhex("ffe3e3"), bytes.fromhex("a61e4d")


@contextmanager
def _profile() -> Iterator[Path]:
    """Chromium's own temporary profile; every process still naming it afterwards is ended by pid; then removed."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-chromium-"))
    try:
        yield folder
    finally:
        for pid in _processes_naming(str(folder)):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def chromium(page_file: Path, screenshot: Path) -> tuple[str, list[str]]:
    """Open the page in headless Chromium once: its DOM after load (--dump-dom, stdout), a screenshot of the
    window, and the console messages it logged (stderr, with --enable-logging=stderr --v=0). Chromium runs in its
    own session with its own temporary profile, bounded by a timeout; its process group is ended after."""
    with _profile() as profile:
        argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={screenshot}", "--dump-dom",
                page_file.as_uri()]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=90)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its whole group: renderers, zygotes, crash handler
            proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    console = [line for line in err.decode(errors="replace").splitlines() if ":CONSOLE" in line]
    return out.decode(), console


@needs_chromium
def test_the_console_check_sees_a_console_message(tmp_path: Path) -> None:
    """The control for the check below: a page that logs, throws and loads from the network is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';"
                   " script-src 'unsafe-inline'\"><img src=\"https://example.invalid/x.png\">"
                   "<script>console.error('boom'); undefinedName();</script>")
    _, console = chromium(bad, tmp_path / "bad.png")
    assert any("boom" in line for line in console)
    assert any("undefinedName" in line for line in console)
    assert any("example.invalid" in line for line in console)


@needs_chromium
@pytest.mark.parametrize("which", ["demo", "512 hosts"])
def test_chromium_renders_the_page_with_no_console_message(which: str, tmp_path: Path) -> None:
    """The page opened from a file in Debian's headless Chromium (as from a mail attachment).

    How the check is made reliable: Chromium with `--enable-logging=stderr --v=0` writes every console message
    of the page to stderr as `INFO:CONSOLE:<line>] "<message>", source: <url>`: errors, warnings, uncaught
    exceptions and, through the page's Content-Security-Policy (`default-src 'none'`), every load it would have
    made (an image, a font, a stylesheet, a script); the control test above shows all four are caught. The page
    has no script, so any such line fails. The rows are counted in the DOM Chromium built (`--dump-dom`), after
    its HTML parser (which drops or moves what does not belong in a table), by their `data-row` attributes; the
    screenshot shows the CSS applied: the status badges' and the memory cells' own colours are in it."""
    document = demo_document() if which == "demo" else synthetic_document()
    page_file = tmp_path / REPORT_HTML
    page_file.write_text(page_of(document, log_folder=str(tmp_path)), encoding="utf-8")
    shot = tmp_path / "report.png"
    dom, console = chromium(page_file, shot)
    assert console == []
    parsed = Page(dom)
    hosts = len(document["hosts"])
    assert (len(parsed.of("grid")), len(parsed.of("timeline")), len(parsed.of("host"))) == (hosts, hosts, hosts)
    marked = [r for r in parsed.of("grid") if "data-odd" in r.attrs]  # the rack compared: the odd one out marked
    assert [r.get("data-host") for r in marked] == (["gpu-b07"] if which == "demo" else [ODD_HOST])
    assert sum(len(cells_of(r)) for r in parsed.of("grid")) == sum(
        max(len(h.get("gpus", [])), len(h.get("memory_before_mib", []))) for h in document["hosts"].values())
    width, height, colours = png_pixels(shot.read_bytes())
    assert (width, height) == WINDOW
    assert colours[CLEAN_BADGE] > 100 and colours[FAILED_BADGE] > 100 and colours[BUSY_BEFORE] > 100
    if which == "demo" and os.environ.get("FLEET_REPORT_SCREENSHOT"):  # refresh docs/report.png
        shutil.copyfile(shot, os.environ["FLEET_REPORT_SCREENSHOT"])
