"""tools/project_words.py finds remarks about how the repository's work was organised, and leaves SSH alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO


def tool() -> ModuleType:
    """tools/project_words.py as a module (tools/ is not a package: `make check` runs it as a script)."""
    spec = importlib.util.spec_from_file_location("project_words", REPO / "tools" / "project_words.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


words = tool()


@pytest.mark.parametrize("line", [
    "measured in round 7",
    "what issue 26 closed",
    "while another session loaded the machine",
    "on the borrowed H200",
    "That round ran while several other jobs loaded the machine",
    "the same machine was then shared with six other test runs",
    "a fix for issue #12",
    "see #41 for the rest",
    "the lent GPU machine",
    "contract changes this round did not make",
])
def test_a_remark_about_the_work_is_flagged(line: str) -> None:
    assert words.remarks(line) != []


@pytest.mark.parametrize("line", [
    "an SSH session",
    "ssh-agent",
    "the agent's keys",
    "every process of that session is SIGKILLed",
    "fleet's own session survives",
    "a held session costs about 31 KB",
    "the last round's kept holders",
    "asked again next round",
    "3 interleaved rounds of three",
    "a reservation keeps other jobs off the nodes",
    "CoHDI/composable-resource-operator#37",
    "color:#212529",
    "OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC",
])
def test_what_the_project_itself_says_is_not(line: str) -> None:
    assert words.remarks(line) == []


def test_each_remark_is_named_by_file_and_line() -> None:
    text = "fleet resets GPU nodes\nmeasured in round 7 and round 8\n"
    assert list(words.found("docs/x.md", text)) == ["docs/x.md:2: round 7", "docs/x.md:2: round 8"]


def test_a_binary_file_and_the_tool_with_its_test_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"\0measured in round 7")
    (tmp_path / "latin1.txt").write_bytes("r\xe9sum\xe9 of round 7".encode("latin-1"))
    (tmp_path / "notes.md").write_text("on the borrowed H200\n")
    for name in words.LEFT_OUT:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("measured in round 7\n")
    names = ["blob.bin", "latin1.txt", "notes.md", "gone.md", *sorted(words.LEFT_OUT)]
    assert words.scan(tmp_path, names) == ["notes.md:1: borrowed H200"]


def test_make_check_runs_it() -> None:
    check = (REPO / "Makefile").read_text().split("\ncheck:", 1)[1].split("\n\n", 1)[0]
    assert "tools/project_words.py" in check
