"""The probes fleet runs on a node: each module builds argvs, parses their output purely, and declares its probes.

* `smi`: nvidia-smi GPU and compute-app queries, null values, why nvidia-smi failed;
* `health` (+ `asked`, `q_sections`): GPU health facts as the table of GPU facts asks them: `--query-gpu`'s CSV,
  `-q`'s GPU sections;
* `procs`: the holder scan (who holds the device files), ps, exe, alive, kill;
* `units`: systemd unit state, stop, kill, Restart=, and the unit a process runs in;
* `lineage` (+ `lineage.awk`): processes' ancestors and fleet's own process chain;
* `jobs`: the job a process's cgroup names, by each registered scheduler's layout (`fleet.node.jobs`);
* `parse`: `ProbeParseError` and the line helpers every parser shares.

Nothing here does I/O: an argv is a list (no shell, no quoting: the transport quotes once), a parser goes
from text to frozen dataclasses, and malformed output raises `ProbeParseError` naming the line. Each probe
(`fleet.node.probe.Probe`) says whether it needs root and which exit statuses are answers.
"""
