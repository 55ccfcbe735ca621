"""A node's output, bounded on the controller (fleet.transport.base.Kept): the first OUTPUT_LIMIT characters kept,
the rest counted and dropped, the cut marked so that no probe reads it as an answer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet.transport.base import OUTPUT_LIMIT, Kept, clip, make_result


def test_what_fits_is_kept_whole() -> None:
    kept = Kept(10)
    for chunk in ("abc", "defg", "hij"):
        kept.add(chunk)
    assert (kept.text, kept.dropped) == ("abcdefghij", 0)
    assert clip(kept.text, 10, kept.dropped) == "abcdefghij"


def test_past_the_limit_nothing_more_is_kept_and_the_cut_is_counted() -> None:
    kept = Kept(10)
    for chunk in ("abcdefgh", "ijklmnop", "q" * 1000):
        kept.add(chunk)
    assert (kept.text, kept.dropped) == ("abcdefghij", 1006)
    assert clip(kept.text, 10, kept.dropped) == "abcdefghij... [1006 characters cut]"


@given(st.lists(st.text(max_size=50), max_size=20), st.integers(min_value=0, max_value=200))
def test_kept_is_what_clip_would_keep_of_the_whole(chunks: list[str], limit: int) -> None:
    kept = Kept(limit)
    for chunk in chunks:
        kept.add(chunk)
    whole = "".join(chunks)
    assert clip(kept.text, limit, kept.dropped) == clip(whole, limit)
    assert len(kept.text) <= limit


def test_a_result_from_kept_streams_says_the_whole_cut() -> None:
    out, err = Kept(), Kept()
    out.add("x" * (OUTPUT_LIMIT + 5))
    err.add("e")
    result = make_result(["cat"], 0, None, out, err, 0.0)
    assert result.stdout == "x" * OUTPUT_LIMIT + "... [5 characters cut]" and result.stderr == "e"
