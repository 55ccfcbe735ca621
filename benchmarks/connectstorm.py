"""Connect storm: thousands of hosts at once through fleet's own connect path, over real OpenSSH sshd on loopback.

Per size (`--sizes`, default 2000,5000): N loopback addresses 127.0.0.2... served by real /usr/sbin/sshd daemons
(16 addresses a daemon, sshd's limit; all on one port; MaxStartups 10000:30:10000; one host key, a known_hosts
made for the run, one client key: `fanoutlib.sshd`). Every host is an inventory entry with its own address and
nothing else but the user, port, key and known_hosts: fleet's DEFAULT bounds (connect_timeout and
command_timeout as fleet's built-in defaults give them). A child process (`_storm`, `fanoutlib.storm`) then takes
every host at once as the task graph does: the graph's limiter, `fleet.transport.connect` (open_ssh: the same
path, and the same admission, as a reset's), one bounded `true` through the Transport, the close. Each host
closes after its command unless `--hold` (every session held until the last host has its answer).

Reported per size: hosts unreachable (must be 0) and failed; handshakes in flight at once: fleet's own record
(`fleet.transport.ssh.admission`, where fleet admits handshakes: width, peak in flight, peak waiting, CPU a
handshake) and always the connect calls in flight, counted around the call (with admission inside open_ssh that
includes the hosts waiting for a turn); sessions held at once (peak); each connect call's seconds (p50/p99/max,
against connect_timeout); the event loop's worst lateness; the controller's CPU (its own process, from the
storm's start to its end; the interpreter's start and imports apart) and that over hosts; wall time; peak RSS
(VmHWM); peak file descriptors (/proc/self/fd); the sshd side: the peak count of sshd processes and the
machine's busy CPU. The sshd daemons share the controller's cores: the controller runs under SCHED_FIFO 1 (a
core of its own whenever it can run, as on an admin node; `--no-rt` to not), the servers on the rest, so
handshakes take longer here than on a fleet whose nodes handshake on their own CPUs.

Not measured here: the reset's steps, per-host logs, the report (controller.py measures those without SSH).

    python benchmarks/connectstorm.py [--sizes 200,2000,5000] [--hold] [-j N] [--no-rt] [--json PATH]

Writes benchmarks/results/connectstorm-<timestamp>.json. Every daemon and session it starts is killed by pid and
its temp dir removed, on success, failure or Ctrl-C; a storm is ended when MemAvailable drops under --min-free-mb.
Exit status 1 when any host was unreachable or failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from fanoutlib.common import RESULTS, SSHD, log
from fanoutlib.procs import descendants, kill_pids, machine_busy_s, mem_available_mb, process_table, set_subreaper
from fanoutlib.sampler import Sampler
from fanoutlib.sshd import Daemons, addresses
from fanoutlib.storm import storm_main

ENTRY = Path(__file__).resolve()


def write_inventory(daemons: Daemons, path: Path) -> None:
    """One entry a host, its own address; nothing but how to log in: every bound is fleet's default."""
    defaults = {"user": "root", "port": daemons.port, "identity_file": str(daemons.key),
                "known_hosts": str(daemons.known_hosts)}
    hosts = {f"h{i:05d}": {"address": address} for i, address in enumerate(daemons.addrs, 1)}
    path.write_text(yaml.safe_dump({"defaults": defaults, "hosts": hosts}, sort_keys=False))


class Watch(Sampler):
    """While a storm runs: the peak count of sshd session processes, and MemAvailable's low; the storm's child and
    every session are killed (by pid) when MemAvailable drops under min_free_mb."""

    def __init__(self, daemons: Daemons, child: subprocess.Popen[bytes], min_free_mb: int) -> None:
        super().__init__(every_s=0.25)
        self.daemons, self.child, self.min_free_mb = daemons, child, min_free_mb
        self.peak_sessions, self.low_mb, self.aborted = 0, mem_available_mb(), ""

    def sample(self) -> None:
        self.peak_sessions = max(self.peak_sessions, len(self.daemons.sessions(process_table())))
        self.low_mb = min(self.low_mb, mem_available_mb())
        if self.low_mb < self.min_free_mb and not self.aborted:
            self.aborted = f"MemAvailable under {self.min_free_mb} MB"
            kill_pids([self.child.pid, *self.daemons.sessions()])


