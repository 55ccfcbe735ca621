"""The measured runs: fleet itself, then its logged commands replayed by the floor, pdsh and Ansible, each
under the `_measure` wrapper; and the py-spy profile of one fleet reset."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .common import ENTRY, REPO, RESULTS, SIM_NODE_VAR, median
from .procs import descendants, kill_pids
from .replay import fleet_commands, generic_line, ordered, replay_owner, wire_lines
from .summary import summarise_profile
from .testbed import Testbed

Commands = dict[str, list[dict[str, Any]]]


class _Unsafe(str):
    """A command line written to Ansible's inventory as `!unsafe`: no Jinja templating of its braces."""


def _unsafe_dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Unsafe, lambda d, v: d.represent_scalar("!unsafe", str(v), style="'"))
    return Dumper


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.python = sys.executable
        self.venv = Path(args.bench_venv).resolve()
        self.current: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "PYTHONSTARTUP")}
        self.env["PYTHONPATH"] = str(REPO)
        # The OpenSSH client gets the key exchange asyncssh (fleet, floor) negotiates with this sshd;
        # OpenSSH 9.2's default, sntrup761x25519, costs ~6x the client CPU of curve25519 per connection.
        self.kex_option = f" -o KexAlgorithms={args.ssh_kex}" if args.ssh_kex else ""

    def measure(self, label: str, cmd: list[str], env: dict[str, str] | None = None,
                stdout: Path | None = None) -> dict[str, Any]:
        out = self.tmp / f"measure-{label}.json"
        stdout_path = stdout or self.tmp / f"{label}.out"
        wrapper = [self.python, str(ENTRY), "_measure", str(out), str(self.args.run_timeout),
                   str(self.args.min_free_mb), "--", *cmd]
        with stdout_path.open("wb") as so, (self.tmp / f"{label}.err").open("wb") as se:
            self.current = subprocess.Popen(wrapper, stdout=so, stderr=se, env=env or self.env,
                                            start_new_session=True, cwd=self.tmp)
            self.current.wait()
            self.current = None
        if not out.exists():
            err = (self.tmp / f"{label}.err").read_text()[-2000:]
            raise RuntimeError(f"{label}: the measuring wrapper failed: {err}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["stdout_path"], result["stderr_path"] = str(stdout_path), str(self.tmp / f"{label}.err")
        return result

    def abort_current(self) -> None:
        proc = self.current
        if proc is not None and proc.poll() is None:
            kill_pids([*descendants(proc.pid), proc.pid])
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    # ---------------------------------------------------------- fleet

    def run_fleet(self, bed: Testbed, label: str) -> tuple[dict[str, Any], Commands]:
        log_dir = self.tmp / f"logs-{label}"
        cmd = [self.python, "-m", "fleet", "reset", "-i", str(bed.inventory), "-g", "all", "-y", "--json",
               "--log-dir", str(log_dir)]
        m = self.measure(label, cmd)
        try:
            report = json.loads(Path(m["stdout_path"]).read_text())
            summary = report["summary"]
            m["ok_hosts"] = summary["clean"]
            m["failed_hosts"] = bed.count - summary["clean"]
            errors = Counter(h["error"] for h in report["hosts"].values() if h["error"])
            m["errors"] = [f"{n}x {e}" for e, n in errors.most_common(3)]
            m["fleet_duration_s"] = report["duration_s"]
            m["verified_hosts"] = bed.verify(dict.fromkeys(bed.names, report["run_id"]))
        except (ValueError, KeyError, OSError) as exc:
            m["ok_hosts"], m["failed_hosts"] = 0, bed.count
            m["errors"] = [f"no JSON report ({exc}); stderr: {Path(m['stderr_path']).read_text()[-500:]}"]
        commands, m["lock_command_not_logged"] = fleet_commands(log_dir)
        counts = [len(v) for v in commands.values()]
        m["commands"] = sum(counts)
        m["commands_per_host"] = {"median": median(counts), "min": min(counts, default=0),
                                  "max": max(counts, default=0)}
        m["commands_by_step"] = dict(Counter(
            f"{e.get('step', 'lock')}:{os.path.basename(e['argv'][0])}" for evs in commands.values() for e in evs))
        return m, commands

    # ---------------------------------------------------------- floor

    def run_floor(self, bed: Testbed, label: str, commands: Commands, rep: int) -> dict[str, Any]:
        hosts = []
        for name, events in commands.items():
            hold, cmds = wire_lines(events, replay_owner(events, "floor", rep))
            hosts.append({"address": bed.addrs[name], "hold": hold, "cmds": cmds})
        spec = self.tmp / f"floor-{label}.json"
        # the floor negotiates the cipher fleet does (fleet.transport.ssh.ENCRYPTION_ALGS): both pay the same crypto
        from fleet.transport.ssh import ENCRYPTION_ALGS
        spec.write_text(json.dumps({"port": bed.port, "user": "root", "identity_file": str(bed.key),
                                    "known_hosts": str(bed.known_hosts), "hosts": hosts,
                                    "encryption_algs": list(ENCRYPTION_ALGS)}))
        m = self.measure(label, [self.python, str(ENTRY), "_floor", str(spec)])
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "floor", rep) for n, ev in commands.items()})
        try:
            out = json.loads(Path(m["stdout_path"]).read_text())
            m["failed_hosts"], m["commands"], m["errors"] = out["failed"], out["commands"], out["errors"]
            m["failed_hosts"] += bed.count - out["hosts"]
        except (ValueError, KeyError, OSError) as exc:
            m["failed_hosts"], m["commands"] = bed.count, 0
            m["errors"] = [f"no output ({exc}): {Path(m['stderr_path']).read_text()[-500:]}"]
        return m

    # ---------------------------------------------------------- pdsh

    def run_pdsh(self, bed: Testbed, label: str, commands: Commands, rep: int) -> dict[str, Any]:
        work = self.tmp / f"pdsh-{label}"
        work.mkdir()
        ssh_args = (f"-F /dev/null -p {bed.port} -i {bed.key} -o IdentitiesOnly=yes -o BatchMode=yes "
                    f"-o UserKnownHostsFile={bed.known_hosts} -o StrictHostKeyChecking=yes{self.kex_option}")
        script, invocations, total = _pdsh_script(work, bed, commands, rep)
        (work / "run.sh").write_text("\n".join(script) + "\n")
        env = dict(self.env, PDSH_SSH_ARGS_APPEND=ssh_args)
        m = self.measure(label, ["/bin/bash", str(work / "run.sh")], env=env)
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "pdsh", rep) for n, ev in commands.items()})
        failed: set[str] = set()
        bad = re.compile(r"^pdsh@[^:]*: ([0-9.]+): (ssh exited with exit code 255|.*timed? ?out)")
        for err in work.glob("err-*"):
            for line in err.read_text(errors="replace").splitlines():
                match = bad.match(line)
                if match:
                    failed.add(match.group(1))
        m["failed_hosts"], m["commands"], m["invocations"] = len(failed), total, invocations
        m["errors"] = sorted(failed)[:5]
        return m

    # ---------------------------------------------------------- ansible

    def run_ansible(self, bed: Testbed, label: str, commands: Commands, rep: int) -> dict[str, Any]:
        work = self.tmp / f"ansible-{label}"
        (work / "cp").mkdir(parents=True)
        hosts = {}
        for name, events in commands.items():
            events = ordered(events)
            root = str(bed.nodes[name].root)
            owner = replay_owner(events, "ansible", rep)
            hold, cmds = wire_lines(events, owner)
            lines = ([generic_line(events, 0, root, owner).replace(f'"${SIM_NODE_VAR}"', shlex.quote(root))]
                     if hold else []) + cmds
            hosts[name] = {"ansible_host": bed.addrs[name], "fleet_cmds": [_Unsafe(c) for c in lines]}
        self._write_ansible_files(work, bed, hosts)
        env = dict(self.env, ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_HOME=str(work / "home"),
                   ANSIBLE_LOCAL_TEMP=str(work / "tmp"), ANSIBLE_NOCOLOR="1")
        env.pop("PYTHONPATH", None)
        m = self.measure(label, [str(self.venv / "bin" / "ansible-playbook"), "-i", str(work / "inventory.yml"),
                                 str(work / "play.yml")], env=env)
        m["verified_hosts"] = bed.verify({n: replay_owner(ev, "ansible", rep) for n, ev in commands.items()})
        m["failed_hosts"] = _ansible_failed(Path(m["stdout_path"]).read_text(errors="replace"), bed.count)
        m["commands"] = sum(len(h["fleet_cmds"]) for h in hosts.values())
        m["errors"] = [] if not m["failed_hosts"] else [Path(m["stdout_path"]).read_text()[-500:]]
        return m

    def _write_ansible_files(self, work: Path, bed: Testbed, hosts: dict[str, Any]) -> None:
        """inventory.yml (the hosts' lines as `!unsafe`), play.yml (`raw` over the loop), ansible.cfg."""
        import yaml

        common = (f"-F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={bed.known_hosts} "
                  f"-o StrictHostKeyChecking=yes{self.kex_option}")
        inventory = {"all": {"hosts": hosts, "vars": {
            "ansible_port": bed.port, "ansible_user": "root", "ansible_ssh_private_key_file": str(bed.key),
            "ansible_ssh_common_args": common}}}
        (work / "inventory.yml").write_text(
            yaml.dump(inventory, Dumper=_unsafe_dumper(), sort_keys=False, width=1 << 20))
        (work / "play.yml").write_text(yaml.safe_dump([{
            "hosts": "all", "gather_facts": False,
            "tasks": [{"name": "fleet's commands", "raw": "{{ item }}", "loop": "{{ fleet_cmds }}",
                       "failed_when": False, "loop_control": {"label": "cmd"}}]}], sort_keys=False))
        (work / "ansible.cfg").write_text(
            f"[defaults]\nforks = {bed.count}\nhost_key_checking = True\ngathering = explicit\n"
            f"retry_files_enabled = False\ntimeout = 120\n"
            f"[ssh_connection]\nssh_args = -o ControlMaster=auto -o ControlPersist=60s\n"
            f"control_path_dir = {work / 'cp'}\ncontrol_path = %(directory)s/%%C\n")

    # ---------------------------------------------------------- profile

    def profile(self, bed: Testbed) -> dict[str, Any]:
        py_spy = self.venv / "bin" / "py-spy"
        raw = self.tmp / "profile.txt"
        # --gil: only samples of the thread holding the GIL, i.e. Python running (a sampler counts wall time
        # of any thread not idle, and on a busy machine idle detection misses blocked pool threads)
        cmd = [str(py_spy), "record", "--format", "raw", "--nolineno", "--rate", "100", "--subprocesses", "--gil",
               "-o", str(raw), "--", self.python, "-m", "fleet", "reset", "-i", str(bed.inventory), "-g", "all",
               "-y", "--json", "--log-dir", str(self.tmp / "logs-profile")]
        m = self.measure("profile", cmd)
        if not raw.exists():
            return {"error": Path(m["stderr_path"]).read_text()[-1000:]}
        stamp = self.args.stamp
        RESULTS.mkdir(parents=True, exist_ok=True)
        kept = RESULTS / f"{stamp}-profile-{bed.count}.folded"
        shutil.copy(raw, kept)
        return {"folded": str(kept), "wall_s": m["wall_s"], **summarise_profile(raw.read_text())}


