"""Remarks about how the repository's work was organised, found: the project speaks of itself, not of its making.

    python tools/project_words.py             # every tracked text file (`git ls-files`); make check runs it
    python tools/project_words.py FILE...     # these files only

Prints `file:line: matched text` for each remark and exits 1 when there is one. A remark is what a reader of the
code, the docs or the changelog cannot use: rounds of work ("measured in round 7"), issue numbers they cannot open
("what issue 26 closed"; `owner/repo#N` and links are fine), sessions and helpers that did the work, who else loaded
the machine, a borrowed or lent machine. An SSH session, ssh-agent and the agent's keys are not remarks. Say what
a figure was measured on (its commit, date, machine and load) instead. This file and its test name the words to
find them, and are left out.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

# Each pattern one kind of remark; matched case-insensitively, a line at a time.
PATTERNS: tuple[str, ...] = (
    # rounds of work
    r"\bround \d+\b",
    r"\b(?:this|that|an earlier|the previous|a previous|a later) round\b(?! of the loop)",
    r"\brounds? of (?:work|review|changes|fixes)\b",
    # issue, pull request and ticket numbers with no repository a reader could open them in
    r"\b(?:issue|ticket|bug)s? #?\d+\b",
    r"\b(?:PR|pull request)s? #\d+\b",
    r"\b(?:see|fixes|fixed|closes|closed|resolves|resolved) #\d+\b",
    r"\(#\d+\)",
    # sessions, agents and helpers that did the work
    r"\b(?:another|other|this|the previous|a previous|an earlier|the last|the next|a later|my|our) "
    r"(?:work |working |coding |agent |helper )?sessions?\b(?!'s| (?:to|of|with|keep|kept|held|open)\b)",
    r"\b(?:work|working|coding|agent|helper|pairing) sessions?\b",
    r"\b(?:another|the other|a second|a fellow) (?:agent|helper|engineer|assistant|developer)s?\b",
    r"\b(?:coding|ai|llm|sub-?) ?(?:agent|assistant)s?\b",
    # who else loaded the machine
    r"\b(?:other|another) (?:jobs?|test runs?|profiling runs?|runs|sessions?|agents?|engineers?) "
    r"(?:ran|run|running|were running|was running|loaded|loading|used|using|beside|alongside)\b",
    r"\b(?:machine|box|vm|cores?)(?: was| is| were)?(?: then)? shared with\b",
    r"\bsomeone else'?s? (?:jobs?|load|runs?|work|tests?)\b",
    r"\bwhile (?:\S+ ){1,4}(?:loaded|used|shared) the (?:machine|box|cores)\b",
    # machines borrowed or lent
    r"\b(?:borrowed|lent|loaned)\s+(?:[\w-]+\s+)?(?:machine|gpu|h100|h200|a100|node|box|vm|card)s?\b",
    r"\b(?:machine|gpu|box|vm)s? (?:was |were )?(?:borrowed|lent|loaned)\b",
)
REMARK = re.compile("|".join(f"(?:{p})" for p in PATTERNS), re.IGNORECASE)

# They name the words to find them.
LEFT_OUT = frozenset({"tools/project_words.py", "tests/unit/test_project_words.py"})


def remarks(line: str) -> list[str]:
    """The remarks in one line of text, as matched."""
    return [m.group(0) for m in REMARK.finditer(line)]


def found(name: str, text: str) -> Iterator[str]:
    """`name:line: matched text` for each remark in a file's text."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in remarks(line):
            yield f"{name}:{number}: {match}"


def tracked(root: Path) -> list[str]:
    """The files git tracks under root, as git names them."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [name for name in listed.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """A file's text, or None for a binary (a NUL byte, or not UTF-8) or a file the checkout lacks."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def scan(root: Path, names: Iterable[str]) -> list[str]:
    lines: list[str] = []
    for name in names:
        if name in LEFT_OUT:
            continue
        text = text_of(root / name)
        if text is not None:
            lines.extend(found(name, text))
    return lines


def main(argv: list[str]) -> int:
    root = Path.cwd()
    hits = scan(root, argv or tracked(root))
    for line in hits:
        print(line)
    if hits:
        print(f"project_words: {len(hits)} remark(s) about how the work was organised: say what the reader needs "
              "(a figure's commit, date, machine and load), not who did it or when (tools/project_words.py)",
              file=sys.stderr)
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
