"""Every relative link and anchor in README.md and docs/*.md resolves, and none leaves the repository.

A link's file must exist inside the checkout (no `../` past its root, no absolute filesystem path); a `#anchor`
must be the GitHub slug of a heading of the file it points at (or of the same file). Links in code blocks and code
spans are text, not links; http(s) and mailto links are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import REPO

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, a repeated one numbered as GitHub numbers it (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in enumerate(prose(path.read_text()), 1) for m in LINK.finditer(line)]


def problems(path: Path, root: Path) -> list[str]:
    """What is wrong with each relative link of one markdown file: `file:line: target: why`."""
    found = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        where, _, anchor = target.partition("#")
        why = None
        if where.startswith("/"):
            why = "an absolute path"
        else:
            dest = (path.parent / where).resolve() if where else path
            if not dest.is_relative_to(root):
                why = "leaves the repository"
            elif not dest.exists():
                why = "no such file"
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                why = f"no heading with the anchor #{anchor} in {dest.relative_to(root)}"
        if why:
            found.append(f"{path.relative_to(root)}:{n}: {target}: {why}")
    return found


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_every_link_in_the_readme_and_docs_resolves_inside_the_repository() -> None:
    assert [p for doc in documents(REPO) for p in problems(doc, REPO)] == []


def test_the_readme_links_every_page_of_docs() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for _, t in links(REPO / "README.md")}
    assert [d.name for d in sorted((REPO / "docs").glob("*.md")) if d.resolve() not in linked] == []


def test_the_readme_stays_under_300_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) < 300


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("docs/b.md#nowhere", "no heading with the anchor #nowhere in docs/b.md"),
        ("docs/c.md", "no such file"),
        ("../outside.md", "leaves the repository"),
        ("docs/../../outside.md", "leaves the repository"),
        ("/etc/passwd", "an absolute path"),
        ("#not-here", "no heading with the anchor #not-here in README.md"),
    ],
)
def test_a_broken_or_escaping_link_is_named(tmp_path: Path, target: str, why: str) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("# Outside\n")
    (root / "docs" / "b.md").write_text("# B\n\n## `--gpu-reset`: memory that never comes back\n")
    (root / "README.md").write_text(f"# A\n\nSee [there]({target}).\n")
    assert problems(root / "README.md", root) == [f"README.md:3: {target}: {why}"]


def test_links_that_resolve_pass_and_code_is_not_a_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = "# B\n\n## `--gpu-reset`: memory that never comes back\n\n## Notes\n\n## Notes\n"
    (tmp_path / "docs" / "b.md").write_text(page)
    (tmp_path / "README.md").write_text(
        "# A: the top\n\n[1](docs/b.md#--gpu-reset-memory-that-never-comes-back) [2](docs/b.md#notes-1) "
        "![3](docs/b.md) [4](#a-the-top) [5](https://example.com/x#y)\n\n"
        "`[no](missing.md)`\n\n```\n[no](missing.md)\n```\n"
    )
    assert problems(tmp_path / "README.md", tmp_path) == []
