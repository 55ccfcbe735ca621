"""CommandResult: a value (frozen, compared and hashed by its fields), whose own __init__ sets its fields at once."""

from __future__ import annotations

import dataclasses

import pytest

from fleet.model.outcomes import CommandResult


def made() -> CommandResult:
    return CommandResult(argv=("nvidia-smi", "-L"), exit_status=0, stdout="GPU 0\n", stderr="", duration_s=0.25)


def test_its_fields_are_set_in_their_order_with_the_signal_none_by_default() -> None:
    result = made()
    assert list(vars(result)) == [f.name for f in dataclasses.fields(CommandResult)]
    assert (result.argv, result.exit_status, result.stdout, result.stderr, result.duration_s, result.signal) == (
        ("nvidia-smi", "-L"), 0, "GPU 0\n", "", 0.25, None)
    assert result.ok and not dataclasses.replace(result, exit_status=None, signal="KILL").ok


def test_it_is_a_value_compared_and_hashed_by_its_fields() -> None:
    assert made() == made() and hash(made()) == hash(made())
    assert made() != dataclasses.replace(made(), stderr="warning\n")
    assert CommandResult(argv=("true",), exit_status=0, stdout="", stderr="", duration_s=0.0, signal=None) == \
        CommandResult(argv=("true",), exit_status=0, stdout="", stderr="", duration_s=0.0)


def test_it_cannot_be_changed() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        made().stdout = "forged"  # type: ignore[misc]
