"""report.html: a run at a glance, for the person who decides in the morning whether the benchmark can start.

`page(run)` is pure: a run's report in (`RunPage`: the `RunReport` as the run holds it, or as `fleet.model.codec`
reads a summary.json back), one self-contained HTML page out: inline CSS and SVG, no script, no font, nothing from
the network (its Content-Security-Policy forbids every load), every string from the report escaped. It shows the
outcome folded as the summary folds it (largest group first), a rack grid (a row per host, a cell per GPU coloured
by its memory before and after the reset, outlined where a health finding fails or warns; each cell's title gives
the numbers), a timeline (a row per host, its steps as bars on one time axis, sorted by end time) and, per host,
the error, what was killed and kept, the health findings, Slurm before and after, and the path of its JSONL log.

The report keeps each step's duration and each host's start in the run (`start_s`): a host's bars are laid end to
end from there, the time before drain (connect, lock, baselines) first, and a wait for its node's Slurm jobs
(`slurm.waited_s`) is its own bar ending where the host started. A report without `start_s` (an older fleet's
summary.json, a page built from the history) has each host's bars start at the host's own start instead, and the
page says so. `write_page` is the I/O: report.html beside summary.json, atomically.
"""

from __future__ import annotations

import html
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet.inventory.nodesets import fold
from fleet.model.report import Finding, GpuReport, HostFinding, HostReport, Level, RunReport, StepStatus
from fleet.node.jobs import job_sides
from fleet.report import uniform
from fleet.report.html_style import CSS
from fleet.report.render import error_shape, fold_errors
from fleet.text import printable

REPORT_HTML = "report.html"
STATUS_ORDER = ("clean", "failed", "unreachable", "skipped", "planned")
STEPS = ("drain", "kill", "settle", "verify")
# Memory buckets of a grid cell: (class, the most MiB it takes, the legend's words).
BUCKETS = (("m0", 16, "≤ 16 MiB"), ("m1", 1024, "≤ 1 GiB"), ("m2", 16384, "≤ 16 GiB"), ("m3", 49152, "≤ 48 GiB"),
           ("m4", None, "> 48 GiB"))
TICKS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
BAR_UNITS = 1000  # a timeline row's SVG width in user units; the axis spans [0, extent] seconds
NOT_ON_RECORD = "not on record"  # the status of a target a page built from the history has no outcome of
NO_OUTCOME = "the history has no outcome of this host in this run"

Host = HostReport | None  # a host on the page; None: a target not on record
Hosts = Mapping[str, Host]


@dataclass(frozen=True)
class RunPage:
    """What report.html shows of a run: its report and the fleet version that wrote it. A run built from its
    history (no summary.json: killed, or still going) has `ended` False when its end is not on record, the targets
    not on record (`not_on_record`, shown after the hosts that are) and a `note` saying so."""

    report: RunReport
    fleet_version: str
    ended: bool = True
    not_on_record: tuple[str, ...] = ()
    note: str | None = None
    rack: uniform.Rack | None = None  # `uniform.rack(report.hosts)` when the caller has it

    @property
    def hosts(self) -> dict[str, Host]:
        shown: dict[str, Host] = dict(self.report.hosts)
        for name in self.not_on_record:
            shown.setdefault(name, None)
        return shown


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def mib(value: object) -> str:
    return f"{value} MiB" if isinstance(value, int) else "n/a"


def secs(value: object) -> str:
    return f"{value:.1f} s" if isinstance(value, int | float) else "-"


def status_of(host: Host) -> str:
    return host.status.value if host is not None else NOT_ON_RECORD


def page(run: RunPage, *, log_folder: str | None = None) -> str:
    """The report page of one run. `log_folder` names the run's log folder in each host's log path (else the page's
    own folder: the logs lie beside it)."""
    hosts, report = run.hosts, run.report
    title = f"fleet {report.command} {report.run_id}: {_tally(hosts)}"
    body = [_header(run, hosts), _outcome(hosts), _grid(hosts, run.rack), _timeline(hosts), _details(hosts, log_folder),
            f"<footer>fleet {esc(run.fleet_version)} · built from summary.json · no script, nothing"
            " loaded from the network</footer>"]
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{esc(title)}</title>\n"
            f"<style>{CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_page(folder: Path, run: RunPage) -> Path:
    """Write `folder/report.html` (a temporary file renamed over it: a reader never sees half a page)."""
    path = folder / REPORT_HTML
    temporary = folder / f".{REPORT_HTML}.tmp"
    temporary.write_text(page(run, log_folder=printable(folder)), encoding="utf-8")
    os.replace(temporary, path)
    return path


