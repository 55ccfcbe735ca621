"""Text helpers for the inventory's one-line error messages."""

from __future__ import annotations


def one_line(text: str) -> str:
    """The text with every run of whitespace, line breaks included, made one space."""
    return " ".join(text.split())
