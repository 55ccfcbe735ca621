"""How many file descriptors a run asks for: a socket and a log file a host, within the hard limit."""

from __future__ import annotations

import resource

from fleet.app.run import FDS_RESERVE, fd_limit_wanted

INF = resource.RLIM_INFINITY


def test_enough_already_asks_nothing() -> None:
    assert fd_limit_wanted(1024, 4096, 100) is None
    assert fd_limit_wanted(INF, INF, 100_000) is None


def test_512_hosts_pass_the_common_1024_soft_limit() -> None:
    assert fd_limit_wanted(1024, 524288, 512) == 2 * 512 + FDS_RESERVE


def test_never_above_the_hard_limit() -> None:
    assert fd_limit_wanted(1024, 2048, 5000) == 2048
    assert fd_limit_wanted(1024, INF, 5000) == 2 * 5000 + FDS_RESERVE
