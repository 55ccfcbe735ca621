"""A benchmark harness's own process importing fleet as a library: the sweep `fleet`'s docstring shows, run as it is
written, and what the process was before and after (its garbage collector, its file limit, its signal handlers,
what reached its stdout and stderr), as one JSON document on stdout.

    python library_sweep.py INVENTORY LOG_DIR
"""

from __future__ import annotations

import gc
import io
import json
import resource
import signal
import sys
import textwrap
import warnings
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

# Below the 66 descriptors fleet's command line raises the soft limit to for one host (a socket and a log each, and
# 64 spare): a library run that raised it would show here.
SOFT_NOFILE = 65
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def example(doc: str) -> str:
    """The docstring's indented example, as its code."""
    lines = doc.split("\n")
    start = next(i for i, line in enumerate(lines) if line.strip() == "import anyio")
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("    "))
    return textwrap.dedent("\n".join(lines[start:end]))


def state() -> dict[str, Any]:
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count(),
            "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            "handlers": {s.name: repr(signal.getsignal(s)) for s in SIGNALS}}


def main(inventory: str, log_dir: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_NOFILE, hard))
    import anyio

    import fleet

    kept = [[n] for n in range(10_000)]  # the harness's own objects, set aside from its collector
    gc.freeze()
    before = state()
    namespace: dict[str, Any] = {"__name__": "the harness"}
    exec(example(fleet.__doc__ or ""), namespace)  # the documented example, as a reader copies it
    ran: list[list[str]] = []

    async def benchmark(hosts: list[Any]) -> None:
        ran.append([h.name for h in hosts])

    said = io.StringIO()
    # Python's warnings are the harness's to filter (a library leaves them be): kept apart from what was written
    with redirect_stdout(said), redirect_stderr(said), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        dirty = anyio.run(namespace["sweep"], [benchmark, benchmark], inventory, log_dir)
    sys.stdout.write(json.dumps({"before": before, "after": state(), "dirty": dirty, "ran": ran,
                                 "said": said.getvalue(), "kept": len(kept),
                                 "warned": sorted({w.category.__name__ for w in warned})}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
