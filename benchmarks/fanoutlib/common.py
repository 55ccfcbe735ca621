"""Constants and two small helpers shared by fanout.py and the fanoutlib modules."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
ENTRY = REPO / "benchmarks" / "fanout.py"  # re-invoked as `fanout.py _measure ...` and `fanout.py _floor ...`
SSHD = Path("/usr/sbin/sshd")
ADDRESSES_PER_SSHD = 16
UNIT = "sglang.service"
ALL_GPUS = (0, 1, 2, 3, 4, 5, 6, 7)
TOOLS = ("fleet", "floor", "pdsh", "ansible")
RIVALS = ("pdsh", "ansible")  # what users would pick instead of fleet
SIM_NODE_VAR = "FLEET_SIM_NODE"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
