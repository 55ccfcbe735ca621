"""Fields other users control (paths, names), read back from escaped output as the bytes they are. Pure.

A process's executable path, its comm and its command line are chosen by whoever started it: any byte but
NUL, newlines, tabs, a batch's frame, bytes that are not UTF-8. So the probes never print them raw: the exe
lookup has GNU stat quote its links in C style (`C_QUOTED`: `"/opt/a\\nb\\377"`, ASCII, one line), the lineage
walk escapes a comm's every byte outside printable ASCII (and `\\`) as `\\ooo`. A field then can hold no
separator and no frame, and `unescape` gives its bytes back exactly: an identity is compared as bytes, and
shown (`lossy_text`) with what is not UTF-8 replaced.
"""

from __future__ import annotations

import re

# `env` words that make GNU stat's %N quote a link's name and target in C style, every byte kept (C locale:
# every byte outside printable ASCII is an octal escape).
C_QUOTED = ("env", "LC_ALL=C", "QUOTING_STYLE=c")

_SIMPLE = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "e": 27}
_ESCAPE = re.compile(r"\\([0-7]{3}|.)", re.DOTALL)
_QUOTED = r'"((?:[^"\\]|\\.)*)"'


class EscapeError(ValueError):
    """Escaped text that is not whole (a cut escape, an unknown one)."""


def unescape(text: str) -> bytes:
    """The bytes C-style escaped `text` stands for: `\\ooo` (three octal digits), `\\n` and its kin, `\\\\`,
    `\\"`, `\\?`, `\\'`; everything else is itself (ASCII; anything else would not have come escaped)."""
    out = bytearray()
    at = 0
    for match in _ESCAPE.finditer(text):
        out += _plain(text[at:match.start()])
        out.append(_escaped(match.group(1)))
        at = match.end()
    out += _plain(text[at:])
    return bytes(out)


def _plain(text: str) -> bytes:
    if "\\" in text:
        raise EscapeError(f"a cut escape in {text!r}")
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        raise EscapeError(f"unescaped non-ASCII text {text!r}") from None


def _escaped(code: str) -> int:
    if len(code) == 3:
        value = int(code, 8)
        if value > 0xFF:
            raise EscapeError(f"octal escape \\{code} is no byte")
        return value
    if code in _SIMPLE:
        return _SIMPLE[code]
    if code in "\\\"?'":
        return ord(code)
    raise EscapeError(f"unknown escape \\{code}")


def lossy_text(raw: bytes) -> str:
    """Bytes for people (logs, reports): UTF-8, with what is not UTF-8 replaced. Never compared."""
    return raw.decode("utf-8", errors="replace")


def c_link_pattern(name: str) -> re.Pattern[str]:
    """One line of `stat -c %N NAME` under C_QUOTED: `"NAME" -> "TARGET"` (group `target`: TARGET escaped),
    or `"NAME"` alone when the link could not be read (`target`: None). `name` is a regex (its groups kept)."""
    return re.compile(rf'"{name}"(?: -> {_QUOTED.replace("(", "(?P<target>", 1)})?')
