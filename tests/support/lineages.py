"""One node's process tree as the lineage probe reads it: sshd sessions, daemons and their children, a user manager,
fleet's own probe chain and a Slurm job, for the protection and holder rules."""

from __future__ import annotations

from fleet.node.probes.lineage import Lineage, ProcStat

# The node: init (1), sshd (700) > sshd-session (710) > bash (720) > python3 (4242, alice's job);
# nvidia-persistenced (12) > helper (13) > its worker (14); nv-hostengine (20, not a holder here);
# a user manager `systemd --user` (900) > a user service (910); fleet's probe (990) > timeout (980) >
# the job that ran fleet (970, a holder) > bash (960) > sshd-session (711) > sshd (700).
STATS = {
    1: ProcStat(1, 0, "systemd"),
    700: ProcStat(700, 1, "sshd"),
    710: ProcStat(710, 700, "sshd-session"),
    720: ProcStat(720, 710, "bash"),
    4242: ProcStat(4242, 720, "python3"),
    12: ProcStat(12, 1, "nvidia-persiste"),
    13: ProcStat(13, 12, "helper"),
    14: ProcStat(14, 13, "worker"),
    20: ProcStat(20, 1, "nv-hostengine"),
    21: ProcStat(21, 20, "dcgm-job"),
    900: ProcStat(900, 1, "systemd"),
    910: ProcStat(910, 900, "python3"),
    711: ProcStat(711, 700, "sshd-session"),
    960: ProcStat(960, 711, "bash"),
    970: ProcStat(970, 960, "bench"),
    980: ProcStat(980, 970, "timeout"),
    990: ProcStat(990, 980, "awk"),
    800: ProcStat(800, 1, "slurmstepd"),
    810: ProcStat(810, 800, "bash"),
    820: ProcStat(820, 810, "torchrun"),
    830: ProcStat(830, 820, "python3"),
}
LINEAGE = Lineage(STATS, own=(990, 980, 970, 960, 711, 700, 1))