# --- header and outcome ---------------------------------------------------------------------------------------


def _counts(hosts: Hosts) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for host in hosts.values():
        counts[status_of(host)] += 1
    known = [s for s in STATUS_ORDER if counts.get(s)]
    return {s: counts[s] for s in known + sorted(set(counts) - set(STATUS_ORDER))}


def _tally(hosts: Hosts) -> str:
    return ", ".join(f"{n} {s}" for s, n in _counts(hosts).items()) or "no host"


def _status_class(status: str) -> str:
    return f"s-{status}" if status in STATUS_ORDER else "s-other"


def _header(run: RunPage, hosts: Hosts) -> str:
    counts, report = _counts(hosts), run.report
    good = counts.get("clean", 0) + counts.get("planned", 0)
    verdict = ("no host" if not hosts else f"{len(hosts) - good} of {len(hosts)} hosts not clean"
               if good < len(hosts) else f"all {len(hosts)} hosts {'clean' if counts.get('clean') else 'planned'}")
    badges = "".join(f"<li class=\"badge {_status_class(s)}\" data-status=\"{esc(s)}\" data-count=\"{n}\">{n} {esc(s)}"
                     "</li>" for s, n in counts.items())
    started = report.started_at.replace("T", " ")
    took = secs(report.duration_s) if run.ended else secs(None)
    note = f"<p class=\"note\">{esc(run.note)}</p>" if run.note else ""
    return (f"<header><h1>fleet {esc(report.command)} <span class=\"id\">{esc(report.run_id)}"
            f"</span></h1>\n<p class=\"meta\">started {esc(started)} · took {took} ·"
            f" {len(hosts)} hosts</p>\n<p class=\"verdict {'ok' if good == len(hosts) else 'bad'}\">{esc(verdict)}</p>"
            f"\n<ul class=\"counts\">{badges}</ul>{note}</header>")


def outcome_groups(hosts: Hosts) -> list[tuple[str, str, list[str], str]]:
    """(status, reason, hosts, error folded) per status, reason and shape of error, as the human summary folds
    them (`render.human_lines`); the largest group first."""
    groups: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)
    for name, host in hosts.items():
        error = (host.error or "") if host is not None else NO_OUTCOME
        reason = host.reason.value if host is not None and host.reason else ""
        shape = error_shape(error, name) if error else ""
        groups[(status_of(host), reason, shape)].append((name, error))
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), order.get(kv[0][0], len(order)), kv[0]))
    return [(status, reason, [n for n, _ in members], fold_errors(members) if members[0][1] else "")
            for (status, reason, _), members in ranked]


def _outcome(hosts: Hosts) -> str:
    rows = [f"<tr data-row=\"outcome\" data-count=\"{len(names)}\"><td class=\"num\">{len(names)}</td>"
            f"<td><span class=\"badge {_status_class(status)}\">{esc(status)}</span></td><td>{esc(reason)}</td>"
            f"<td class=\"set\">{esc(fold(names))}</td><td>{esc(error)}</td></tr>"
            for status, reason, names, error in outcome_groups(hosts)]
    return ("<section id=\"outcome\"><h2>Outcome</h2>\n<table class=\"outcome\"><tr><th>hosts</th><th>status</th>"
            "<th>reason</th><th>node set</th><th>error</th></tr>\n" + "\n".join(rows) + "</table></section>")


# --- the rack grid ----------------------------------------------------------------------------------------------

Before = int | None | str  # a GPU's MiB before the reset: a number, unreadable (None), or not read ("")


def bucket(value: object) -> str:
    if not isinstance(value, int):
        return "na"
    return next(name for name, most, _ in BUCKETS if most is None or value <= most)


