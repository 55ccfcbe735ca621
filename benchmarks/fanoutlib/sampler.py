"""A thread that samples something while a `with` block runs."""

from __future__ import annotations

import threading
import time


class Sampler:
    """`sample()` in a thread, from `with` to its end: every `every_s`, or ten times as long as a sample took (at
    most ~10% of a core on sampling, however large what it reads)."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            started = time.monotonic()
            self.sample()
            if self._stop.wait(max(self._every_s, 10 * (time.monotonic() - started))):
                return
