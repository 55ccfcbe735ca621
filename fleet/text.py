"""Text fleet writes is UTF-8 (the terminal, summary.json, report.html, the history); names it is given may hold any
bytes. Python hands a path or an argument that is not UTF-8 (`--log-dir $'/srv/runs-\\xff'`) over as text with
surrogate escapes (PEP 383), which a UTF-8 writer refuses: `printable` is that text with each such byte shown as
`\\xNN`, for every place a name is written for people to read. The name itself stays as given wherever fleet opens
the file.
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
