"""Text fleet writes is UTF-8 (the terminal, summary.json, report.html, the history); names it is given may hold any
bytes. Python hands a path or an argument that is not UTF-8 (`--log-dir $'/srv/runs-\\xff'`) over as text with
surrogate escapes (PEP 383), which a UTF-8 writer refuses: `printable` is that text with each such byte shown as
`\\xNN`, for every place a name is written for people to read. The name itself stays as given wherever fleet opens
the file.

What a node says (a process's name, a path, a tool's message) is chosen by whoever runs there: `terminal_safe` is
the one function every printer passes it through before a person sees it, so that no byte of it acts on a terminal
(a carriage return that rewrites the line, an escape sequence that hides the rest, a newline that forges one of
fleet's lines, a bidirectional override that reorders it). The JSON report keeps the text as it was: data.
"""

from __future__ import annotations

from os import PathLike


def printable(text: str | PathLike[str]) -> str:
    """`text` as any UTF-8 writer takes it: bytes that are not UTF-8 as `\\xNN`, any other lone surrogate as `\\udNNN`;
    text that is already UTF-8 comes back unchanged."""
    value = str(text)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no byte stands for (from JSON, say)
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


# Characters that act on a terminal rather than show: the C0 controls (newline and tab included: a value is one
# field of one line), DEL, the C1 controls, the bidirectional marks, embeddings, overrides and isolates, and the
# line and paragraph separators.
_ACTING = frozenset([*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                     *range(0x2066, 0x206A), 0x2028, 0x2029])
_ESCAPES = {c: (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _ACTING}


def terminal_safe(text: str | PathLike[str]) -> str:
    """`text` (`printable`) with every character that would act on a terminal written as its escape (`\\x1b`,
    `\\x0d`, `\\u202e`): what a node said, as a person may safely see it."""
    return printable(text).translate(_ESCAPES)


def terminal_safe_lines(text: str) -> str:
    """Each line of text fleet composed, `terminal_safe`: its own line breaks kept, nothing else acting."""
    return "\n".join(terminal_safe(line) for line in text.split("\n"))
