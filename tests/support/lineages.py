"""One node's process tree as the lineage probe reads it: sshd sessions, daemons and their children, a user manager,
fleet's own probe chain and a Slurm job, for the protection and holder rules."""

from __future__ import annotations

from fleet.node.probes.lineage import Lineage, ProcStat

# The node: init (1), sshd (700) > sshd-session (710) > bash (720) > python3 (4242, alice's job);
# nvidia-persistenced (12) > helper (13) > its worker (14); nv-hostengine (20, not a holder here);
# a user manager `systemd --user` (900) > a user service (910); fleet's probe (990) > timeout (980) >
# the job that ran fleet (970, a holder) > bash (960) > sshd-session (711) > sshd (700).
STATS = {
    1: ProcStat(pid=1, ppid=0, comm="systemd"),
    700: ProcStat(pid=700, ppid=1, comm="sshd"),
    710: ProcStat(pid=710, ppid=700, comm="sshd-session"),
    720: ProcStat(pid=720, ppid=710, comm="bash"),
    4242: ProcStat(pid=4242, ppid=720, comm="python3"),
    12: ProcStat(pid=12, ppid=1, comm="nvidia-persiste"),
    13: ProcStat(pid=13, ppid=12, comm="helper"),
    14: ProcStat(pid=14, ppid=13, comm="worker"),
    20: ProcStat(pid=20, ppid=1, comm="nv-hostengine"),
    21: ProcStat(pid=21, ppid=20, comm="dcgm-job"),
    900: ProcStat(pid=900, ppid=1, comm="systemd"),
    910: ProcStat(pid=910, ppid=900, comm="python3"),
    711: ProcStat(pid=711, ppid=700, comm="sshd-session"),
    960: ProcStat(pid=960, ppid=711, comm="bash"),
    970: ProcStat(pid=970, ppid=960, comm="bench"),
    980: ProcStat(pid=980, ppid=970, comm="timeout"),
    990: ProcStat(pid=990, ppid=980, comm="awk"),
    800: ProcStat(pid=800, ppid=1, comm="slurmstepd"),
    810: ProcStat(pid=810, ppid=800, comm="bash"),
    820: ProcStat(pid=820, ppid=810, comm="torchrun"),
    830: ProcStat(pid=830, ppid=820, comm="python3"),
}
LINEAGE = Lineage(STATS, own=(990, 980, 970, 960, 711, 700, 1))
