"""report.html's timeline (`fleet.report.html_report`): a row per host, its steps as bars on one time axis, sorted by
end time, the last to end and the median named above.

The report keeps each step's duration and each host's start in the run (`start_s`): a host's bars are laid end to
end from there, the time before drain (connect, lock, baselines) first, and a wait for its node's Slurm jobs
(`slurm.waited_s`) is its own bar ending where the host started. A report without `start_s` (an older fleet's
summary.json, a page built from the history) has each host's bars start at the host's own start instead, and the
page says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet.node.jobs import job_sides
from fleet.report.html_rows import Bar, Host, Row, esc, secs

TICKS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
BAR_UNITS = 1000  # a timeline row's SVG width in user units; the axis spans [0, extent] seconds
Rows = Mapping[str, Row]


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


def on_run_axis(rows: Rows) -> bool:
    """Whether every host that ran has its start in the run (`start_s`): then the timeline's axis is the run's. A
    report without (an older fleet's summary.json, a page built from the history) has each host's bars start at
    the host's own start."""
    return all(r.host is not None and r.host.start_s is not None for r in rows.values() if r.bars)


def bars_on_axis(row: Row, run_axis: bool) -> list[Bar]:
    """The host's bars on the timeline's axis: on the run's, its steps from its `start_s`, after its Slurm wait (its
    own bar, `wait`, ending where the host started); else its steps from 0 (no wait: it would lie before 0)."""
    host, bars = row.host, row.bars
    if not run_axis or not bars or host is None or host.start_s is None:
        return bars
    start = host.start_s
    waited = job_wait(host)
    wait = [("wait", max(start - waited, 0.0), min(waited, start), f"{esc(scheduler_title(host))} wait {waited:.2f} s")
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


def timeline_order(rows: Rows, ends: Mapping[str, float]) -> list[str]:
    """Hosts that ran, by end time (`ends`: on the run's axis when the report has each host's start, else each
    host's duration); then those that never started, by name."""
    ran = {n for n, r in rows.items() if r.bars}
    return sorted(ran, key=lambda n: (ends[n], n)) + sorted(n for n in rows if n not in ran)


def _bar(row: Row, extent: float, run_axis: bool) -> str:
    scale = BAR_UNITS / extent
    rects = "".join(f"<rect class=\"{kind}\" x=\"{start * scale:.1f}\" width=\"{max(length * scale, 0.5):.1f}\""
                    f" height=\"10\"><title>{words}</title></rect>" for kind, start, length, words
                    in bars_on_axis(row, run_axis))
    if not rects:
        waited = job_wait(row.host)
        why = f" (waited {waited:.1f} s for its {esc(scheduler_title(row.host))} jobs)" if waited else ""
        return f"<td class=\"bar idle\">not started{why}</td>"
    return (f"<td class=\"bar\"><svg viewBox=\"0 0 {BAR_UNITS} 10\" preserveAspectRatio=\"none\" width=\"100%\""
            f" height=\"12\" data-extent=\"{extent:g}\">{rects}</svg></td>")


def _row(row: Row, end: float, extent: float, run_axis: bool) -> str:
    start = row.host.start_s if row.host is not None else None
    started = f" data-start=\"{start:g}\"" if run_axis and start is not None and row.bars else ""
    took = secs(row.host.duration_s if row.host is not None else None)
    return (f"<tr data-row=\"timeline\" data-host=\"{row.name}\"{started} data-end=\"{end:g}\"><th><a"
            f" href=\"#h-{row.name}\">{row.name}</a></th>{_bar(row, extent, run_axis)}<td class=\"num"
            f" {row.css}\">{took}</td></tr>")


def timeline(rows: Rows) -> str:
    run_axis = on_run_axis(rows)
    ends = {n: end_of(r.host, run_axis) for n, r in rows.items()}
    order = timeline_order(rows, ends)
    longest = max(ends.values(), default=0.0)
    step = tick_step(longest or 1.0)
    extent = step * max(1, -(-longest // step))
    ticks = "".join(f"<span style=\"left:{100 * k * step / extent:.2f}%\">{k * step:g} s</span>"
                    for k in range(round(extent / step) + 1))
    lines = "\n".join(_row(rows[n], ends[n], extent, run_axis) for n in order)
    waiting = sorted({scheduler_title(r.host) for r in rows.values() if run_axis and job_wait(r.host) and r.bars})
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
            f"\n{_slowest(rows, order, ends, run_axis)}<table class=\"timeline\" style=\"{tick}\">"
            f"<tr class=\"axis\"><th></th><td><div class=\"ticks\">{ticks}</div></td><td></td></tr>\n"
            f"{lines}</table></section>")


def _slowest(rows: Rows, order: Sequence[str], ends: Mapping[str, float], run_axis: bool) -> str:
    ran = [n for n in order if rows[n].bars]
    last = rows[ran[-1]] if ran else None
    if last is None or last.host is None:  # a host with bars has a report
        return ""
    host = last.host
    longest = max(((s.name.value, s.duration_s or 0) for s in host.steps), key=lambda pair: pair[1], default=None)
    step = f"longest step: {longest[0]} {secs(longest[1])}" if longest else ""
    took_it = secs(host.duration_s)
    when = (f" at {secs(ends[ran[-1]])} into the run (it took {took_it}{'; ' + step if step else ''})"
            if run_axis else f" after {took_it}{f' ({step})' if step else ''}")
    took = sorted(h.duration_s for n in ran if (h := rows[n].host) is not None)
    return (f"<p class=\"meta\">last to end: <a href=\"#h-{last.name}\">{last.name}</a>{when}; the median host"
            f" took {secs(took[len(took) // 2])}</p>\n")
