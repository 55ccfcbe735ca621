"""The node side of `--via srun` and its framing, without Slurm: messages cross in short lines, whole or not at
all; a node refuses a controller of another version and touches nothing."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest

from fleet.inventory.host import Connection, Host
from fleet.inventory.load import host_vars
from fleet.slurm import frames
from fleet.slurm.frames import Assembler, FrameError
from fleet.slurm.noderun import host_of, node_run
from fleet.slurm.variables import SlurmVariables
from fleet.version import __version__


def messages_through(lines: list[str]) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    assembler, got, noise = Assembler(), [], []
    for line in lines:
        try:
            whole = assembler.feed(line)
        except FrameError as exc:
            noise.append(str(exc))
            continue
        if whole is not None:
            got.append(whole)
    return got, noise


def test_every_frame_fits_a_srun_line_and_messages_come_back_whole() -> None:
    big = {"log": {"event": "command", "stdout": "é" + "x" * 5000}}
    lines = list(frames.frames("gpu-b01", 1, big))
    assert len(lines) > 1 and all(len(line.encode()) + 1 < 1024 for line in lines)
    assert messages_through(lines) == ([("gpu-b01", big)], [])


def test_frames_of_many_nodes_interleaved_by_line_are_reassembled_per_node() -> None:
    sent = {f"n{i}": [{"i": k, "pad": "y" * (k * 700)} for k in range(5)] for i in range(4)}
    per_node = {n: [line for k, m in enumerate(ms, 1) for line in frames.frames(n, k, m)] for n, ms in sent.items()}
    merged: list[str] = []
    rng = random.Random(7)
    while any(per_node.values()):  # srun keeps each node's order, not the order between nodes
        node = rng.choice([n for n, ls in per_node.items() if ls])
        merged.append(per_node[node].pop(0))
    got, noise = messages_through(merged)
    assert noise == []
    for node, ms in sent.items():
        assert [m for n, m in got if n == node] == ms


def test_a_cut_or_foreign_line_is_noise_never_a_message() -> None:
    lines = list(frames.frames("n1", 1, {"report": {"status": "clean"}, "pad": "z" * 2000}))
    got, noise = messages_through([lines[0], "srun: error: n2: task 1: Exited", lines[2]])
    assert got == [] and len(noise) == 2  # the foreign line, then part 3 without part 2
    with pytest.raises(FrameError):
        Assembler().feed("@fleet n1 1 2 1 {}")


def test_host_variables_round_trip_to_a_local_host() -> None:
    host = Host(name="gpu-b01", address="10.0.0.1", services=("sglang.service",), gpus=8,
                plug_variables=(("slurm", SlurmVariables(node="b01")),))
    again = host_of("gpu-b01", json.loads(json.dumps(host_vars(host))))
    assert again == Host(**{**host.__dict__, "connection": Connection.LOCAL})


async def test_a_node_refuses_a_controller_of_another_version() -> None:
    out = io.StringIO()
    code = await node_run({"fleet_version": "0.0.1", "run_id": "r", "hosts": {"n1": {"name": "h1", "vars": {}}}},
                          "n1", out)
    got, noise = messages_through(out.getvalue().splitlines())
    assert code == 1 and noise == [] and len(got) == 1
    report = got[0][1]["report"]
    assert report["status"] == "failed" and f"fleet on n1 is {__version__}" in report["error"]
    assert report["steps"] == [] and got[0][1]["fleet_version"] == __version__


async def test_a_node_the_controller_sent_nothing_for_touches_nothing() -> None:
    out = io.StringIO()
    code = await node_run({"fleet_version": __version__, "run_id": "r", "hosts": {}}, "n9", out)
    (node, message), = messages_through(out.getvalue().splitlines())[0]
    assert code == 1 and node == "n9" and "sent no host for Slurm node n9" in message["report"]["error"]
