"""fleet's own cost a host beside an earlier commit's, measured on the same machine in the same minutes.

A figure in ms a host holds only on the machine it was measured on: the target's "3.3 ms a host" was measured at
487770f on a machine about twice as fast as the one that measures it today (the same commit, re-run here:
6.4-8.8 ms a host). So a target set against that figure is a ratio to that commit, and this script measures the
ratio: each tree (the reference, checked out into a temp worktree, and this one) records its own simulated
nodes with its own `controller.py`, then

- `--instructions`: counts the marginal user-space instructions a host of each (valgrind's cachegrind, the
  replay at SMALL and LARGE hosts, as `benchmarks/instructions.sh`): exact, and the same on any x86 machine;
- `--size N --rounds R`: times `controller.py --one N` of each in turn, R rounds (fleet's CPU a host,
  user+sys, the kernel's part included), and prints each run, the medians and their ratio.

Both trees run under the same interpreter and packages (this checkout's .venv), with `-S` and the tree first on
PYTHONPATH, so neither picks up the editable install's finder, which would import this checkout's fleet.

    python benchmarks/against.py [--ref 487770f] (--instructions [--small 100 --large 300] | --size 10000 --rounds 3)

The worktree and every temp folder are removed however it ends; each run's log folder only then
(see `Tree._one`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
RECORD = ("import pickle, sys, anyio; from pathlib import Path; sys.path.insert(0, 'benchmarks'); import controller; "
          "w = Path(sys.argv[1]); (w / 'recording.pickle').write_bytes(pickle.dumps(anyio.run(controller.record, w)))")


class Tree:
    """One tree's checkout, its recording, and how to run its controller.py."""

    def __init__(self, name: str, root: Path, work: Path) -> None:
        self.name, self.root, self.work = name, root, work
        self.runs = 0
        work.mkdir(parents=True)
        self.env = {**os.environ, "PYTHONPATH": f"{root}:{sysconfig.get_paths()['purelib']}"}
        self._python([sys.executable, "-S", "-c", RECORD, str(work)])

    def _python(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=self.root, env={**self.env, **(env or {})}, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: {' '.join(argv[:4])} ... exit {done.returncode}\n{done.stderr[-2000:]}")
        return done

    def _one(self, count: int, prefix: list[str]) -> subprocess.CompletedProcess[str]:
        """One run, in a folder of its own kept until every round is over (the temp folder goes at the end).

        Never removed between runs: on an ext4 without a journal (this VM's root) a new inode is not given the
        number of one removed in the last 60 s (360 s while its inode table block is dirty), and the kernel looks at
        each such free number in turn for every file it creates (`recently_deleted`, fs/ext4/ialloc.c). Removing a
        run's 10,000 files made the next run's `open(O_CREAT)` cost 0.38 ms of kernel CPU a file instead of 0.025
        (measured here on 2026-12-05, 10,000 files each), in both trees alike: a cost neither makes, which pulled
        the ratio toward 1. So, too: start this at least 6 minutes after many files were removed (an earlier run of
        it included). A run at 10,000 hosts keeps about 0.7 GB.
        """
        self.runs += 1
        out = self.work / f"run-{count}-{self.runs}"
        out.mkdir()
        return self._python([*prefix, sys.executable, "-S", "benchmarks/controller.py", "--one", str(count),
                             "--recording", str(self.work / "recording.pickle"), "--tmp", str(out)],
                            env={"FLEET_LOG_DIR": str(out)})

    def cpu_ms(self, count: int) -> float:
        row = json.loads(self._one(count, []).stdout.splitlines()[-1])
        return float(row["cpu_ms_per_host"])

    def instructions(self, count: int) -> int:
        done = self._one(count, ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"])
        refs = [line.split()[-1] for line in done.stderr.splitlines() if "I" in line and "refs" in line]
        return int(refs[-1].replace(",", ""))


def _instructions(trees: list[Tree], small: int, large: int) -> dict[str, float]:
    return {t.name: (t.instructions(large) - t.instructions(small)) / (large - small) / 1e6 for t in trees}


def _cpu(trees: list[Tree], size: int, rounds: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {t.name: [] for t in trees}
    for i in range(rounds):
        for tree in trees if i % 2 == 0 else trees[::-1]:  # each goes first in turn
            runs[tree.name].append(tree.cpu_ms(size))
            print(f"  round {i + 1}: {tree.name:>10} {runs[tree.name][-1]:.2f} ms a host", flush=True)
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="487770f", help="the earlier commit (default: the target's 3.3 ms)")
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=300)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-against-") as tmp_dir:
        tmp = Path(tmp_dir)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                                 capture_output=True, text=True, check=True).stdout.strip()
        head += "+changes" if changed else ""  # this tree is not HEAD: never the same name as a --ref HEAD
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tmp / "ref"), args.ref], cwd=HERE,
                       check=True)
        try:
            trees = [Tree(args.ref, tmp / "ref", tmp / "ref-work"), Tree(head, HERE, tmp / "head-work")]
            if args.instructions:
                figures, unit = _instructions(trees, args.small, args.large), "M instructions a host"
            else:
                figures, unit = _cpu(trees, args.size, args.rounds), f"ms a host at {args.size} (median)"
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "ref")], cwd=HERE, check=False)
    ref, now = figures[args.ref], figures[head]
    print(f"{args.ref}: {ref:.3f} {unit}; {head}: {now:.3f}; ratio {now / ref:.3f} "
          f"(the target, 2.0 against 3.3 ms: 0.606)")


if __name__ == "__main__":
    main()