def _pdsh_script(work: Path, bed: Testbed, commands: Commands, rep: int) -> tuple[list[str], int, int]:
    """run.sh's lines: per step, one backgrounded pdsh per distinct command line (its hosts in a file in
    `work`), then `wait`; and how many pdsh invocations and host commands that makes."""
    steps = max((len(v) for v in commands.values()), default=0)
    script = ["#!/bin/bash", "cd " + shlex.quote(str(work))]
    invocations = total = 0
    for j in range(steps):
        groups: dict[str, list[str]] = defaultdict(list)
        for name, events in commands.items():
            events = ordered(events)
            if j < len(events):
                owner = replay_owner(events, "pdsh", rep)
                groups[generic_line(events, j, str(bed.nodes[name].root), owner)].append(bed.addrs[name])
        for g, (line, addrs) in enumerate(groups.items()):
            hosts_file = work / f"hosts-{j}-{g}"
            hosts_file.write_text("\n".join(addrs) + "\n")
            total += len(addrs)
            invocations += 1
            script.append(f"pdsh -R ssh -l root -t 120 -f {len(addrs)} -w ^{hosts_file.name} "
                          f"{shlex.quote(line)} >out-{j}-{g} 2>err-{j}-{g} &")
        script.append("wait")
    return script, invocations, total


def _ansible_failed(stdout: str, count: int) -> int:
    """Hosts the PLAY RECAP says were unreachable or failed, plus those missing from it."""
    failed = 0
    recap = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
    seen = 0
    for line in stdout.splitlines():
        match = recap.match(line)
        if match:
            seen += 1
            failed += int(match.group(4)) > 0 or int(match.group(5)) > 0
    return failed + (count - seen)
