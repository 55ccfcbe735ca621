"""How a node's JSON messages cross srun's stdout whole: framed in short lines, reassembled per node. Pure.

srun merges the tasks' stdout and keeps a line whole only up to its I/O buffer (1024 bytes in
Slurm 22.05: longer lines from several tasks come out cut and interleaved). So every message is
sent as frames of at most FRAME_BYTES, one a line:

    @fleet NODE MSG PART COUNT TEXT

MSG numbers the node's messages, PART counts from 1 to COUNT, TEXT is a slice of the message's
ASCII JSON. A message is delivered once all its parts have come, in order; anything else on
stdout is no frame (the reader keeps it as noise, never as a message).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MARK = "@fleet"
# Characters of message text per frame: with its header, a frame stays well under srun's 1024-byte lines.
FRAME_TEXT = 800
# Parts one message may have (a report of 8 GPUs is a few KB; a log event carries at most 4 KiB of output).
MAX_PARTS = 4096


def frames(node: str, number: int, message: dict[str, Any]) -> Iterator[str]:
    """The lines (without newline) that carry `message`, the node's `number`th."""
    text = json.dumps(message, ensure_ascii=True, separators=(",", ":"))
    parts = [text[i:i + FRAME_TEXT] for i in range(0, len(text), FRAME_TEXT)] or [""]
    for index, part in enumerate(parts, 1):
        yield f"{MARK} {node} {number} {index} {len(parts)} {part}"


class FrameError(ValueError):
    """A line that is no frame, or a frame out of order."""


@dataclass
class Assembler:
    """Reassemble each node's messages from its frames, which arrive in order per node."""

    _partial: dict[str, tuple[int, int, list[str]]] = field(default_factory=dict)  # node -> (msg, count, parts)

    def feed(self, line: str) -> tuple[str, dict[str, Any]] | None:
        """The (node, message) this line completes, or None while parts are missing; FrameError for noise."""
        fields = line.rstrip("\n").split(" ", 5)
        if len(fields) != 6 or fields[0] != MARK:
            raise FrameError("not a frame")
        _, node, number_s, part_s, count_s, text = fields
        try:
            number, part, count = int(number_s), int(part_s), int(count_s)
        except ValueError as exc:
            raise FrameError("a frame header fleet cannot read") from exc
        if not 1 <= part <= count <= MAX_PARTS:
            raise FrameError(f"frame {part} of {count}")
        if part == 1:
            self._partial[node] = (number, count, [])
        current = self._partial.get(node)
        if current is None or current[0] != number or current[1] != count or len(current[2]) != part - 1:
            self._partial.pop(node, None)
            raise FrameError(f"frame {part} of message {number} from {node} out of order")
        current[2].append(text)
        if part < count:
            return None
        del self._partial[node]
        try:
            message = json.loads("".join(current[2]))
        except ValueError as exc:
            raise FrameError(f"message {number} from {node} is not JSON") from exc
        if not isinstance(message, dict):
            raise FrameError(f"message {number} from {node} is not an object")
        return node, message

    def incomplete(self) -> list[str]:
        """Nodes whose last message never came whole."""
        return sorted(self._partial)