def gpu_cells(host: HostReport) -> list[tuple[int, Before, GpuReport | None]]:
    """(index, MiB before, the GPU's report after) per GPU: before is the n-th of `memory_before_mib` (a dry run's
    `plan.gpu_memory_mib`), paired with the n-th GPU verify listed (by index)."""
    before: Sequence[int | None] = host.memory_before_mib if host.memory_before_mib is not None else (
        host.plan.gpu_memory_mib if host.plan is not None else ())
    after = sorted(host.gpus, key=lambda g: g.index)
    cells: list[tuple[int, Before, GpuReport | None]] = []
    for n in range(max(len(before), len(after))):
        gpu = after[n] if n < len(after) else None
        cells.append((gpu.index if gpu is not None else n, before[n] if n < len(before) else "", gpu))
    return cells


def _worst(findings: Iterable[Finding | HostFinding]) -> str:
    levels = {f.level for f in findings}
    return " hf" if Level.FAIL in levels else " hw" if Level.WARN in levels else ""


def _amount(value: object) -> str:
    return str(value) if isinstance(value, int) else "n/a"


def _cell(index: int, before: Before, gpu: GpuReport | None, has_before: bool) -> str:
    """A GPU's cell: its title says `gpu 3: 70000 → 0 MiB; settled in 1.2 s; <each health finding>`."""
    after = gpu.memory_used_mib if gpu is not None else None
    findings = gpu.health if gpu is not None else ()
    now = f"{_amount(after)} MiB" if gpu is not None else "not listed after"
    words = [f"gpu {index}: {_amount(before)} → {now}" if has_before else f"gpu {index}: {now}"]
    if gpu is not None and gpu.settle_s is not None:
        words.append(f"settled in {gpu.settle_s} s")
    words += [f"{f.check} {f.level}: {f.detail}" for f in findings]
    halves = (f"<i class=\"b {bucket(before)}\"></i>" if has_before else "") + (
        f"<i class=\"{bucket(after) if gpu is not None else 'gone'}{'' if has_before else ' w'}\"></i>")
    return f"<td class=\"c{_worst(findings)}\" title=\"{esc('; '.join(words))}\">{halves}</td>"


def _model(host: Host) -> str:
    """How many GPUs verify listed, the first one's model and memory: the grid row's hover text."""
    if host is None or not host.gpus:
        return "no GPU listed"
    first = host.gpus[0]
    total = f", {first.memory_total_mib} MiB" if first.memory_total_mib is not None else ""
    return f"{len(host.gpus)} × {first.name or 'GPU'}{total}"


def _grid_row(name: str, host: Host, odd: Sequence[str] = ()) -> str:
    """The host's row; `odd`: why its settings (GPU, fabric manager) make it an odd one out (`fleet.report.uniform`)."""
    cells = gpu_cells(host) if host is not None else []
    has_before = any(b != "" for _, b, _ in cells)
    node = host.health if host is not None else ()
    words = "; ".join(_finding_words(f) for f in node)
    mark = f"<span class=\"mark{_worst(node)}\" title=\"{esc(words)}\">!</span>" if node else ""
    mark += f"<span class=\"odd\" title=\"settings: {esc('; '.join(odd))}\">≠</span>" if odd else ""
    body = ("".join(_cell(i, b, g, has_before) for i, b, g in cells)
            or "<td class=\"none\" colspan=\"64\">no GPU read</td>")  # across the GPU columns, widening none
    status = status_of(host)
    return (f"<tr data-row=\"grid\" data-host=\"{esc(name)}\" data-gpus=\"{len(cells)}\"{' data-odd' if odd else ''}>"
            f"<th title=\""
            f"{esc(_model(host))}\"><a href=\"#h-{esc(name)}\">{esc(name)}</a>{mark}</th><td class=\"st"
            f" {_status_class(status)}\">{esc(status)}</td>{body}</tr>")


def _legend() -> str:
    swatches = "".join(f"<span><i class=\"{name}\"></i>{esc(words)}</span>" for name, _, words in BUCKETS)
    return ("<p class=\"legend\">a cell per GPU, coloured by the memory it used: the thin top strip before the"
            " reset, the body after (a check, or a host with no baseline: the whole cell); hover a cell for its"
            " numbers. " + swatches +
            "<span><i class=\"na\"></i>unreadable</span><span><i class=\"gone\"></i>not listed after</span>"
            "<span><i class=\"m0 hf-s\"></i>health check failed</span><span><i class=\"m0 hw-s\"></i>health warning"
            "</span><span><b class=\"odd\">≠</b> GPU settings or fabric manager unlike the run's other hosts'"
            " (hover it)</span></p>")


