"""Reporting: medians and ratios per size, the marginal CPU per host, the targets, the table, and
the summary of py-spy's folded stacks."""

from __future__ import annotations

import os
import re
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from .common import REPO, TOOLS, median

# the targets, checked at the largest size measured: (check, ratio it reads, goal as printed, test)
RATIO_TARGETS: tuple[tuple[str, str, str, Callable[[float], bool]], ...] = (
    ("client CPU per host fleet/floor", "fleet/floor cpu", "<= 1.3", lambda v: v <= 1.3),
    ("client CPU per host pdsh/fleet", "pdsh/fleet cpu", ">= 10", lambda v: v >= 10),
    ("client CPU per host ansible/fleet", "ansible/fleet cpu", ">= 20", lambda v: v >= 20),
    ("wall fleet/floor", "fleet/floor wall", "<= 1.2 (at 512)", lambda v: v <= 1.2),
)


def _medians(size: dict[str, Any]) -> dict[str, dict[str, float]]:
    """tool -> the medians over its repetitions at this size (and a few figures derived from them)."""
    n = size["nodes"]
    med: dict[str, dict[str, float]] = {}
    for tool, runs in size["runs"].items():
        if not runs:
            continue
        keys = ("wall_s", "cpu_s", "cpu_user_s", "cpu_sys_s", "maxrss_mb", "peak_tree_pss_mb",
                "machine_busy_s", "failed_hosts", "commands")
        row = {k: median([float(r[k]) for r in runs]) for k in keys}
        row["cpu_ms_per_host"] = 1000 * row["cpu_s"] / n
        row["server_cpu_s"] = median([r["machine_busy_s"] - r["cpu_s"] - r["wrapper_cpu_s"] for r in runs])
        row["commands_per_host"] = row["commands"] / n
        row["reps"] = len(runs)
        row["verified_min"] = min(int(r.get("verified_hosts", 0)) for r in runs)
        med[tool] = row
    return med


def _ratio(ratios: dict[str, float], med: dict[str, dict[str, float]], name: str, a: str, b: str, key: str) -> None:
    if a in med and b in med and med[b][key] > 0:
        ratios[name] = round(med[a][key] / med[b][key], 2)


def summarise(results: dict[str, Any]) -> None:
    for size in results["sizes"].values():
        med = size["median"] = _medians(size)
        ratios: dict[str, float] = {}
        _ratio(ratios, med, "fleet/floor cpu", "fleet", "floor", "cpu_s")
        _ratio(ratios, med, "fleet/floor wall", "fleet", "floor", "wall_s")
        _ratio(ratios, med, "pdsh/fleet cpu", "pdsh", "fleet", "cpu_s")
        _ratio(ratios, med, "ansible/fleet cpu", "ansible", "fleet", "cpu_s")
        _ratio(ratios, med, "pdsh/fleet wall", "pdsh", "fleet", "wall_s")
        _ratio(ratios, med, "ansible/fleet wall", "ansible", "fleet", "wall_s")
        size["ratios"] = ratios
    # marginal client CPU per host: least-squares slope of median CPU over the sizes
    sizes = sorted(results["sizes"].values(), key=lambda s: s["nodes"])
    marginal = {}
    for tool in TOOLS:
        pts = [(s["nodes"], s["median"][tool]["cpu_s"]) for s in sizes if tool in s.get("median", {})]
        if len(pts) >= 2:
            mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            marginal[tool] = {"ms_per_host": round(1000 * slope, 2), "fixed_s": round(my - slope * mx, 3)}
    results["marginal_cpu"] = marginal


def check_targets(results: dict[str, Any]) -> None:
    sizes = results["sizes"]
    if not sizes:
        return
    measured = [k for k, v in sizes.items() if v.get("median")]
    if not measured:
        return
    n = max(measured, key=int)
    med, ratios = sizes[n].get("median", {}), sizes[n].get("ratios", {})
    checks: dict[str, tuple[Any, str, bool]] = {}
    for name, key, goal, test in RATIO_TARGETS:
        if key in ratios:
            checks[name] = (ratios[key], goal, test(ratios[key]))
    if "fleet" in med:
        rss = round(med["fleet"]["maxrss_mb"], 1)
        checks["fleet peak RSS MB"] = (rss, "< 150 (at 512)", rss < 150)
    for size, doc in sorted(sizes.items(), key=lambda kv: int(kv[0])):  # every size and repetition, not medians
        runs = doc.get("runs", {})
        fleet_failed = max((int(r["failed_hosts"]) for r in runs.get("fleet", [])), default=0)
        floor_failed = max((int(r["failed_hosts"]) for r in runs.get("floor", [])), default=0)
        if runs.get("fleet"):
            checks[f"hosts fleet failed at N={size} (worst repetition; floor: {floor_failed})"] = (
                fleet_failed, "0", fleet_failed == 0)
    results["targets"] = {"n": int(n), "checks": checks}


