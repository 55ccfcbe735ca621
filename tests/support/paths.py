"""Where the repository, the tests and their captures are, wherever the clone is (tests read nothing outside it)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
