"""Batches: several probes in one remote command, each still its own answer (fleet.transport.batch, Node.batch).

The framing is checked against the real batch.sh run by the real /bin/sh (hostile arguments, a section that
hangs, output cut), the scripted transport's fake against the same bytes, and Node.batch over the scripted
transport: one probe's failure never spoils another's answer.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.typing import EventDict

from fleet.inventory.host import Connection, Host
from fleet.model.errors import CommandTimeout, StepFailed
from fleet.model.report import StepName, StepStatus
from fleet.node.bounds import Bound
from fleet.node.budget import TimeBudget
from fleet.node.node import Node, hang_line, is_remote_command
from fleet.node.probe import ZERO, Probe
from fleet.transport import batch
from fleet.transport.base import CommandResult
from fleet.transport.scripted import Reply, ScriptedTransport

HOSTILE = ["it's", '"quoted"', "$(touch /tmp/pwned)", "`id`", "a\nb", "*", "; exit 7", "", "tab\there"]


def run_batch(parts: list[tuple[float, list[str]]],
              tag: str | None = None) -> tuple[str, subprocess.CompletedProcess[str]]:
    tag = tag or batch.new_tag()
    done = subprocess.run(batch.batch_argv(parts), input=batch.batch_input(tag), capture_output=True, text=True,
                          timeout=30, check=False)
    return tag, done


def test_each_section_keeps_its_own_exit_status_and_both_streams() -> None:
    parts = [(5.0, ["echo", "one"]), (5.0, ["sh", "-c", "printf 'no newline'; echo oops >&2; exit 3"]),
             (5.0, ["printf", ""]), (5.0, ["sh", "-c", "printf 'two\\n\\n'"])]
    tag, done = run_batch(parts)
    assert batch.sections(tag, 4, done.stdout, done.stderr) == [
        batch.Section(exit_status=0, stdout="one\n", stderr=""),
        batch.Section(exit_status=3, stdout="no newline", stderr="oops\n"),
        batch.Section(exit_status=0, stdout="", stderr=""),
        batch.Section(exit_status=0, stdout="two\n\n", stderr=""),
    ]


def test_every_argument_arrives_as_one_word_whatever_it_holds(tmp_path: Path) -> None:
    """Quoted once by fleet (shlex.join), read back by the node's eval: nothing in an argument is run."""
    tag, done = run_batch([(5.0, ["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *HOSTILE])])
    (section,) = batch.sections(tag, 1, done.stdout, done.stderr)
    assert section is not None and json.loads(section.stdout) == HOSTILE
    assert not Path("/tmp/pwned").exists()


def test_a_hung_section_ends_the_batch_and_the_rest_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tag, done = run_batch([(5.0, ["echo", "before"]), (0.3, ["sleep", "30"]), (5.0, ["touch", str(marker)])])
    before, hung, after = batch.sections(tag, 3, done.stdout, done.stderr)
    assert before == batch.Section(exit_status=0, stdout="before\n", stderr="")
    assert hung is not None and hung.exit_status == 124
    assert after is None and not marker.exists()


def test_output_cut_inside_a_section_is_no_answer_never_an_empty_one() -> None:
    tag, done = run_batch([(5.0, ["echo", "a"]), (5.0, ["seq", "1", "5000"]), (5.0, ["echo", "c"])])
    cut = done.stdout[: done.stdout.index("\n2500\n")]
    assert [s is not None for s in batch.sections(tag, 3, cut, done.stderr)] == [True, False, False]


def test_no_output_can_forge_a_frame() -> None:
    """A section printing what looks like frames of another tag (or a guessed one) is just its output."""
    tag = batch.new_tag()
    fake = batch.new_tag()
    _, done = run_batch([(5.0, ["printf", f"{fake} 0\nx\n{fake} 0 0\n{fake} 1\n"]), (5.0, ["echo", "real"])], tag)
    first, second = batch.sections(tag, 2, done.stdout, done.stderr)
    assert first == batch.Section(exit_status=0, stdout=f"{fake} 0\nx\n{fake} 0 0\n{fake} 1\n", stderr="")
    assert second == batch.Section(exit_status=0, stdout="real\n", stderr="")


def test_the_fakes_frame_what_batch_sh_prints_byte_for_byte() -> None:
    parts = [(5.0, ["sh", "-c", "printf 'a\\nb'; printf 'e' >&2; exit 2"]), (5.0, ["echo", "x"])]
    tag, done = run_batch(parts)
    timeless = re.sub(rf"^({tag} \d+ \d+) \d+$", r"\1", done.stdout, flags=re.MULTILINE)  # the run time varies
    assert timeless != done.stdout  # batch.sh said how long each section ran
    assert batch.frame(tag, [(2, "a\nb", "e"), (0, "x\n", "")]) == (timeless, done.stderr)


def test_unbatch_reads_back_what_batch_argv_built() -> None:
    tag = batch.new_tag()
    argv = batch.batch_argv([(2.5, ["nvidia-smi", "-q"]), (10.0, ["echo", *HOSTILE])])
    assert batch.unbatch(argv) == [(2.5, ["nvidia-smi", "-q"]), (10.0, ["echo", *HOSTILE])]
    assert batch.tag_of(batch.batch_input(tag)) == tag and batch.tag_of(None) is None
    assert batch.unbatch(["sh", "-c", "true"]) is None


def test_a_batch_is_bounded_by_its_sections_one_after_the_other() -> None:
    assert batch.batch_timeout([10.0, 5.0]) == 10 + 1 + 5 + 1 + batch.BATCH_MARGIN_S
    with pytest.raises(ValueError, match="bad batch tag"):
        batch.batch_input("x; rm -rf /")


# --- frames nobody else can write --------------------------------------------------------------------------


def test_the_tag_is_never_in_the_argv_and_no_tag_on_stdin_runs_nothing(tmp_path: Path) -> None:
    """Any user on the node reads /proc/PID/cmdline: the tag is on stdin only. A batch given no tag runs none
    of its sections and frames nothing: each is no answer."""
    tag = batch.new_tag()
    marker = tmp_path / "ran"
    argv = batch.batch_argv([(5.0, ["touch", str(marker)])])
    assert not any(tag in word for word in argv)
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and done.stdout == "" and not marker.exists()
    assert batch.sections(tag, 1, done.stdout, done.stderr) == [None]


def test_a_section_that_prints_the_tag_itself_is_no_answer() -> None:
    """A stolen tag (were it readable) printed as a whole forged close and the next section's frames: which
    section forged them cannot be told, so no section of that batch is an answer; nor when the tag is met
    anywhere inside a section."""
    tag = batch.new_tag()
    forged = f"x\n{tag} 0 0\n{tag} 1\nforged\n{tag} 1 0\n"
    _, done = run_batch([(5.0, ["printf", forged]), (5.0, ["echo", "real"])], tag)
    assert batch.sections(tag, 2, done.stdout, done.stderr) == [None, None]
    _, done = run_batch([(5.0, ["echo", "first"]), (5.0, ["printf", f"a {tag} b"]), (5.0, ["echo", "z"])], tag)
    assert batch.sections(tag, 3, done.stdout, done.stderr) == [None, None, None]


def test_what_came_before_the_batch_ran_is_not_its_output() -> None:
    """sshd says "Could not chdir to home directory" on stderr before the command runs; a login shell's rc
    file may print too: lines before the first frame belong to no section."""
    tag = batch.new_tag()
    out, err = batch.frame(tag, [(0, "a", "e")])
    found = batch.sections(tag, 1, "motd\n" + out, "Could not chdir to home directory /nonexistent\n" + err)
    assert found == [batch.Section(exit_status=0, stdout="a", stderr="e")]


@pytest.mark.parametrize("mangle", [
    pytest.param(lambda out, tag: f"junk {tag}\n" + out, id="the-tag-before-the-first-frame"),
    pytest.param(lambda out, tag: out.replace(f"\n{tag} 0 0\n", f"\n{tag} 0 0\nx\n"), id="text-between"),
    pytest.param(lambda out, tag: out + "trailing\n", id="text-after-the-last"),
    pytest.param(lambda out, tag: out.replace(f"{tag} 1\n", f"{tag} 1\n{tag} 1\n", 1), id="doubled-head"),
    pytest.param(lambda out, tag: out.replace(f"\n{tag} 1 0\n", f"\n{tag} 1 0\n{tag} 1 0\n"), id="doubled-close"),
    pytest.param(lambda out, tag: out.replace(f"\n{tag} 1 0\n", f"\n{tag} 1 0"), id="cut-close"),
])
def test_anything_but_whole_frames_in_order_is_no_answer(mangle: Any) -> None:
    """Only what stands before the first frame (written before the batch ran: sshd, a login shell) is not
    the batch's; the tag may not stand there either."""
    tag = batch.new_tag()
    out, err = batch.frame(tag, [(0, "a", ""), (0, "b", "")])
    found = batch.sections(tag, 2, mangle(out, tag), err)
    whole = [batch.Section(exit_status=0, stdout="a", stderr=""), batch.Section(exit_status=0, stdout="b", stderr="")]
    assert found != whole
    assert all(s is None or s in whole for s in found)


# --- Node.batch over the scripted transport -------------------------------------------------------


def probe(*argv: str, root: bool = False, hang: str | None = None, ok: frozenset[int] | None = ZERO) -> Probe[str]:
    return Probe(argv=tuple(argv), what=argv[0], parse=lambda out: out.strip(), needs_root=root, ok_exits=ok, hang=hang)


def node_over(script: list[tuple[tuple[str, ...], Any]], *, become: bool = False,
              events: list[dict[str, Any]] | None = None,
              kind: type[ScriptedTransport] = ScriptedTransport) -> tuple[Node, ScriptedTransport]:
    t = kind(script=script, become=become)
    sink = events if events is not None else []

    def keep(_: Any, name: str, event: EventDict) -> EventDict:
        sink.append({**event, "event": event.get("event", name)})
        raise structlog.DropEvent

    log = structlog.wrap_logger(None, processors=[keep])
    host = Host(name="gpu-01", address="127.0.0.1", command_timeout=5.0, become=become)
    return Node(host, t, log), t


async def test_one_probes_failure_never_spoils_anothers_answer() -> None:
    node, t = node_over([(("good",), Reply(stdout="fine\n")),
                         (("bad",), Reply(stdout="", stderr="no such device\n", exit_status=9))])
    good, bad = probe("good"), probe("bad")
    answers = await node.batch([bad, good], step=StepName.VERIFY)
    assert answers.read(good) == "fine"
    with pytest.raises(StepFailed, match=r"^bad exited 9: no such device$"):
        answers.read(bad)
    assert node.commands == 1 and t.ran == [("bad",), ("good",)]


async def test_a_batch_that_asks_the_same_probe_twice_is_refused_and_runs_nothing() -> None:
    """Probes are values made once and shared (a host's answers are keyed by the probe): the same probe twice in a
    batch would give both the later section's answer, so it is refused before anything runs."""
    node, t = node_over([(("smi",), Reply(stdout="x"))])
    smi = probe("smi")
    with pytest.raises(ValueError, match="the same probe twice"):
        await node.batch([smi, (smi, Bound(1.0, "another bound"))])
    assert node.commands == 0 and t.ran == []


async def test_a_hung_probe_times_out_and_the_ones_after_it_say_they_never_ran() -> None:
    node, _ = node_over([(("smi",), Reply(delay_s=60)), (("after",), Reply(stdout="x"))])
    smi, after = probe("smi", hang="nvidia-smi did not answer within {s} s ({bound})"), probe("after")
    answers = await node.batch([(smi, Bound(0.2, "the test's bound")), after], step=StepName.SETTLE)
    with pytest.raises(StepFailed, match=r"^nvidia-smi did not answer within 0\.2 s \(the test's bound\)$") as caught:
        answers.read(smi)
    assert caught.value.status is StepStatus.TIMEOUT
    with pytest.raises(StepFailed, match=r"^after not run: smi timed out after 0\.2 s \(the test's bound\)$"):
        answers.read(after)
    plain = probe("smi")  # no `hang`: its timeout is the step's to judge, as with Node.ask
    answers = await node.batch([(plain, Bound(0.2, "command_timeout"))])
    with pytest.raises(CommandTimeout, match=r"^smi did not answer within 0\.2 s \(command_timeout\)$"):
        answers.read(plain)


async def test_on_a_become_host_a_batch_goes_through_sudo_only_with_the_probes_that_need_root() -> None:
    node, t = node_over([(("find",), Reply(stdout="a")), (("ps",), Reply(stdout="b")), (("smi",), Reply(stdout="c"))],
                        become=True)
    find, ps, smi = probe("find", root=True), probe("ps", root=True), probe("smi")
    answers = await node.batch([find, smi, ps])
    assert [answers.read(p) for p in (find, ps, smi)] == ["a", "b", "c"]
    assert node.commands == 2
    sudo = {argv for argv, wire in zip(t.ran, t.sent, strict=True) if "sudo" in wire}
    assert sudo == {("find",), ("ps",)}


async def test_a_batch_logs_its_wire_command_once_and_each_section_as_a_command_that_names_it() -> None:
    events: list[dict[str, Any]] = []
    node, _ = node_over([(("one",), Reply(stdout="1\n")), (("two",), Reply(stdout="", stderr="e\n", exit_status=4))],
                        events=events)
    await node.batch([probe("one"), probe("two", ok=None)], step=StepName.DRAIN)
    (wire,) = [e for e in events if e["event"] == "batch"]
    sections = [e for e in events if e["event"] == "command"]
    assert wire["argv"][:4] == ["sh", "-c", batch.PROGRAM, "fleet-batch"] and wire["sections"] == 2
    assert [(s["argv"], s["exit_status"], s["stdout"], s["stderr"], s["batch"]) for s in sections] == [
        (["one"], 0, "1\n", "", wire["batch"]), (["two"], 4, "", "e\n", wire["batch"])]
    assert [e["event"] for e in events if is_remote_command(e)] == ["batch"]


async def test_a_section_cut_at_the_output_bound_is_unreadable_not_a_timeout_nor_empty() -> None:
    """The transport keeps 1 MiB of a command's output: a section cut there has no closing frame. It is no
    answer (unreadable, the step fails), and not called a hang: nothing timed out."""

    class Clipped(ScriptedTransport):
        async def run(self, argv: Any, *, timeout: float, privileged: bool = False,
                  stdin: str | None = None) -> Any:
            result = await super().run(argv, timeout=timeout, privileged=privileged, stdin=stdin)
            cut = result.stdout.index("\nhuge") + 5  # inside the second section's output
            return dataclasses.replace(result, stdout=result.stdout[:cut] + "... [99 characters cut]")

    node, _ = node_over([(("small",), Reply(stdout="ok\n")), (("big",), Reply(stdout="huge" * 10 + "\n"))],
                        kind=Clipped)
    small, big = probe("small"), probe("big", hang="big did not answer within {s} s")
    answers = await node.batch([small, big])
    assert answers.read(small) == "ok"
    with pytest.raises(StepFailed, match=r"^unreadable big: no complete answer: .*output was cut") as caught:
        answers.read(big)
    assert caught.value.status is StepStatus.FAILED


# --- what happened, said as it happened ------------------------------------------------------

# A command the kernel's OOM killer ends: SIGKILL from outside, long before its bound.
OOM = ["sh", "-c", "echo partial; kill -KILL $$"]


def test_a_section_killed_before_its_bound_is_no_hang_and_the_next_one_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tag, done = run_batch([(30.0, OOM), (5.0, ["touch", str(marker)])])
    killed, after = batch.sections(tag, 2, done.stdout, done.stderr)
    assert killed is not None and killed.exit_status == 137 and killed.stdout == "partial\n"
    assert killed.ran_s is not None and killed.ran_s < 30
    assert not batch.bound_fired(killed.exit_status, killed.ran_s, 30.0)
    assert after == batch.Section(exit_status=0, stdout="", stderr="") and marker.exists()


def test_a_section_that_ignores_sigterm_past_its_bound_is_a_hang_that_ends_the_batch(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tag, done = run_batch([(0.3, ["sh", "-c", "trap '' TERM; sleep 30"]), (5.0, ["touch", str(marker)])])
    hung, after = batch.sections(tag, 2, done.stdout, done.stderr)
    assert hung is not None and hung.exit_status == 137  # SIGTERM ignored: timeout's SIGKILL a second later
    assert hung.ran_s is not None and hung.ran_s >= 0.3 and batch.bound_fired(137, hung.ran_s, 0.3)
    assert after is None and not marker.exists()


@pytest.mark.parametrize(("status", "ran_s", "fired"), [
    (124, 0.1, True), (124, None, True), (137, 29.9, False), (137, 30.0, True), (137, 31.2, True),
    (137, None, True),  # a node that cannot say how long: the bound's, as before
    (0, 99.0, False), (9, None, False),
])
def test_whose_the_end_of_a_section_was(status: int, ran_s: float | None, fired: bool) -> None:
    assert batch.bound_fired(status, ran_s, 30.0) is fired


def local_node(events: list[dict[str, Any]]) -> Node:
    """A Node over the local transport: the real batch.sh, the real `timeout`, real processes."""
    from fleet.transport.local import LocalTransport

    def keep(_: Any, name: str, event: EventDict) -> EventDict:
        events.append({**event, "event": event.get("event", name)})
        raise structlog.DropEvent

    host = Host(name="self", address="localhost", connection=Connection.LOCAL, command_timeout=5.0)
    return Node(host, LocalTransport(host), structlog.wrap_logger(None, processors=[keep]))


async def test_a_probe_killed_by_signal_9_says_so_and_the_next_read_still_answers() -> None:
    events: list[dict[str, Any]] = []
    node = local_node(events)
    smi = probe(*OOM, hang="nvidia-smi did not answer within {s} s ({bound}): driver may be wedged")
    after = probe("echo", "after")
    answers = await node.batch([smi, after], step=StepName.VERIFY)
    with pytest.raises(StepFailed, match=r"^sh was killed by signal 9 before its bound \(out of memory\?\)$") as caught:
        answers.read(smi)
    assert caught.value.status is StepStatus.FAILED  # not a timeout
    assert answers.read(after) == "after"
    section = next(e for e in events if e["event"] == "command" and e["argv"] == OOM)
    assert section["exit_status"] == 137 and section["timed_out"] is False


async def test_a_probe_killed_by_signal_9_alone_is_no_timeout_either() -> None:
    node = local_node([])
    with pytest.raises(StepFailed, match=r"^sh was killed by signal 9 before its bound \(out of memory\?\)$"):
        await node.ask(probe(*OOM, hang="{s} {bound}: driver may be wedged"), step=StepName.VERIFY)


async def test_sections_the_steps_budget_cut_say_so_never_that_they_hung_for_their_bound() -> None:
    events: list[dict[str, Any]] = []
    node = local_node(events)
    slow, never = probe("sleep", "20", hang="{s} {bound}: driver may be wedged"), probe("echo", "never")
    answers = await node.batch([slow, never], step=StepName.VERIFY, budget=TimeBudget(window=0.0, slack=1.5))
    with pytest.raises(StepFailed, match=r"^sleep cut: verify's time ran out \(what was left of its "
                                         r"1\.5 s budget: [\d.]+ s\)$") as cut:
        answers.read(slow)
    with pytest.raises(StepFailed, match=r"^echo not run: verify's time ran out \(what was left of its 1\.5 s "
                                         r"budget: [\d.]+ s\)$") as not_run:
        answers.read(never)
    assert cut.value.status is not_run.value.status is StepStatus.TIMEOUT
    assert "wedged" not in str(cut.value)


def test_a_bound_the_budget_set_is_no_hang_of_the_commands_own() -> None:
    smi = probe("nvidia-smi", hang="nvidia-smi did not answer within {s} s ({bound}): driver may be wedged")
    own = CommandTimeout(CommandResult(argv=("nvidia-smi",), exit_status=124, stdout="", stderr="", duration_s=30.0),
                         30.0, "nvidia-smi's bound")
    left = CommandTimeout(CommandResult(argv=("nvidia-smi",), exit_status=124, stdout="", stderr="", duration_s=4.0),
                          4.0,
                          "what was left of verify's 240 s budget")
    assert hang_line(smi, own) == "nvidia-smi did not answer within 30 s (nvidia-smi's bound): driver may be wedged"
    assert hang_line(smi, left) == ("nvidia-smi did not answer within 4 s (what was left of verify's 240 s budget): "
                                    "the step's time ran out")
