"""`fanout.py _measure`: run one tool's command as a child subreaper and report what its whole tree cost."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .procs import descendants, kill_pids, machine_busy_s, mem_available_mb, read_pss_kb, set_subreaper


def _sample(root: int, min_free_mb: int, peak: dict[str, int], stop: threading.Event, aborted: list[str]) -> None:
    """Until `stop`: the tree's summed PSS and process count into `peak`; the tree killed when MemAvailable
    drops under min_free_mb (the reason appended to `aborted`)."""
    interval = 0.25
    while not stop.wait(interval):
        started = time.monotonic()
        tree = descendants(root)
        total = sum(read_pss_kb(pid) for pid in tree)
        peak["pss_kb"] = max(peak["pss_kb"], total)
        peak["procs"] = max(peak["procs"], len(tree))
        peak["samples"] += 1
        if mem_available_mb() < min_free_mb and not aborted:
            aborted.append(f"memory: MemAvailable under {min_free_mb} MB")
            kill_pids(tree)
        # at most ~10% of one core on sampling, however large the tree
        interval = max(0.25, 10 * (time.monotonic() - started))


def _reap_orphans(me: int) -> int:
    """End and reap every process re-parented here; how many there were when the tool's command exited.

    Orphans (ssh ControlPersist masters, anything a tool left running) were re-parented here: end them
    and reap them, so their CPU is in RUSAGE_CHILDREN too."""
    orphans = descendants(me)
    kill_pids(orphans, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                kill_pids(descendants(me))
            time.sleep(0.02)
    return len(orphans)


def measure_main(argv: list[str]) -> int:
    """`_measure OUT.json TIMEOUT_S MIN_FREE_MB -- CMD...`: run CMD, reap its whole tree, report usage."""
    out_path, timeout_s, min_free_mb = Path(argv[0]), float(argv[1]), int(argv[2])
    cmd = argv[argv.index("--") + 1:]
    set_subreaper()
    me = os.getpid()
    peak = {"pss_kb": 0, "procs": 0, "samples": 0}
    stop = threading.Event()
    aborted: list[str] = []

    self_before = resource.getrusage(resource.RUSAGE_SELF)
    busy_before, started = machine_busy_s(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    thread = threading.Thread(target=_sample, args=(me, min_free_mb, peak, stop, aborted), daemon=True)
    thread.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        aborted.append(f"timeout after {timeout_s:g} s")
        kill_pids(descendants(me))
        rc = proc.wait()
    wall, busy_after = time.monotonic() - started, machine_busy_s()
    stop.set()
    thread.join()
    orphans = _reap_orphans(me)
    kids, own = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    own_cpu = (own.ru_utime + own.ru_stime) - (self_before.ru_utime + self_before.ru_stime)
    result = {
        "rc": rc, "wall_s": wall, "cpu_user_s": kids.ru_utime, "cpu_sys_s": kids.ru_stime,
        "cpu_s": kids.ru_utime + kids.ru_stime, "maxrss_mb": kids.ru_maxrss / 1024,
        "peak_tree_pss_mb": peak["pss_kb"] / 1024, "peak_procs": peak["procs"], "rss_samples": peak["samples"],
        "machine_busy_s": busy_after - busy_before, "wrapper_cpu_s": own_cpu, "orphans": orphans,
        "aborted": aborted[0] if aborted else None,
    }
    out_path.write_text(json.dumps(result))
    return 0
