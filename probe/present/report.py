"""Reports of a run, or of a doctor or sweep session, to attach to a ticket or a pull request:
HTML (one self-contained file that works offline), Markdown (a short summary for a PR comment)
and JSON (everything, schema `feedscope.report/1`).

A report is built once (`build_report`) and rendered in any format; the dashboard's export
buttons render the same `Report`. Every string that comes from the user or the system (paths,
labels, host and GPU names) is escaped in HTML and Markdown.

Where the lanes timed their stages, the HTML shows where each image's CPU time goes
(`charts.stage_bars`) under the lanes table, and the Markdown a table of it (`stage_grid`, a
column per stage, to keep the summary short); the JSON has each lane's `stages_ms`. A run of
several lanes says under its timelines which lane waited most for data, interval by interval
(`charts.slowest_line`).
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from probe.fix.setting import tune_told
from probe.judge.changes import Recommendation
from probe.judge.diagnosis import RunDiagnosis, diagnose_run
from probe.judge.results import (
    Session,
    SessionKind,
    focus_run,
    is_session_id,
    read_session,
    resolve_subject,
)
from probe.judge.verdicts import Verdict, VerdictKind
from probe.metrics import IMAGES_PER_S, MEMORY, STAGE_TIME, STAGES, job_scope
from probe.present import charts
from probe.present.doctor_tables import (
    dali_grid,
    dali_lines,
    dataloader_against_dali,
    pairs_gain,
    scaling_grid,
    scaling_lines,
)
from probe.present.jsontext import json_text
from probe.present.offer import offer_lines
from probe.present.options import reproduce_command
from probe.present.tables import (
    ASIDE,
    Grid,
    brief_grid,
    consumer_line,
    curve_lines,
    epochs_lines,
    headline,
    lane_grid,
    pipeline_only,
    point_grid,
    point_notes,
    recommendation_grid,
    recommendation_notes,
    recommendation_rates,
    run_devices,
    run_notes,
    run_wait,
)
from probe.store.db import Store
from probe.store.documents import RunBrief, RunDocument, read_run
from probe.store.series import (
    LatencyHistogram,
    RunSeries,
    latency_histogram,
    run_series,
    slowest_lanes,
)

REPORT_SCHEMA = "feedscope.report/1"
FORMATS = ("html", "md", "json")


@dataclass(frozen=True)
class Report:
    """What a report shows. For a session, `run` is the run its verdict is about (the doctor's:
    your setting; a sweep's: its knee), and `runs` are all of its runs in brief."""

    kind: str  # "run", "doctor" or "sweep"
    generated: str
    run: RunDocument
    diagnosis: RunDiagnosis  # the run's
    session: Session | None
    runs: list[RunBrief]  # each of the session's runs
    series: RunSeries | None
    histogram: LatencyHistogram | None
    session_point: bool = False  # the run is a point of a sweep or doctor session
    tuned: str | None = None  # a watched run's: what a `probe tune` session measured on it

    @property
    def reproduce(self) -> str | None:
        """The command that measures the run again (`reproduce_command`)."""
        return reproduce_command(self.run, of_session=self.session_point)

    @property
    def verdict(self) -> Verdict:
        """The doctor's verdict for a doctor session, else the run's."""
        if self.session is not None and self.session.verdict is not None:
            return self.session.verdict
        return self.diagnosis.verdict

    @property
    def recommendations(self) -> tuple[Recommendation, ...]:
        if self.session is not None and self.session.verdict is not None:
            return self.session.recommendations
        return self.diagnosis.recommendations

    @property
    def asides(self) -> tuple[Recommendation, ...]:
        """The changes set aside: measured or predicted below yours."""
        if self.session is not None and self.session.verdict is not None:
            return self.session.asides
        return self.diagnosis.asides

    @property
    def offered(self) -> list[str]:
        """What follows a watched run's answer: the doctor session measured like it and the tune
        session on it, quoted, and the fix's command (`offer_lines`)."""
        what_if = [] if self.session is not None else [self.diagnosis.what_if]
        offered = offer_lines(self.run, self.recommendations, self.tuned)
        return [line for line in what_if if line] + offered

    @property
    def agreed(self) -> bool:
        """Whether a recommendation's run again agreed with it (`measured_again`)."""
        verify = None if self.session is None else self.session.verify
        return verify is None or verify.verified

    @property
    def scope(self) -> str:
        """Whose the recommendations' images/s are (`job_scope`)."""
        if self.session is not None and self.session.devices:
            return job_scope(self.session.devices)
        return job_scope(run_devices(self.run))

    @property
    def subject(self) -> str:
        if self.session is not None:
            return f"{self.kind} session {self.session.session_id}"
        return f"run {self.run.run_id}"

    def to_json(self) -> dict[str, Any]:
        histogram = None
        if self.histogram is not None:
            histogram = {
                "bin_ms": self.histogram.bin_ms,
                "overflow_ms": self.histogram.overflow_ms,
                "lanes": [
                    {"lane": lane, "bin_starts_ms": starts, "counts": counts}
                    for lane, (starts, counts) in sorted(self.histogram.lanes.items())
                ],
            }
        return {
            "schema": REPORT_SCHEMA,
            "kind": self.kind,
            "generated": self.generated,
            "subject": self.subject,
            "verdict": self.verdict.to_json(),
            "recommendations": [r.to_json() for r in self.recommendations],
            "asides": [r.to_json() for r in self.asides],
            "run": self.run.to_json(),
            "diagnosis": self.diagnosis.to_json(),
            "session": None if self.session is None else self.session.to_json(),
            "runs": [brief.to_json() for brief in self.runs],
            "reproduce": self.reproduce,
            "series": None if self.series is None else asdict(self.series),
            "latency_histogram": histogram,
        }


def build_report(store: Store, wanted: str) -> Report:
    """The report of a run (its id, or a unique start of it), of a doctor or sweep session (its
    id), or of `last`: the newest run or session a user started.

    Raises:
        InputError: nothing matches `wanted`, or several things do.
    """
    session = None
    runs: list[RunBrief] = []
    subject = resolve_subject(store, wanted)
    focus = focus_run(store, subject)
    kind = "run"
    if is_session_id(subject):
        session = read_session(store, subject)
        kind = session.kind.value
        run_ids = [run.run_id for run in store.runs() if run.session_id == session.session_id]
        runs = [RunBrief.of(read_run(store, run_id)) for run_id in reversed(run_ids)]
    return Report(
        kind=kind,
        generated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        run=read_run(store, focus),
        diagnosis=diagnose_run(store, focus),
        session=session,
        runs=runs,
        series=run_series(store, focus),
        histogram=latency_histogram(store, focus),
        session_point=store.run(focus).session_id is not None,
        tuned=None if session is not None else tune_told(store, focus),
    )


def render(report: Report, form: str) -> str:
    """The report in one of FORMATS."""
    if form == "json":
        return json_text(report.to_json(), indent=1) + "\n"
    if form == "md":
        return markdown(report)
    if form == "html":
        return html_page(report)
    raise ValueError(f"unknown report format {form!r} (choose from: {', '.join(FORMATS)})")


# --- Markdown -----------------------------------------------------------------------------------


def markdown(report: Report) -> str:
    """A short summary fit for a PR comment: verdict, key numbers, top recommendation, lanes."""
    doc, verdict = report.run, report.verdict
    lines = [f"### feedscope: {_md(report.subject)}", ""]
    lines.append(f"**{_md_prose(headline(verdict))}**")
    lines.append("")
    lines += [f"- {_md_prose(item.text)}" for item in verdict.evidence[:6]]
    lines.append("")
    top = report.recommendations[0] if report.recommendations else None
    if top is not None:
        action = _md_prose(top.action)
        line = f"**Top recommendation**: `{_code(top.setting)}`: {action}"
        lines += [line + recommendation_rates(top, report.scope, report.agreed), ""]
    offered = report.offered
    lines += [*(f"- {_md_prose(line)}" for line in offered), ""] if offered else []
    verify = None if report.session is None else report.session.verify
    if verify is not None and verify.outcome:  # the check changed or kept the answer: say so
        lines += [f"**Its verification**: {_md_prose(verify.outcome)}", ""]
    if report.session is not None and report.runs:
        lines += [*_md_table(brief_grid(report.runs)), ""]
        predicted = curve_lines(report.session)[:1]  # the knee it predicted; the terms: HTML
        lines += [*(_md_prose(line) for line in predicted), *([""] if predicted else [])]
    label = f" ({_md(doc.label)})" if doc.label else ""
    lines.append(
        f"Run `{doc.run_id}`{label}: {_md(doc.pipeline)}, consumer {_md(doc.consumer)}, "
        f"{doc.status}; {IMAGES_PER_S.text(doc.images_per_s)}, all lanes; "
        f"{run_wait(doc)}."
    )
    lines += ["", *_md_table(lane_grid(doc))]
    stages = stage_grid(doc)
    if stages is not None:  # one line of text and a table of two rows: a PR comment is short
        several = sum(1 for lane in doc.lanes if lane.figures.stages_ms) > 1
        mean = ", the lanes' mean" if several else ""
        intro = (
            f"Where each image's CPU time goes ({STAGE_TIME.unit} per image{mean}; the "
            f"DataLoader workers' stages, then the main process's): "
        )
        lines += ["", intro + _md_prose(charts.stage_line(doc.lanes) or ""), "",
                  *_md_table(stages)]  # fmt: skip
    lines += ["", f"Host {_md(_host_line(doc.host))}.", ""]
    return "\n".join(lines)


def stage_grid(doc: RunDocument) -> Grid | None:
    """Where each image's CPU time goes, a column per stage (`STAGES` order) and a last one
    adding them up: a row of CPU ms per image (the mean of the lanes that timed the stage), a
    row of each one's share of all the stages. None where no lane timed its stages."""
    timed = [lane.figures.stages_ms for lane in doc.lanes if lane.figures.stages_ms]
    if not timed:
        return None
    means = {}
    for stage in STAGES:
        values = [stages[stage.name] for stages in timed if stage.name in stages]
        if values:
            means[stage.label] = sum(values) / len(values)
    total = sum(means.values())
    means["all stages"] = total
    header = ("stage", *means)
    rows = (
        (f"{STAGE_TIME.unit} per image", *(STAGE_TIME.number(ms) for ms in means.values())),
        ("share", *(_share(ms, total) for ms in means.values())),
    )
    return Grid(header, rows, frozenset(range(1, len(header))))


def _share(part: float, total: float) -> str:
    return f"{part / total:.0%}" if total else "-"


def _md_table(grid: Grid) -> list[str]:
    align = ["--:" if i in grid.numeric else "---" for i in range(len(grid.header))]
    return [
        "| " + " | ".join(_md(cell) for cell in grid.header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(_md_prose(cell) for cell in row) + " |" for row in grid.rows),
    ]


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def _md(text: object) -> str:
    """Text that Markdown shows as it is: no markup, no HTML, no table breaks."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")


def _code(text: str) -> str:
    return text.replace("`", "'").replace("\n", " ")


_CODE_MARKS = re.compile(r"`([^`\n]+)`")  # the judge's wording marks commands: `probe sweep`


def _md_prose(text: object) -> str:
    """Text that Markdown shows as it is (`_md`), but for its `code` marks: code spans (a
    table's `|` escaped in them too)."""
    parts = _CODE_MARKS.split(str(text))  # odd items: what the marks held
    return "".join(
        "`" + _code(part).replace("|", "\\|") + "`" if index % 2 else _md(part)
        for index, part in enumerate(parts)
    )


# --- HTML ---------------------------------------------------------------------------------------


def html_page(report: Report) -> str:
    """One self-contained page: plotly.js's cartesian bundle inlined once (`charts.page_script`),
    nothing fetched from anywhere."""
    doc = report.run
    parts = [_verdict_html(report), _recommendations_html(report)]
    if report.session is not None:
        parts.append(_session_html(report))
    parts.append(_lanes_html(report))
    if report.series is not None and any(lane.t_s for lane in report.series.lanes):
        drawn = charts.run_figures(
            report.series, report.histogram, doc.lanes, pipeline_only(doc.consumer)
        )
        parts.append(f"<h2>Timelines of run {_h(doc.run_id)}</h2>")
        if report.series.bucket_s > 0.15:
            parts.append(
                f"<p class=note>Downsampled to {report.series.bucket_s:.1f} s intervals: shaded "
                "bands run from each interval's lowest to its highest sample.</p>"
            )
        slowest = slowest_lanes(report.series)
        for index, chart in enumerate(drawn):
            parts.append(charts.html_div(chart))
            if index == 0 and slowest is not None:  # the lanes' timelines come first
                parts.append(f"<p class=note>{_prose(charts.slowest_line(slowest))}</p>")
    parts.append(_host_html(doc))
    command = report.reproduce or "# a watched training loop: run your training again"
    parts.append(
        "<h2>To reproduce it</h2>"
        f"<pre>{_h(command)}</pre>"
        "<details><summary>The run's whole configuration</summary>"
        f"<pre>{_h(json.dumps(doc.config, indent=1))}</pre></details>"
    )
    title = f"feedscope: {report.subject}"
    body = "".join(parts)
    drawing = charts.page_script() if charts.CHART_CLASS in body else ""  # 0.7 MB: if needed
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{_h(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_h(title)}</h1><p class=note>generated {_h(report.generated)} by feedscope</p>"
        + body
        + drawing
        + "</body></html>\n"
    )


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#222}h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;"
    "text-align:left}td.n{text-align:right}.note{color:#666;font-size:.9em}"
    ".verdict{padding:.8em 1em;border-radius:6px;font-size:1.15em;font-weight:600}"
    ".high{background:#fdecea;color:#8a1c12}.moderate{background:#fff4e0;color:#7a4b00}"
    ".none{background:#eaf6ec;color:#1e5b2a}.unjudged{background:#e8f0fb;color:#1c4a80}pre{background:#f6f6f6;padding:.8em;overflow-x:auto;"
    "white-space:pre-wrap}code{background:#f3f3f3;padding:0 .2em;border-radius:3px}"
    ".id{white-space:nowrap}"
)


def _verdict_html(report: Report) -> str:
    verdict = report.verdict
    evidence = "".join(f"<li>{_prose(item.text)}</li>" for item in verdict.evidence)
    tone = "unjudged" if verdict.kind is VerdictKind.UNKNOWN else verdict.severity.value
    return f"<div class='verdict {_h(tone)}'>{_prose(headline(verdict))}</div><ul>{evidence}</ul>"


def _recommendations_html(report: Report) -> str:
    parts = []
    for title, items in (("Recommendations", report.recommendations),
                         (f"Not recommended: {ASIDE}", report.asides)):  # fmt: skip
        if not items:
            continue
        notes = "".join(f"<li>{_prose(line)}</li>" for line in recommendation_notes(items))
        scope = f" (images/s{report.scope})" if report.scope else ""
        parts.append(
            f"<h2>{_h(title)}{_h(scope)}</h2>"
            + _grid(recommendation_grid(items))
            + f"<ol class=note>{notes}</ol>"
        )
    offered = report.offered
    if offered:
        lines = "".join(f"<li>{_prose(line)}</li>" for line in offered)
        parts.append(f"<ul>{lines}</ul>")
    return "".join(parts)


def _session_html(report: Report) -> str:
    session = report.session
    if session is None:
        return ""
    knob, dali = session.knob, session.dali
    out = [f"<h2>Sweep of {_h(knob)}</h2>"]
    if session.points:
        out.append(charts.html_div(charts.sweep_curve(session)))
    out.append(_grid(point_grid(session)))
    out += [f"<p class='note'>{_prose(line)}</p>" for line in point_notes(session)]
    out += [f"<p class='note'>{_prose(line)}</p>" for line in curve_lines(session)]
    out.append(_grid(brief_grid(report.runs)))
    against = dataloader_against_dali(session)
    if against is not None and dali is not None and session.best is not None:
        out.append("<h2>DataLoader against DALI</h2>")
        paired = pairs_gain(session) is not None  # the pairs' one comparison, told
        if not paired:  # two runs, drawn
            ids = {session.best.run_id, dali.run_id}
            shown = [b for b in report.runs if b.run in ids]
            try:
                out.append(charts.html_div(charts.compare_bars(shown)))
            except ValueError as error:  # a figure that cannot be: said, not drawn
                out.append(f"<p class='note'>{_h(str(error))}</p>")
        advice = f" {_prose(dali.advice)}" if dali.advice and not paired else ""  # not twice
        out.append(f"<p>As the session measured them: {_prose(against)}.{advice}</p>")
    elif dali is not None and dali.reason:
        out.append(f"<p>DALI: not measured: {_prose(dali.reason)}</p>")
    if dali is not None and dali.tried:
        out.append("<h2>DALI's settings searched</h2>")
        if len(dali.tried) > 1:
            out.append(_grid(dali_grid(dali, session.devices)))
        out += [f"<p class='note'>{_prose(line)}</p>" for line in dali_lines(session)]
    if session.kind is SessionKind.DOCTOR:
        lines = epochs_lines(session.epochs)
        alone = consumer_line(session)
        if alone is not None:
            lines.append(alone)
        if session.startup_s:
            lines.append(
                f"the lanes started once for the whole session, in {session.startup_s:.1f} s"
            )
        out += [f"<p>{_prose(line)}</p>" for line in lines]
    if session.scaling is not None:
        out.append(f"<h2>From 1 {_h(session.scaling.device)} to {session.scaling.lanes}</h2>")
        out.append(charts.html_div(charts.scaling_chart(session.scaling)))
        out.append(_grid(scaling_grid(session.scaling)))
        out += [f"<p class='note'>{_prose(line)}</p>" for line in scaling_lines(session.scaling)]
    return "".join(out)


def _lanes_html(report: Report) -> str:
    doc = report.run
    reason = f": {doc.reason}" if doc.reason else ""
    label = f", label {doc.label}" if doc.label else ""
    head = (
        f"<h2>Run {_h(doc.run_id)}</h2><p>{_h(doc.pipeline)}, consumer "
        f"{_h(doc.consumer)}{_h(label)}; {_h(doc.status + reason)}; "
        f"{IMAGES_PER_S.text(doc.images_per_s)}, all lanes; {run_wait(doc)}; data "
        f"<code>{_h(doc.config['spec']['data_dir'])}</code></p>"
    )
    unavailable = "".join(
        f"<li>{_h(u['metric'])}: {_prose(u['reason'])}</li>" for u in doc.unavailable_metrics
    )
    tail = f"<p class=note>Not measured here:</p><ul class=note>{unavailable}</ul>"
    notes = "".join(f"<li>{_prose(note)}</li>" for note in run_notes(doc))
    return (
        head
        + _grid(lane_grid(doc))
        + (f"<ul class=note>{notes}</ul>" if notes else "")
        + (tail if unavailable else "")
        + _stages_html(doc)
    )


def _stages_html(doc: RunDocument) -> str:
    figure = charts.stage_bars(doc.lanes)
    if figure is None:
        return ""
    return (
        charts.html_div(figure) + f"<p class=note>{_prose(charts.stage_line(doc.lanes) or '')}</p>"
    )


def _host_html(doc: RunDocument) -> str:
    host = doc.host
    rows = [
        [_h(key), _h(_fact(host, key))]
        for key, value in host.items()
        if key != "gpus" and not isinstance(value, (dict, list))
    ]
    gpus = [
        [
            *(_h(_fact(g, key)) for key in ("index", "name", "uuid")),
            MEMORY.number(g.get("memory_mib")),
        ]
        for g in host.get("gpus", [])
    ]
    out = "<h2>Host and GPUs</h2>" + _table(["host", ""], rows, numeric=set())
    if gpus:
        out += _table(["GPU", "name", "UUID", "memory MiB"], gpus, numeric={3})
    return out


def _grid(grid: Grid) -> str:
    rows = [
        [f"<span class=id>{_h(cell)}</span>" if name == "run" else _prose(cell)
         for name, cell in zip(grid.header, row, strict=True)]
        for row in grid.rows
    ]  # fmt: skip
    return _table(list(grid.header), rows, set(grid.numeric))


def _table(header: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    """A table of cells already escaped."""
    head = "".join(f"<th>{_h(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class=n>{cell}</td>" if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _h(value: object) -> str:
    return html.escape(str(value), quote=True)


def _prose(value: object) -> str:
    """Text escaped (`_h`), its `code` marks drawn as <code>."""
    return _CODE_MARKS.sub(r"<code>\1</code>", _h(value))


# --- shared ------------------------------------------------------------------------------------


def _host_line(host: Mapping[str, Any]) -> str:
    gpus = ", ".join(f"{_fact(g, 'index')}: {_fact(g, 'name')}" for g in host.get("gpus", []))
    return (
        f"{_fact(host, 'hostname')}: {_fact(host, 'cpus')} CPU cores, GPUs {gpus or 'none'}; "
        f"driver {_fact(host, 'driver')}, torch {_fact(host, 'torch')}, CUDA "
        f"{_fact(host, 'cuda')}, DALI {_fact(host, 'dali')}"
    )


# What a host fact that is None means; any other: not measured.
_ABSENT = {
    "driver": "not found (no GPU sampled)",
    "cuda": "none (a CPU build of torch)",
    "dali": "not installed",
}


def _fact(facts: Mapping[str, Any], key: str) -> str:
    """A host's (or a GPU's) fact as text: what its absence means where it is None."""
    value = facts.get(key)
    return _ABSENT.get(key, "not measured") if value is None else str(value)
