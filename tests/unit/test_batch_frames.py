"""A batch's streams read whole (one split where the tag stands) against the frame-by-frame reading each replaces
(fleet.transport.batch): on streams batch.sh frames, and on those cut, mangled or forged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet.transport import batch

TAG = "0123456789abcdef"
TEXTS = ["", "a", "a\n", "x\ny", "\n", TAG, f"{TAG} 0\n", f"\n{TAG} 0 0\n", " 1 0\n", " 0\n"]
EDITS = ["", "\n", " ", "x", "9", TAG, f"{TAG} 1\n", f"{TAG} 0 12\n", f"{TAG} 0 x\n"]


@given(answers=st.lists(st.tuples(st.sampled_from([0, 1, 124, 137]), st.sampled_from(TEXTS), st.sampled_from(TEXTS)),
                        max_size=4),
       before=st.sampled_from(["", "motd\n", "motd"]), at=st.integers(0, 400), edit=st.sampled_from(EDITS),
       cut=st.integers(0, 400), more=st.integers(-1, 1))
def test_a_stream_read_whole_reads_as_frame_by_frame(answers: list[tuple[int, str, str]], before: str, at: int,
                                                      edit: str, cut: int, more: int) -> None:
    out, err = batch.frame(TAG, answers)
    mangled = before + out[:at] + edit + out[at:]
    count = max(len(answers) + more, 0)
    for stream, with_status in ((out, True), (err, False), (mangled, True), (mangled[:cut], True),
                                (err[:cut], False)):
        whole = batch._whole(stream.split(TAG), count, with_status=with_status)
        each = batch._each_frame(stream, TAG, count, with_status=with_status)
        assert whole is None or whole == each
        assert batch._frames(stream, TAG, count, with_status=with_status) == each


def test_a_stream_batch_sh_framed_is_read_whole() -> None:
    """The fast way is the way taken: every section answered, nothing around them but what came before."""
    out, err = batch.frame(TAG, [(0, "a\n", ""), (2, "", "e"), (137, "x", "y\n")])
    assert batch._whole(("motd\n" + out).split(TAG), 3, with_status=True) == [("a\n", 0, None), ("", 2, None),
                                                                             ("x", 137, None)]
    assert batch._whole(err.split(TAG), 3, with_status=False) == [("", 0, None), ("e", 0, None), ("y\n", 0, None)]
