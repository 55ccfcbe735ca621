"""What every probe parser shares: `ProbeParseError` and the line helpers."""

from __future__ import annotations

from collections.abc import Iterator

from fleet.transport.base import clip

# Characters of an offending line an error message shows.
LINE_CLIP = 120


class ProbeParseError(ValueError):
    """A probe printed something its parser cannot read."""

    def __init__(self, lineno: int, line: str, reason: str) -> None:
        self.lineno = lineno
        self.line = line
        self.reason = reason
        super().__init__(f"line {lineno}: {reason}: {clip(line, LINE_CLIP)!r}")


def lines(text: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers; a final newline is optional. (A list's iterator: the outputs are
    short, and a comprehension reads them faster than a generator resumed a line.)"""
    return iter([(lineno, line.removesuffix("\r")) for lineno, line in enumerate(text.split("\n"), start=1)
                 if line.strip()])


def parse_int(text: str, lineno: int, line: str, what: str) -> int:
    """`text` as an int, else a `ProbeParseError` saying `what` is not one."""
    try:
        return int(text.strip())
    except ValueError:
        raise ProbeParseError(lineno, line, f"{what} is not an integer") from None
