"""docs/cli.md is what tools/cli_reference.py prints from the typer app, and the check says so when it drifts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.paths import REPO

SCRIPT = REPO / "tools" / "cli_reference.py"


def reference(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_docs_cli_md_is_the_command_line_as_it_is() -> None:
    """Regenerate with `.venv/bin/python tools/cli_reference.py > docs/cli.md` when this fails."""
    done = reference("--check", "docs/cli.md")
    assert (done.returncode, done.stderr) == (0, "")


def test_every_command_and_option_the_app_declares_is_in_it() -> None:
    text = reference().stdout
    for heading in ("## `fleet reset`", "## `fleet check`", "## `fleet inventory`", "## `fleet runs`",
                    "## `fleet show`", "## `fleet demo`"):
        assert heading in text
    for option in ("`--dry-run`", "`--canary N`", "`--max-fail N\\|P%`", "`--via ssh\\|srun`", "`--gpu-reset`"):
        assert option in text
    assert "node-run" not in text  # hidden: the node side of --via srun, not a command for people


def test_a_reference_that_differs_fails_the_check_naming_the_file(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text((REPO / "docs" / "cli.md").read_text().replace("`--canary N`", "`--canary COUNT`"))
    done = reference("--check", str(stale))
    assert done.returncode == 1
    assert done.stderr == f"{stale} differs from the command line: python tools/cli_reference.py > {stale}\n"
