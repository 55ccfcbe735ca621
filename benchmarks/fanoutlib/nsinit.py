"""pid 1 of a simulated node's PID namespace (pidns.py): say it is up, then reap every orphan until killed.
Run as `nsinit.py READY_FILE`; SIGKILL from outside ends it and, with it, the whole namespace."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    ready = sys.argv[1]
    with open(ready + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")  # 1: this is the namespace's init
    os.replace(ready + ".tmp", ready)
    while True:
        try:
            os.wait()
        except ChildProcessError:  # nothing to reap yet: orphans arrive later
            time.sleep(0.5)


if __name__ == "__main__":
    main()