def _grid(hosts: Hosts, rack: uniform.Rack | None = None) -> str:
    odd = uniform.odd(hosts, rack)
    rows = "\n".join(_grid_row(name, host, odd.get(name, ())) for name, host in hosts.items())
    return (f"<section id=\"grid\"><h2>GPUs</h2>\n{_legend()}\n<table class=\"grid\"><tr><th>host</th><th>status</th>"
            f"<th colspan=\"64\">GPUs</th></tr>\n{rows}</table></section>")


# --- the timeline -----------------------------------------------------------------------------------------------

Bar = tuple[str, float, float, str]  # (class, start, length, words)


def segments(host: Host) -> list[Bar]:
    """(class, start, length, words) in seconds from the host's start: the time before drain (connect, lock,
    baselines: the host's duration less its steps'), then each step that ran, end to end."""
    if host is None:
        return []
    steps = [s for s in host.steps if s.status is not StepStatus.SKIPPED and s.duration_s]
    spent = sum(s.duration_s for s in steps)
    out = []
    at = max(host.duration_s - spent, 0.0)
    if at > 0:
        out.append(("pre", 0.0, at, f"before drain {at:.2f} s"))
    for step in steps:
        name, length = step.name.value, step.duration_s
        bad = step.status in (StepStatus.FAILED, StepStatus.TIMEOUT)
        kind = "bad" if bad else name if name in STEPS else "other"
        out.append((kind, at, length, f"{name} {step.status.value} {length:.2f} s"))
        at += length
    return out


def job_wait(host: Host) -> float:
    """Seconds the host waited for its node's jobs before it started (its scheduler's `waited_s`); else 0."""
    waited = host.scheduler.waited_s if host is not None and host.scheduler is not None else None
    return waited if waited is not None and waited > 0 else 0.0


def scheduler_title(host: Host) -> str:
    """How the page names the host's scheduler: its node side's title (`Slurm`), else its name."""
    if host is None or host.scheduler is None:
        return ""
    by = host.scheduler.by
    return next((side.title for side in job_sides() if side.name == by), by)


def on_run_axis(hosts: Hosts) -> bool:
    """Whether every host that ran has its start in the run (`start_s`): then the timeline's axis is the run's. A
    report without (an older fleet's summary.json, a page built from the history) has each host's bars start at
    the host's own start."""
    return all(h is not None and h.start_s is not None for h in hosts.values() if segments(h))


def placed(host: Host, run_axis: bool) -> list[Bar]:
    """The host's bars on the timeline's axis: on the run's, its steps from its `start_s`, after its Slurm wait (its
    own bar, `wait`, ending where the host started); else its steps from 0 (no wait: it would lie before 0)."""
    bars = segments(host)
    if not run_axis or not bars or host is None or host.start_s is None:
        return bars
    start = host.start_s
    waited = job_wait(host)
    wait = [("wait", max(start - waited, 0.0), min(waited, start), f"{scheduler_title(host)} wait {waited:.2f} s")
            ] if waited else []
    return wait + [(kind, start + at, length, words) for kind, at, length, words in bars]


def end_of(host: Host, run_axis: bool) -> float:
    """When the host ended on the timeline's axis: its start in the run and its duration (or its duration alone)."""
    if host is None:
        return 0.0
    start = (host.start_s or 0.0) if run_axis else 0.0
    return round(start + host.duration_s, 3)


def tick_step(extent: float) -> float:
    return next((t for t in TICKS_S if extent / t <= 10), TICKS_S[-1])


def timeline_order(hosts: Hosts) -> list[str]:
    """Hosts that ran, by end time (on the run's axis when the report has each host's start, else each host's
    duration); then those that never started, by name."""
    run_axis = on_run_axis(hosts)
    ran = {n for n, h in hosts.items() if segments(h)}
    return (sorted(ran, key=lambda n: (end_of(hosts[n], run_axis), n))
            + sorted(n for n in hosts if n not in ran))


def _bar(host: Host, extent: float, run_axis: bool) -> str:
    scale = BAR_UNITS / extent
    rects = "".join(f"<rect class=\"{kind}\" x=\"{start * scale:.1f}\" width=\"{max(length * scale, 0.5):.1f}\""
                    f" height=\"10\"><title>{esc(words)}</title></rect>" for kind, start, length, words
                    in placed(host, run_axis))
    if not rects:
        waited = job_wait(host)
        why = f" (waited {waited:.1f} s for its {scheduler_title(host)} jobs)" if waited else ""
        return f"<td class=\"bar idle\">not started{why}</td>"
    return (f"<td class=\"bar\"><svg viewBox=\"0 0 {BAR_UNITS} 10\" preserveAspectRatio=\"none\" width=\"100%\""
            f" height=\"12\" data-extent=\"{extent:g}\">{rects}</svg></td>")


