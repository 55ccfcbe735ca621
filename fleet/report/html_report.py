"""report.html: a run at a glance, for the person who decides in the morning whether the benchmark can start.

`page(run)` is pure: a run's report in (`RunPage`: the `RunReport` as the run holds it, or as `fleet.model.codec`
reads a summary.json back), one self-contained HTML page out: inline CSS and SVG, no script, no font, nothing from
the network (its Content-Security-Policy forbids every load), every string from the report escaped. It shows the
outcome folded as the summary folds it (largest group first), a rack grid (a row per host, a cell per GPU coloured
by its memory before and after the reset, outlined where a health finding fails or warns; each cell's title gives
the numbers), a timeline (a row per host, its steps as bars on one time axis, sorted by end time) and, per host,
the error, what was killed and kept, the health findings, Slurm before and after, and the path of its JSONL log.
Each host's name, status and bars are worked out once for all parts (`fleet.report.html_rows`, which says what is
escaped); the timeline is `fleet.report.html_timeline`. `write_page` is the I/O: report.html beside summary.json,
atomically.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

from fleet.inventory.nodesets import fold
from fleet.model import uniformity
from fleet.model.report import Finding, GpuReport, HostFinding, HostReport, Level, RunReport, StepStatus
from fleet.report.html_rows import STATUS_ORDER, Escaped, Host, Hosts, Row, esc, rows, secs, status_class, status_of
from fleet.report.html_style import CSS
from fleet.report.html_timeline import BAR_UNITS, timeline
from fleet.report.render import error_shape, fold_errors
from fleet.text import printable

REPORT_HTML = "report.html"
# Memory buckets of a grid cell: (class, the most MiB it takes, the legend's words).
BUCKETS = (("m0", 16, "≤ 16 MiB"), ("m1", 1024, "≤ 1 GiB"), ("m2", 16384, "≤ 16 GiB"), ("m3", 49152, "≤ 48 GiB"),
           ("m4", None, "> 48 GiB"))
NO_OUTCOME = "the history has no outcome of this host in this run"


@dataclass(frozen=True, kw_only=True)
class RunPage:
    """What report.html shows of a run: its report and the fleet version that wrote it. A run built from its
    history (no summary.json: killed, or still going) has `ended` False when its end is not on record, the targets
    not on record (`not_on_record`, shown after the hosts that are) and a `note` saying so."""

    report: RunReport
    fleet_version: str
    ended: bool = True
    not_on_record: tuple[str, ...] = ()
    note: str | None = None
    rack: uniformity.Rack | None = None  # `uniformity.rack(report.hosts)` when the caller has it

    @property
    def hosts(self) -> dict[str, Host]:
        shown: dict[str, Host] = dict(self.report.hosts)
        for name in self.not_on_record:
            shown.setdefault(name, None)
        return shown


__all__ = ["BAR_UNITS", "REPORT_HTML", "RunPage", "outcome_groups", "page", "write_page"]


def mib(value: object) -> str:
    return f"{value} MiB" if isinstance(value, int) else "n/a"


def page(run: RunPage, *, log_folder: str | None = None) -> str:
    """The report page of one run. `log_folder` names the run's log folder in each host's log path (else the page's
    own folder: the logs lie beside it)."""
    hosts, report = run.hosts, run.report
    shown, escaped = rows(hosts), Escaped()
    title = f"fleet {report.command} {report.run_id}: {_tally(hosts)}"
    odd = uniformity.odd(hosts, run.rack)
    body = [_header(run, hosts), _outcome(hosts, odd), _grid(shown, escaped, odd), timeline(shown),
            _details(shown, escaped, log_folder),
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


def _header(run: RunPage, hosts: Hosts) -> str:
    counts, report = _counts(hosts), run.report
    good = counts.get("clean", 0) + counts.get("planned", 0)
    verdict = ("no host" if not hosts else f"{len(hosts) - good} of {len(hosts)} hosts not clean"
               if good < len(hosts) else f"all {len(hosts)} hosts {'clean' if counts.get('clean') else 'planned'}")
    badges = "".join(f"<li class=\"badge {status_class(s)}\" data-status=\"{esc(s)}\" data-count=\"{n}\">{n} {esc(s)}"
                     "</li>" for s, n in counts.items())
    started = report.started_at.replace("T", " ")
    took = secs(report.duration_s) if run.ended else secs(None)
    note = f"<p class=\"note\">{esc(run.note)}</p>" if run.note else ""
    if report.interrupted_by:
        note += (f"<p class=\"note\" data-interrupted=\"{esc(report.interrupted_by)}\">interrupted by"
                 f" {esc(report.interrupted_by)}: the hosts it cut short ended failed, their step in flight"
                 " interrupted; those not started, skipped</p>")
    cut = f" · interrupted by {esc(report.interrupted_by)}" if report.interrupted_by else ""
    return (f"<header><h1>fleet {esc(report.command)} <span class=\"id\">{esc(report.run_id)}"
            f"</span></h1>\n<p class=\"meta\">started {esc(started)} · took {took}{cut} ·"
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


def _outcome(hosts: Hosts, odd: Mapping[str, Sequence[str]]) -> str:
    """The outcome folded, then what else a reader must know of the run: the odd hosts out of the rack compared
    (each with why) and the settings `--restore-settings` gave back (each host's changes)."""
    rows = [f"<tr data-row=\"outcome\" data-count=\"{len(names)}\"><td class=\"num\">{len(names)}</td>"
            f"<td><span class=\"badge {status_class(status)}\">{esc(status)}</span></td><td>{esc(reason)}</td>"
            f"<td class=\"set\">{esc(fold(names))}</td><td>{esc(error)}</td></tr>"
            for status, reason, names, error in outcome_groups(hosts)]
    notes = [f"<li data-note=\"odd\">{esc(name)}: settings unlike the others': {esc('; '.join(why))}</li>"
             for name, why in odd.items()]
    notes += [f"<li data-note=\"restored\">{esc(name)}: restored {esc('; '.join(host.restored))}</li>"
              for name, host in hosts.items() if host is not None and host.restored]
    listed = f"\n<ul class=\"notes\">{''.join(notes)}</ul>" if notes else ""
    return ("<section id=\"outcome\"><h2>Outcome</h2>\n<table class=\"outcome\"><tr><th>hosts</th><th>status</th>"
            "<th>reason</th><th>node set</th><th>error</th></tr>\n" + "\n".join(rows) + f"</table>{listed}</section>")


# --- the rack grid ----------------------------------------------------------------------------------------------

Before = int | None | str  # a GPU's MiB before the reset: a number, unreadable (None), or not read ("")
_INDEX = attrgetter("index")
_FAIL, _WARN = Level.FAIL, Level.WARN


_MOST = tuple(most for _, most, _ in BUCKETS if most is not None)  # the buckets' bounds, ascending
_NAMES = tuple(name for name, _, _ in BUCKETS)


def memory(value: object) -> tuple[str, str]:
    """An amount of MiB as a cell's title says it, and its bucket (the first whose bound it is at or under); `n/a`
    and `na` where it is not a number (unreadable, not read)."""
    return (str(value), _NAMES[bisect_left(_MOST, value)]) if isinstance(value, int) else ("n/a", "na")


def memory_before(host: HostReport) -> Sequence[int | None]:
    """Each GPU's MiB as the reset began: `memory_before_mib` (a dry run's `plan.gpu_memory_mib`); () not read."""
    if host.memory_before_mib is not None:
        return host.memory_before_mib
    return host.plan.gpu_memory_mib if host.plan is not None else ()


def gpu_cells(host: HostReport) -> list[tuple[int, Before, GpuReport | None]]:
    """(index, MiB before, the GPU's report after) per GPU: before is the n-th of `memory_before`, paired with the
    n-th GPU verify listed (by index)."""
    before, after = memory_before(host), sorted(host.gpus, key=_INDEX)
    if len(before) == len(after):  # each GPU with its baseline, or no baseline and no GPU
        return [(gpu.index, was, gpu) for was, gpu in zip(before, after, strict=True)]
    cells: list[tuple[int, Before, GpuReport | None]] = []
    for n in range(max(len(before), len(after))):
        gpu = after[n] if n < len(after) else None
        cells.append((gpu.index if gpu is not None else n, before[n] if n < len(before) else "", gpu))
    return cells


def _worst(findings: Iterable[Finding | HostFinding]) -> str:
    """The outline of the worst finding: ` hf` a failed check, ` hw` a warning, else none."""
    worst = ""
    for f in findings:
        if f.level == _FAIL:
            return " hf"
        if f.level == _WARN:
            worst = " hw"
    return worst


def _cell(index: int, before: Before, gpu: GpuReport | None, has_before: bool, e: Escaped) -> str:
    """A GPU's cell: its title says `gpu 3: 70000 → 0 MiB; settled in 1.2 s; <each health finding>` (the findings'
    words escaped), its halves the buckets of its memory before (`has_before`: the strip on top) and after."""
    if has_before:
        amount, kind = memory(before)
        was, top = f"{amount} → ", f"<i class=\"b {kind}\"></i>"
    else:
        was = top = ""
    wide = "" if has_before else " w"
    if gpu is None:
        return f"<td class=\"c\" title=\"gpu {index}: {was}not listed after\">{top}<i class=\"gone{wide}\"></i></td>"
    (used, kind), findings = memory(gpu.memory_used_mib), gpu.health
    said = f"; settled in {gpu.settle_s} s" if gpu.settle_s is not None else ""
    for f in findings:
        said += f"; {e[f.check]} {f.level}: {e[f.detail]}"
    return (f"<td class=\"c{_worst(findings) if findings else ''}\" title=\"gpu {index}: {was}{used} MiB"
            f"{said}\">{top}<i class=\"{kind}{wide}\"></i></td>")


def _model(host: Host) -> str:
    """How many GPUs verify listed, the first one's model and memory: the grid row's hover text (as HTML)."""
    if host is None or not host.gpus:
        return "no GPU listed"
    first = host.gpus[0]
    total = f", {first.memory_total_mib} MiB" if first.memory_total_mib is not None else ""
    return f"{len(host.gpus)} × {esc(first.name or 'GPU')}{total}"


def _grid_row(row: Row, e: Escaped, odd: Sequence[str] = ()) -> str:
    """The host's row; `odd`: why its settings (GPU, fabric manager) make it an odd one out (`fleet.report.uniform`)."""
    host = row.host
    cells = gpu_cells(host) if host is not None else []
    has_before = host is not None and bool(memory_before(host))  # a baseline: a strip on top of each cell
    node = host.health if host is not None else ()
    words = "; ".join(_finding_words(f) for f in node)
    mark = f"<span class=\"mark{_worst(node)}\" title=\"{esc(words)}\">!</span>" if node else ""
    mark += f"<span class=\"odd\" title=\"settings: {esc('; '.join(odd))}\">≠</span>" if odd else ""
    body = ("".join(_cell(i, b, g, has_before, e) for i, b, g in cells)
            or "<td class=\"none\" colspan=\"64\">no GPU read</td>")  # across the GPU columns, widening none
    return (f"<tr data-row=\"grid\" data-host=\"{row.name}\" data-gpus=\"{len(cells)}\"{' data-odd' if odd else ''}>"
            f"<th title=\"{_model(host)}\"><a href=\"#h-{row.name}\">{row.name}</a>{mark}</th><td class=\"st"
            f" {row.css}\">{row.status}</td>{body}</tr>")


def _legend() -> str:
    swatches = "".join(f"<span><i class=\"{name}\"></i>{esc(words)}</span>" for name, _, words in BUCKETS)
    return ("<p class=\"legend\">a cell per GPU, coloured by the memory it used: the thin top strip before the"
            " reset, the body after (a check, or a host with no baseline: the whole cell); hover a cell for its"
            " numbers. " + swatches +
            "<span><i class=\"na\"></i>unreadable</span><span><i class=\"gone\"></i>not listed after</span>"
            "<span><i class=\"m0 hf-s\"></i>health check failed</span><span><i class=\"m0 hw-s\"></i>health warning"
            "</span><span><b class=\"odd\">≠</b> GPU settings or fabric manager unlike the run's other hosts'"
            " (hover it)</span></p>")


def _grid(shown: Mapping[str, Row], e: Escaped, odd: Mapping[str, Sequence[str]]) -> str:
    lines = "\n".join(_grid_row(row, e, odd.get(name, ())) for name, row in shown.items())
    return (f"<section id=\"grid\"><h2>GPUs</h2>\n{_legend()}\n<table class=\"grid\"><tr><th>host</th><th>status</th>"
            f"<th colspan=\"64\">GPUs</th></tr>\n{lines}</table></section>")


# --- per host: a table's rows each one template, what fleet wrote (numbers, enum values) not escaped -------------


def _head(*names: str) -> str:
    return "".join(f"<th>{esc(name)}</th>" for name in names)


STEPS_HEAD, KILLED_HEAD, KEPT_HEAD = _head("step", "status", "took", "detail"), _head(
    "killed pid", "name", "user", "signal"), _head("kept pid", "name", "why")
WOULD_HEAD, SPARED_HEAD = _head("would kill pid", "user", "name", "MiB"), _head(
    "would keep pid", "user", "name", "MiB", "why")
HEALTH_HEAD = _head("where", "check", "level", "finding")


def _table(head: str, rows_html: Iterable[str], cls: str = "small") -> str:
    body = "".join(rows_html)
    return f"<table class=\"{cls}\"><tr>{head}</tr>{body}</table>" if body else ""


def _finding_words(finding: HostFinding) -> str:
    where = f" at {finding.pci}" if finding.pci else ""
    return f"{finding.check} {finding.level}{where}: {finding.detail}"


def _processes(host: HostReport, e: Escaped) -> list[str]:
    killed = _table(KILLED_HEAD, (f"<tr><td>{k.pid}</td><td>{e[k.name]}</td><td>{e[k.user]}</td><td>{e[k.signal]}"
                                  "</td></tr>" for k in host.killed))
    kept = _table(KEPT_HEAD, (f"<tr><td>{k.pid}</td><td>{e[k.name]}</td><td>{e[k.why]}</td></tr>" for k in host.kept))
    plan = host.plan
    if plan is None:  # a reset's: what it killed and kept
        return [t for t in (killed, kept) if t]
    would = _table(WOULD_HEAD, (f"<tr><td>{p.pid}</td><td>{esc(p.user)}</td><td>{esc(p.name)}</td><td>{mib(p.mib)}"
                                "</td></tr>" for p in plan.would_kill))
    spared = _table(SPARED_HEAD, (f"<tr><td>{p.pid}</td><td>{esc(p.user)}</td><td>{esc(p.name)}</td><td>"
                                  f"{mib(p.mib)}</td><td>{esc(p.kept_because)}</td></tr>"
                                  for p in plan.kept))
    return [t for t in (killed, kept, would, spared) if t]


def _health(host: HostReport, e: Escaped) -> str:
    rows_html = [f"<tr><td>gpu {g.index}</td><td>{e[f.check]}</td><td>{f.level}</td><td>{e[f.detail]}</td></tr>"
                 for g in host.gpus for f in g.health]
    rows_html += [f"<tr><td>{esc(f'node {f.pci}' if f.pci else 'node')}</td><td>{esc(f.check)}</td><td>{f.level}"
                  f"</td><td>{esc(f.detail)}</td></tr>" for f in host.health]
    return _table(HEALTH_HEAD, rows_html, "small health")
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


def _parts(host: HostReport, e: Escaped) -> list[str]:
    """The host's detail, but for its error and log: its steps, processes, health findings and Slurm's part."""
    steps = _table(STEPS_HEAD, (f"<tr><td>{s.name}</td><td>{s.status}</td><td>"
                                f"{secs(s.duration_s) if s.status is not StepStatus.SKIPPED else '-'}</td><td>"
                                f"{e[s.detail or s.error or '']}</td></tr>" for s in host.steps), "small steps")
    done = [f"<p class=\"done\">{esc(what)}: {esc('; '.join(items))}</p>"
            for what, items in (("stopped", host.stopped), ("restored", host.restored)) if items]
    return [steps, *done, *_processes(host, e), _health(host, e), _scheduler(host)]


def _host(row: Row, e: Escaped, log_folder: str) -> str:
    """The host's details; `log_folder`: its log's folder as HTML, with its closing slash (or none)."""
    host, name = row.host, row.name
    reason = f" {host.reason.value}" if host is not None and host.reason else ""
    error = host.error if host is not None else NO_OUTCOME
    parts = [f"<p class=\"err\">{esc(error)}</p>" if error else "", *(_parts(host, e) if host is not None else ()),
             f"<p class=\"log\">log: <a href=\"{name}.jsonl\">{log_folder}{name}.jsonl</a></p>"]
    opened = "" if row.status in ("clean", "planned") else " open"
    took = secs(host.duration_s if host is not None else None)
    return (f"<details id=\"h-{name}\" data-row=\"host\" data-host=\"{name}\"{opened}><summary>"
            f"<b>{name}</b> <span class=\"badge {row.css}\">{row.status}</span>{reason} · {took}</summary>"
            f"{''.join(p for p in parts if p)}</details>")


def _details(shown: Mapping[str, Row], e: Escaped, log_folder: str | None) -> str:
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    names = sorted(shown, key=lambda n: (shown[n].status in ("clean", "planned"), order.get(shown[n].status, -1), n))
    folder = f"{esc(log_folder.rstrip('/'))}/" if log_folder else ""
    return ("<section id=\"hosts\"><h2>Hosts</h2>\n<p class=\"legend\">hosts that did not end clean first, open;"
            " click a host to open or close it.</p>\n" + "\n".join(_host(shown[n], e, folder) for n in names)
            + "</section>")
