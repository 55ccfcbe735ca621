"""SIGHUP under `--slurm`, over a real slurmctld: the operator's terminal closed mid-run; the drained nodes are
still released (left drained with fleet's reason: the run was cut) and the run exits 129. A hang-up relayed
again (the shell, then the kernel) is one event: it never abandons the release as a third Ctrl-C would."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from support.slurm_fleet import cluster as cluster  # the fixtures: four busy nodes, their Slurm
from support.slurm_fleet import finish, logged, released_as_interrupted, settling, start_cli, stop
from support.slurm_fleet import sim as sim
from support.waits import until

from fleet.engine.interrupts import HANGUP_LINE
from fleet.sim.fleetsim import SimFleet
from fleet.sim.slurmcluster import SlurmCluster


@pytest.mark.parametrize("sim", [{"linger_s": 60.0}], indirect=True)  # settle still waits at the hang-up
async def test_a_hang_up_mid_run_still_releases_the_nodes_and_exits_129(sim: SimFleet, cluster: SlurmCluster,
                                                                     tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    process, stderr = start_cli(sim, cluster, tmp_path, "--slurm", "--drain-wait", "4")
    try:
        await until(lambda: settling(logs), "both hosts reached settle")
        with cluster.frozen():  # the release waits on slurmctld while the hang-up is relayed again
            process.send_signal(signal.SIGHUP)
            await until(lambda: logged(logs, "sim1", "slurm_release") or logged(logs, "sim1", "slurm_error"),
                        "the release began", 30)
            process.send_signal(signal.SIGHUP)
            process.send_signal(signal.SIGHUP)
            process.send_signal(signal.SIGINT)  # the operator's: the second signal, were the hang-ups one
            await until(lambda: "still releasing" in stderr.read_text(), "the SIGINT was answered", 30)
        document = await finish(process)
    finally:
        stop(process)
    said = stderr.read_text()
    assert process.returncode == 129, said
    assert said.count(HANGUP_LINE) == 1 and "stopped releasing" not in said, said
    released_as_interrupted(document, cluster)


@pytest.mark.parametrize("sim", [{"linger_s": 60.0}], indirect=True)  # settle still waits at the first signal
async def test_a_hang_up_after_two_interrupts_never_abandons_the_release(sim: SimFleet, cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    """Ctrl-C, Ctrl-C, then the terminal closes: the third signal is a hang-up, which never abandons the release
    (only a third SIGINT or SIGTERM does). The nodes are released as for an interrupted run; exit 130 (the run was
    cut by SIGINT)."""
    logs = tmp_path / "logs"
    process, stderr = start_cli(sim, cluster, tmp_path, "--slurm", "--drain-wait", "4")
    try:
        await until(lambda: settling(logs), "both hosts reached settle")
        with cluster.frozen():  # the release waits on slurmctld while the signals come
            process.send_signal(signal.SIGINT)
            await until(lambda: logged(logs, "sim1", "slurm_release") or logged(logs, "sim1", "slurm_error"),
                        "the release began", 30)
            process.send_signal(signal.SIGINT)
            await until(lambda: "still releasing" in stderr.read_text(), "the second SIGINT was answered", 30)
            process.send_signal(signal.SIGHUP)
            await until(lambda: HANGUP_LINE in stderr.read_text(), "the hang-up was said", 30)
        document = await finish(process)
    finally:
        stop(process)
    said = stderr.read_text()
    assert process.returncode == 130, said
    assert "stopped releasing" not in said, said
    released_as_interrupted(document, cluster)
