"""Fields other users control, read back as bytes: the escapes (fleet.node.probes.escapes), GNU stat's C
quoting of every byte (the exe lookup's), and the holder scan's NUL-ended records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet.node.probes.escapes import EscapeError, lossy_text, unescape
from fleet.node.probes.parse import ProbeParseError
from fleet.node.probes.procs import HolderRow, exe_argv, parse_exe, parse_scan


@pytest.mark.parametrize(("text", "raw"), [
    ("plain", b"plain"), ("a\\nb\\tc", b"a\nb\tc"), ("\\377\\000\\1234", b"\xff\x00S4"),
    ('\\"\\\\\\?', b'"\\?'), ("", b""),
])
def test_unescape_gives_the_bytes_back(text: str, raw: bytes) -> None:
    assert unescape(text) == raw


@pytest.mark.parametrize("text", ["a\\", "\\q", "\\400", "caf\u00e9"])
def test_unescape_refuses_what_is_no_escape(text: str) -> None:
    with pytest.raises(EscapeError):
        unescape(text)


def test_lossy_text_replaces_only_what_is_not_utf8() -> None:
    assert lossy_text(b"caf\xc3\xa9\xff") == "caf\u00e9\ufffd"


def test_stat_quotes_every_byte_and_parse_exe_reads_each_back(tmp_path: Path) -> None:
    """GNU stat's C quoting (exe_argv's) of a link to every byte but NUL, read back exactly."""
    target = bytes(range(1, 256))
    link = tmp_path / "link"
    os.symlink(target, link)
    done = subprocess.run([*exe_argv([1])[:-1], str(link)], capture_output=True, text=True, check=False,
                          env={**os.environ, "LANG": "C.UTF-8"})
    assert done.returncode == 0, done.stderr
    line = done.stdout.replace(str(link), "/proc/7/exe")
    assert line.isascii() and line.count("\n") == 1
    assert parse_exe(line) == {7: target}


def test_scan_records_end_in_nul_so_a_target_with_newlines_is_one_record() -> None:
    text = "hit\talice\t/proc/7/task/7/fd/3\t/dev/nvidia0\nhit\troot\t/proc/1/task/1/fd/3\t/dev/nvidia1\0init\0"
    assert parse_scan(text).rows == (
        HolderRow(7, "alice", ("/dev/nvidia0\nhit\troot\t/proc/1/task/1/fd/3\t/dev/nvidia1",)),)
    with pytest.raises(ProbeParseError, match="line 2: a record not ended by NUL"):
        parse_scan("init\0hit\talice\t/proc/7/task/7/fd/3\t/dev/nvid")  # cut: unreadable, never "nothing there"


@pytest.mark.parametrize(("quoted", "reason"), [("a\\", "expected"), ("\\400", "no byte"), ("\\q", "unknown"),
                                               ("caf\u00e9", "non-ASCII")])
def test_parse_exe_refuses_escapes_it_cannot_read(quoted: str, reason: str) -> None:
    with pytest.raises(ProbeParseError, match=reason):
        parse_exe(f'"/proc/7/exe" -> "{quoted}"')