def run_storm(daemons: Daemons, inventory: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = inventory.with_name("storm.json")
    cmd = [sys.executable, str(ENTRY), "_storm", str(inventory), str(out)]
    cmd += ["--hold"] if args.hold else []
    cmd += ["--concurrency", str(args.concurrency)] if args.concurrency else []
    busy, load, servers = machine_busy_s(), os.getloadavg()[0], daemons.cpu_s()
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    if not args.no_rt:
        os.sched_setscheduler(child.pid, os.SCHED_FIFO, os.sched_param(1))  # inherited by the threads it starts
    watch = Watch(daemons, child, args.min_free_mb)
    with watch:
        try:
            rc = child.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            watch.aborted = f"timeout after {args.timeout:g} s"
            kill_pids([child.pid])
            rc = child.wait()
    busy = machine_busy_s() - busy
    settled = daemons.settled()
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    result.update(servers_cpu_s=round(daemons.cpu_s() - servers, 2), servers_settled=settled)
    result.update(rc=rc, aborted=watch.aborted or None, peak_sshd_processes=watch.peak_sessions,
                  mem_available_low_mb=watch.low_mb, machine_busy_s=round(busy, 1),
                  load_before=round(load, 1))
    return result


def one_size(count: int, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    root = tmp / f"storm-{count}"
    root.mkdir()
    daemons = Daemons(root, addresses(count))
    try:
        t0 = time.monotonic()
        daemons.start()
        log(f"N={count}: {len(daemons.procs)} sshd daemons on port {daemons.port} in {time.monotonic() - t0:.1f} s; "
            f"MemAvailable {mem_available_mb()} MB")
        inventory = root / "inventory.yaml"
        write_inventory(daemons, inventory)
        time.sleep(args.pause)
        result = run_storm(daemons, inventory, args)
    finally:
        daemons.stop()
        shutil.rmtree(root, ignore_errors=True)
    log(f"N={count}: " + line(result))
    return result


def line(r: dict[str, Any]) -> str:
    if "hosts" not in r:
        return f"no result (rc {r.get('rc')}, {r.get('aborted') or 'the storm wrote nothing'})"
    connect = r["connect_s"]
    return (f"unreachable {r['unreachable']} failed {r['failed']}  {handshakes(r)}  "
            f"held (peak) {r['peak_held']}  connect s p50 {connect.get('p50')} p99 {connect.get('p99')} "
            f"max {connect.get('max')}  loop late (max) {r['max_loop_lag_s']} s  CPU {r['cpu_s']} s "
            f"({1000 * r['cpu_s'] / r['hosts']:.2f} ms/conn)  wall {r['wall_s']} s  peak RSS {r['peak_rss_mb']} MB  "
            f"peak fds {r['peak_fds']}  sshd processes (peak) {r['peak_sshd_processes']}  "
            f"sshd CPU {r['servers_cpu_s']} s ({1000 * r['servers_cpu_s'] / r['hosts']:.1f} ms/conn)  "
            f"machine busy {r['machine_busy_s']} s  load average before {r['load_before']}" + aborted(r))


def handshakes(r: dict[str, Any]) -> str:
    """Handshakes in flight at once: fleet's own record where it admits handshakes, and the connect calls."""
    mine = f"connect calls in flight (peak) {r['peak_connecting']}"
    fleet = r.get("fleet_admission")
    if not fleet:
        return f"handshakes in flight (peak, no record in fleet: {mine})"
    return (f"handshakes in flight (peak, fleet's admission) {fleet['peak_in_flight']} of width {fleet['width']}, "
            f"waiting for admission (peak) {fleet['peak_waiting']}, CPU a handshake "
            f"{1000 * fleet['cpu_per_handshake_s']:.2f} ms{width_path(fleet)}; {mine}")


def width_path(fleet: dict[str, Any]) -> str:
    """The width's turns (start, peaks, troughs), the timeouts and the slowest handshake, where fleet keeps them."""
    if "width_path" not in fleet:
        return ""
    return (f", width path {'-'.join(map(str, fleet['width_path']))} (ceiling {fleet['ceiling']}), timed out "
            f"{fleet['timed_out']}, slowest handshake {fleet['worst_latency_s']:.1f} s")


def aborted(r: dict[str, Any]) -> str:
    return f"  [{r['aborted']}]" if r.get("aborted") else ""


def print_table(results: dict[str, Any]) -> None:
    sizes = results["sizes"]
    first = next((r for r in sizes.values() if "bounds" in r), None)
    bounds = first["bounds"] if first else {}
    print(f"\nfleet {results['fleet']['commit']} ({results['fleet']['path']}"
          + (", changed since" if results["fleet"]["changed"] else "") + ")")
    print(f"Connect storm: fleet.transport.connect + one bounded `true` + close, every host at once over real sshd "
          f"(hold: {results['hold']}, -j {results['concurrency'] or 'unset'}, controller {results['controller']}; "
          f"bounds: fleet's defaults {bounds})")
    head = (f"{'hosts':>6} {'unreach':>7} {'failed':>6} {'inflight':>8} {'held':>5} {'conn p50':>8} {'conn max':>8} "
            f"{'loop late':>9} {'CPU s':>7} {'ms/conn':>7} {'wall s':>7} {'RSS MB':>7} {'fds':>6} {'sshd procs':>10} "
            f"{'sshd ms/conn':>12}")
    print(head)
    for n, r in sizes.items():
        if "hosts" not in r:
            print(f"{n:>6} {line(r)}")
            continue
        c = r["connect_s"]
        fleet = r.get("fleet_admission") or {}
        print(f"{n:>6} {r['unreachable']:>7} {r['failed']:>6} {fleet.get('peak_in_flight', r['peak_connecting']):>8} "
              f"{r['peak_held']:>5} "
              f"{c.get('p50', 0):>8.2f} {c.get('max', 0):>8.2f} {r['max_loop_lag_s']:>9.2f} {r['cpu_s']:>7.2f} "
              f"{1000 * r['cpu_s'] / r['hosts']:>7.2f} {r['wall_s']:>7.1f} {r['peak_rss_mb']:>7.1f} "
              f"{r['peak_fds']:>6} {r['peak_sshd_processes']:>10} {1000 * r['servers_cpu_s'] / r['hosts']:>12.1f}"
              + aborted(r))
        print(f"{'':>6} {handshakes(r)}")
        for error in r.get("errors", [])[:2]:
            print(f"{'':>6} e.g. {error[:150]}")
    for n, r in sizes.items():
        bad = r.get("unreachable", 0) + r.get("failed", 0) if "hosts" in r else None
        verdict = "PASS" if bad == 0 else "FAIL"
        print(f"{verdict} hosts unreachable or failed at N={n}: {bad if bad is not None else 'not measured'} "
              f"(target 0)")


def fleet_measured() -> dict[str, str]:
    """Which fleet the storm ran: its folder and, where that is a git checkout, its commit (and whether it was
    changed since)."""
    import fleet
    where = Path(fleet.__file__).resolve().parent

    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(where), *argv], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"path": str(where), "commit": git("rev-parse", "--short", "HEAD") or "not a git checkout",
            "changed": git("status", "--porcelain", "--", str(where))[:2000]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2000,5000", help="comma-separated host counts")
    p.add_argument("--hold", action="store_true", help="hold every session until the last host has its answer")
    p.add_argument("-j", "--concurrency", type=int, help="fleet's -j (unset: one slot a host, as by default)")
    p.add_argument("--no-rt", action="store_true",
                   help="run the controller at normal priority (default: SCHED_FIFO 1, a core of its own, as on an "
                        "admin node: the sshd daemons share this machine's cores)")
    p.add_argument("--pause", type=float, default=2.0, help="seconds of quiet before each storm")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on one storm")
    p.add_argument("--min-free-mb", type=int, default=2000, help="end a storm when MemAvailable drops under this")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < 1:
        p.error("need sizes >= 1")
    if args.hold and args.concurrency:
        p.error("--hold holds every session until the last host has its answer: with -j the hosts past the first "
                "N would never get a slot")
    return args


def _interrupt(signum: int, frame: object) -> None:
    log(f"got {signal.Signals(signum).name}")
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    SSHD.exists() or sys.exit(f"{SSHD} not found: apt-get install openssh-server")
    os.environ.pop("SSH_AUTH_SOCK", None)  # the run's own key only
    set_subreaper()  # sessions orphaned by a killed daemon come back here, to be killed by pid
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, Any] = {"started_at": stamp, "hold": args.hold, "concurrency": args.concurrency,
                               "controller": "normal priority" if args.no_rt else "SCHED_FIFO 1",
                               "cores": os.cpu_count(), "fleet": fleet_measured(), "sizes": {}}
    tmp = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    interrupted = False
    try:
        for count in args.sizes:
            results["sizes"][str(count)] = one_size(count, tmp, args)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    finally:
        kill_pids(descendants(os.getpid()))
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1) + "\n"
    (RESULTS / f"connectstorm-{stamp}.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    print_table(results)
    if interrupted:
        return 130
    return 0 if all(r.get("unreachable", 1) + r.get("failed", 1) == 0 for r in results["sizes"].values()) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_storm":
        sys.exit(storm_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