def _took(host: Host) -> str:
    return secs(host.duration_s if host is not None else None)


def _timeline(hosts: Hosts) -> str:
    order = timeline_order(hosts)
    run_axis = on_run_axis(hosts)
    longest = max((end_of(h, run_axis) for h in hosts.values()), default=0.0)
    step = tick_step(longest or 1.0)
    extent = step * max(1, -(-longest // step))
    ticks = "".join(f"<span style=\"left:{100 * k * step / extent:.2f}%\">{k * step:g} s</span>"
                    for k in range(round(extent / step) + 1))
    rows = "\n".join(f"<tr data-row=\"timeline\" data-host=\"{esc(n)}\""
                     f"{_start_attribute(hosts[n], run_axis)} data-end=\"{end_of(hosts[n], run_axis):g}\">"
                     f"<th><a href=\"#h-{esc(n)}\">{esc(n)}</a></th>{_bar(hosts[n], extent, run_axis)}"
                     f"<td class=\"num {_status_class(status_of(hosts[n]))}\">{_took(hosts[n])}</td></tr>"
                     for n in order)
    waiting = sorted({scheduler_title(h) for h in hosts.values() if run_axis and job_wait(h) and segments(h)})
    swatches = "".join(f"<span><i class=\"{k}\"></i>{w}</span>" for k, w in (
        *((("wait", f"waiting for its node's {' or '.join(waiting)} jobs"),) if waiting else ()),
        ("pre", "before drain: connect, lock, baselines"), ("drain", "drain"), ("kill", "kill"),
        ("settle", "settle"), ("verify", "verify"), ("bad", "a step that failed or timed out")))
    axis = ("seconds since the run started: each host's bars from its start in the run, end to end" if run_axis else
            "seconds from each host's own start, bars end to end: this report keeps no host's start in the run (an"
            " older fleet's summary.json, or a page built from the history), so waves and job waits are not drawn")
    tick = f"--tick:{100 * step / extent:.4f}%"
    return (f"<section id=\"timeline\" data-layout=\"{'run' if run_axis else 'host'}\"><h2>Timeline</h2>\n"
            f"<p class=\"legend\">{axis}; sorted by end time, so stragglers and a slow wave stand out. {swatches}</p>"
            f"\n{_slowest(hosts, order, run_axis)}<table class=\"timeline\" style=\"{tick}\">"
            f"<tr class=\"axis\"><th></th><td><div class=\"ticks\">{ticks}</div></td><td></td></tr>\n"
            f"{rows}</table></section>")


def _start_attribute(host: Host, run_axis: bool) -> str:
    start = host.start_s if host is not None else None
    return f" data-start=\"{start:g}\"" if run_axis and start is not None and segments(host) else ""


def _slowest(hosts: Hosts, order: Sequence[str], run_axis: bool) -> str:
    ran = [(n, h) for n in order if (h := hosts[n]) is not None and segments(h)]
    if not ran:
        return ""
    name, host = ran[-1]
    longest = max(((s.name.value, s.duration_s or 0) for s in host.steps), key=lambda pair: pair[1], default=None)
    step = f"longest step: {esc(longest[0])} {secs(longest[1])}" if longest else ""
    took_it = secs(host.duration_s)
    when = (f" at {secs(end_of(host, run_axis))} into the run (it took {took_it}{'; ' + step if step else ''})"
            if run_axis else f" after {took_it}{f' ({step})' if step else ''}")
    took = sorted(h.duration_s for _, h in ran)
    return (f"<p class=\"meta\">last to end: <a href=\"#h-{esc(name)}\">{esc(name)}</a>{when}; the median host"
            f" took {secs(took[len(took) // 2])}</p>\n")


# --- per host ---------------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[object]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class=\"{' '.join(('small', cls)).strip()}\"><tr>{head}</tr>{body}</table>" if body else ""


def _finding_words(finding: HostFinding) -> str:
    where = f" at {finding.pci}" if finding.pci else ""
    return f"{finding.check} {finding.level}{where}: {finding.detail}"


def _processes(host: HostReport) -> list[str]:
    killed = _table(("killed pid", "name", "user", "signal"), ((k.pid, k.name, k.user, k.signal) for k in host.killed))
    kept = _table(("kept pid", "name", "why"), ((k.pid, k.name, k.why) for k in host.kept))
    plan = host.plan
    would = _table(("would kill pid", "user", "name", "MiB"), (
        (p.pid, p.user, p.name, mib(p.mib)) for p in (plan.would_kill if plan is not None else ())))
    spared = _table(("would keep pid", "user", "name", "MiB", "why"), (
        (p.pid, p.user, p.name, mib(p.mib), p.kept_because) for p in (plan.kept if plan is not None else ())))
    return [t for t in (killed, kept, would, spared) if t]


def _health(host: HostReport) -> str:
    rows = [(f"gpu {g.index}", f.check, f.level, f.detail) for g in host.gpus for f in g.health]
    rows += [(f"node{' ' + f.pci if f.pci else ''}", f.check, f.level, f.detail) for f in host.health]
    return _table(("where", "check", "level", "finding"), rows, "health")


def _scheduler(host: HostReport) -> str:
    """`slurm gpu-b07: before MIXED, after IDLE` (the scheduler's name first), each reason in parentheses; then its
    jobs, plan and error."""
    slurm = host.scheduler
    if slurm is None:
        return ""
    by = slurm.by

    def state(value: str | None, reason: str | None) -> str:
        return f"{value or 'unknown'}" + (f" ({reason})" if reason else "")

    lines = [f"{by} {slurm.node}: before {state(slurm.state_before, slurm.reason_before)};"
             f" after {state(slurm.state_after, slurm.reason_after)}"]
    if slurm.jobs:
        lines.append("jobs: " + ", ".join(slurm.jobs))
    if slurm.taken_over:
        lines.append(f"{by}: took over the drain of run {slurm.taken_over}")
    lines += [f"{by} {key}: {value}" for key, value in (("plan", slurm.plan), ("error", slurm.error)) if value]
    if slurm.abandoned:
        lines.append(f"{by}: release abandoned at the third interrupt: left drained")
    return "".join(f"<p class=\"slurm\">{esc(line)}</p>" for line in lines)


def _parts(host: HostReport) -> list[str]:
    """The host's detail, but for its error and log: its steps, processes, health findings and Slurm's part."""
    steps = _table(("step", "status", "took", "detail"), (
        (s.name.value, s.status.value, secs(s.duration_s) if s.status is not StepStatus.SKIPPED else "-",
         s.detail or "") for s in host.steps), "steps")
    return [steps, *_processes(host), _health(host), _scheduler(host)]


def _host(name: str, host: Host, log_folder: str | None) -> str:
    status = status_of(host)
    reason = f" {host.reason.value}" if host is not None and host.reason else ""
    error = host.error if host is not None else NO_OUTCOME
    log = f"{log_folder.rstrip('/')}/{name}.jsonl" if log_folder else f"{name}.jsonl"
    parts = [f"<p class=\"err\">{esc(error)}</p>" if error else "", *(_parts(host) if host is not None else ()),
             f"<p class=\"log\">log: <a href=\"{esc(name)}.jsonl\">{esc(log)}</a></p>"]
    opened = "" if status in ("clean", "planned") else " open"
    return (f"<details id=\"h-{esc(name)}\" data-row=\"host\" data-host=\"{esc(name)}\"{opened}><summary>"
            f"<b>{esc(name)}</b> <span class=\"badge {_status_class(status)}\">{esc(status)}</span>{esc(reason)} ·"
            f" {_took(host)}</summary>{''.join(p for p in parts if p)}</details>")


def _details(hosts: Hosts, log_folder: str | None) -> str:
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    names = sorted(hosts, key=lambda n: (status_of(hosts[n]) in ("clean", "planned"),
                                         order.get(status_of(hosts[n]), -1), n))
    return ("<section id=\"hosts\"><h2>Hosts</h2>\n<p class=\"legend\">hosts that did not end clean first, open;"
            " click a host to open or close it.</p>\n" + "\n".join(_host(n, hosts[n], log_folder) for n in names)
            + "</section>")