# ---------------------------------------------------------- the table


def print_table(results: dict[str, Any]) -> None:
    cores = os.cpu_count()
    print()
    print(f"fan-out: fleet vs raw asyncssh floor vs pdsh vs Ansible, real OpenSSH sshd on loopback; "
          f"medians of {results['reps']} interleaved repetitions")
    print(f"NOTE: the {cores} cores of this machine also run every sshd and every simulated node: 'client CPU' is "
          f"the client process tree only; 'servers CPU' = machine busy CPU - client CPU over the same interval.")
    head = (f"{'N':>5} {'tool':<8} {'wall s':>8} {'client CPU s':>12} {'ms/host':>8} {'maxRSS MB':>9} "
            f"{'tree PSS MB':>11} {'servers CPU s':>13} {'cmds/host':>9} {'failed':>6} {'verified':>8}")
    print(head)
    print("-" * len(head))
    for size in results["sizes"].values():
        _print_size(size)
    if results.get("marginal_cpu"):
        print("marginal client CPU per host (slope over sizes): " + ", ".join(
            f"{t} {v['ms_per_host']} ms (+{v['fixed_s']} s fixed)" for t, v in results["marginal_cpu"].items()))
    targets = results.get("targets")
    if targets:
        print(f"targets at N={targets['n']}:")
        for name, (value, goal, ok) in targets["checks"].items():
            print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value} (target {goal})")
    prof = results.get("profile")
    if prof and "top_own" in prof:
        _print_profile(prof, max(results["sizes_asked"]))


def _print_size(size: dict[str, Any]) -> None:
    for tool, row in size.get("median", {}).items():
        print(f"{size['nodes']:>5} {tool:<8} {row['wall_s']:>8.2f} {row['cpu_s']:>12.2f} "
              f"{row['cpu_ms_per_host']:>8.1f} {row['maxrss_mb']:>9.1f} {row['peak_tree_pss_mb']:>11.1f} "
              f"{row['server_cpu_s']:>13.1f} {row['commands_per_host']:>9.1f} {int(row['failed_hosts']):>6} "
              f"{row['verified_min']:>8}")
    unlogged = [r.get("lock_command_not_logged", 0) for r in size["runs"].get("fleet", [])]
    if any(unlogged):
        print(f"      fleet logged no `command` event for the lock of {unlogged} hosts (per repetition): its release "
              f"timed out; the replays rebuild it from `lock_acquired`")
    idle = size.get("idle_fleet")
    if idle:
        print(f"      fleet on already clean nodes (1 run): wall {idle['wall_s']:.2f} s, client CPU "
              f"{idle['cpu_s']:.2f} s ({1000 * idle['cpu_s'] / size['nodes']:.1f} ms/host), "
              f"{idle['commands_per_host']['median']:g} commands/host, failed {int(idle['failed_hosts'])}")
    if size.get("ratios"):
        print("      ratios: " + ", ".join(f"{k} {v}" for k, v in size["ratios"].items()))


def _print_profile(prof: dict[str, Any], n: int) -> None:
    print(f"profile of fleet at N={n}: {prof['samples']} samples, folded stacks in {prof['folded']}")
    sections = (
        ("top own time:", "top_own"),
        ("top cumulative time:", "top_cumulative"),
        ("time by the deepest fleet/ frame on the stack (what fleet code it was spent for):", "top_by_fleet_frame"),
        ("own time by file:", "top_own_by_file"),
    )
    for title, key in sections:
        print(f"  {title}")
        for r in prof[key][:10]:
            print(f"    {r['pct']:5.1f}%  {r['frame']}")


# ---------------------------------------------------------- the profile


def summarise_profile(text: str, top: int = 12) -> dict[str, Any]:
    """Top frames by own time (leaf samples) and cumulative time (stacks containing them), and by file."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    own_file: Counter[str] = Counter()
    by_fleet: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        own_file[_file_of(frames[-1])] += n
        for frame in set(frames):
            cumulative[frame] += n
        # what fleet code the time is spent for: the deepest frame in fleet/ (startup/imports otherwise)
        mine = [f for f in frames if "(fleet/" in f and not f.startswith("<module>")]
        by_fleet[mine[-1] if mine else "(outside fleet frames: imports, interpreter start/exit)"] += n

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "samples": n, "pct": round(100 * n / total, 1)} for f, n in counter.most_common(top)]

    return {"samples": total, "top_own": rows(own), "top_cumulative": rows(cumulative),
            "top_own_by_file": rows(own_file), "top_by_fleet_frame": rows(by_fleet)}


def _file_of(frame: str) -> str:
    match = re.search(r"\(([^()]*)\)$", frame)
    if not match:
        return frame
    path = match.group(1)
    for marker in ("site-packages/", "lib/python3.11/", f"{REPO}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path

