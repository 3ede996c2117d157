"""The tables and headlines every output shows alike: the terminal, the reports (Markdown and
HTML) and the dashboard build theirs from these, so that a figure reads the same everywhere.

Pure: documents in, headers and text cells out (no markup: each output escapes and draws them).
Labels, units and formats are those of `probe.metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from probe.judge.changes import Recommendation
from probe.judge.results import EpochsRun, Session, SessionKind
from probe.judge.thresholds import KNEE_WITHIN, Severity
from probe.judge.verdicts import FED_KINDS, Verdict, VerdictKind
from probe.judge.verdicts import rank as verdict_rank
from probe.lane_figures import LaneFigures
from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    LATENCY,
    NVJPG,
    against_text,
    busy_metric,
    counted,
    device_word,
    job_scope,
    per_device,
)
from probe.present.offer import offer_lines
from probe.records import RunStatus
from probe.store.documents import LaneDocument, RunBrief, RunDocument


@dataclass(frozen=True)
class Grid:
    """A table: its header, its rows of text cells, and which columns hold numbers."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int]

    def records(self) -> list[dict[str, str]]:
        """One dict per row, keyed by the header (a dashboard's data frame)."""
        return [dict(zip(self.header, row, strict=True)) for row in self.rows]


SHORT = 40  # characters of a table cell; a longer text is shortened, and shown whole under it


def short(text: str, limit: int = SHORT, clauses: bool = True) -> str:
    """A table cell's text: `text` itself where it is short, else its head (up to its first
    ': ' or '; ' where `clauses`, and within `limit`, up to a space) and '…'."""
    if len(text) <= limit:
        return text
    head = re.split(r": |; ", text, maxsplit=1)[0] if clauses else text
    if len(head) >= limit:  # up to the last word that fits whole
        cut = head[: limit - 1]
        head = cut if head[limit - 1] == " " else cut.rsplit(" ", 1)[0]
    if head.count("`") % 2:  # a `code` mark cut in two: up to where it opened
        head = head[: head.rindex("`")]
    return head.rstrip(" ,:;") + "…"


LATENCY_HEADING = f"{LATENCY.label} p50/p95/p99 {LATENCY.unit}"
PIPELINE_ONLY_WAIT = "- (no consumer)"


def pipeline_only(consumer: str) -> bool:
    """A run with no consumer measures the pipeline's capacity: it waits for data all the time
    by design, and that is not starvation."""
    return consumer == "none"


def run_wait(document: RunDocument) -> str:
    """A run's data-wait in words: its worst lane's, or for a run with no consumer, that it
    measured capacity."""
    if pipeline_only(document.consumer):
        return "no consumer: its data-wait is the pipeline's capacity at work, not starvation"
    return f"{DATA_WAIT.label} {DATA_WAIT.text(document.data_wait_frac)} (the worst lane's)"


def lane_grid(document: RunDocument) -> Grid:
    """One row per lane of a run: where it ran, its steady figures with their errors, its GPU
    busy-ness (labelled with its metric), its GPU's hardware JPEG decoder where it was read
    (DALI `mixed`), and the CPU cores its processes used."""
    decoder = any(lane.figures.nvjpg_pct is not None for lane in document.lanes)
    header = ("lane", "device", "shard", "status", "batches", IMAGES_PER_S.heading,
              DATA_WAIT.heading, LATENCY_HEADING, "GPU busy",
              *((f"{NVJPG.label} %",) if decoder else ()), CPU.heading, "reason")  # fmt: skip
    rows = []
    for lane in document.lanes:
        figures = lane.figures
        latency = figures.batch_latency_ms
        rows.append(
            (
                str(lane.lane),
                lane.device,
                f"{lane.shard_id}/{lane.num_shards}",
                lane.status,
                str(figures.batches),
                IMAGES_PER_S.cell(figures.images_per_s, figures.images_per_s_error),
                DATA_WAIT.cell(figures.data_wait_frac, figures.data_wait_frac_error),
                "/".join(LATENCY.number(v) for v in (latency.p50, latency.p95, latency.p99)),
                gpu_busy(figures),
                *((NVJPG.cell(figures.nvjpg_pct),) if decoder else ()),
                CPU.cell(figures.cpu_pct),
                lane.reason or "",
            )
        )
    numeric = {0, 4, 5, 6, 7, 9, 10} if decoder else {0, 4, 5, 6, 7, 9}
    return Grid(header, tuple(rows), frozenset(numeric))


def brief_grid(briefs: Sequence[RunBrief]) -> Grid:
    """Runs side by side: each run's images/s, data-wait (its worst lane's), CPU cores and, where
    a run read one, its GPU busy-ness (runs on the CPU alone get no GPU columns)."""
    gpu = any(busy_metric(b.sm_active_source) for b in briefs)
    header = ("run", "setting", "pipeline", IMAGES_PER_S.heading, DATA_WAIT.heading,
              *(("GPU busy %", "GPU busy metric") if gpu else ()), CPU.heading)  # fmt: skip
    rows = tuple(
        (
            b.run,
            b.label or "",
            b.pipeline,
            IMAGES_PER_S.cell(b.images_per_s, b.images_per_s_error),
            DATA_WAIT.cell(b.data_wait_frac),
            *(_busy_cells(b) if gpu else ()),
            CPU.cell(None if b.cpu_cores is None else b.cpu_cores / CPU.scale),
        )
        for b in briefs
    )
    return Grid(header, rows, frozenset({3, 4, 5, 7} if gpu else {3, 4, 5}))


def _busy_cells(brief: RunBrief) -> tuple[str, str]:
    busy = busy_metric(brief.sm_active_source)
    return (busy.number(brief.sm_active_pct), busy.title) if busy else ("-", "-")


def recommendation_grid(recommendations: Sequence[Recommendation]) -> Grid:
    """Ranked recommendations: the change, what it is, predicted images/s and those of its run
    again (the verification, where one was run), and how the prediction was made; long texts
    `short` (`recommendation_notes` has them whole)."""
    header = ("#", "change", "what", "predicted images/s", "run again, images/s", "basis")
    rows = tuple(
        (
            str(rank),
            item.setting,
            short(item.action),
            IMAGES_PER_S.cell(item.predicted_images_per_s, item.predicted_error),
            IMAGES_PER_S.cell(item.measured_images_per_s),
            short(item.basis),
        )
        for rank, item in enumerate(recommendations, 1)
    )
    return Grid(header, rows, frozenset({0, 3, 4}))


def recommendation_notes(recommendations: Sequence[Recommendation]) -> list[str]:
    """What `recommendation_grid` shortens, whole, a line per recommendation in its order:
    what it is, how it was predicted, its notes."""
    return [
        "; ".join([f"{item.setting}: {item.action}", f"basis: {item.basis}", *item.notes])
        for item in recommendations
    ]


def recommendation_text(item: Recommendation, scope: str = "", agreed: bool = True) -> str:
    """A recommendation in one line: the change, what it does, and its images/s, predicted and
    verified (`scope`: whose, `job_scope`; `agreed`: `measured_again`'s)."""
    return f"{item.setting}: {item.action}{recommendation_rates(item, scope, agreed)}"


def recommendation_rates(item: Recommendation, scope: str = "", agreed: bool = True) -> str:
    """'; predicted 3,659 ± 44 images/s, verified 3,633 images/s (-0.7%)' (what of it is
    known)."""
    text = ""
    if item.predicted_images_per_s is not None:
        predicted = IMAGES_PER_S.text(item.predicted_images_per_s, item.predicted_error)
        text += f"; predicted {predicted}{scope}"
    again = measured_again(item, agreed)
    return text + (f", {again}" if again else "")


def measured_again(item: Recommendation, agreed: bool = True, delta: bool = False) -> str | None:
    """A recommendation's run again, against its prediction: "verified 3,633 images/s (-0.7%)"
    where that run agreed with it (`agreed`), else "measured again 379 images/s (-8.2%)"; with
    `delta`, the sign first, as a metric's delta reads it ("-0.7%: verified 3,633"). None where
    it was not run again."""
    measured = item.measured_images_per_s
    if measured is None:
        return None
    word = "verified" if agreed else "measured again"
    if item.predicted_images_per_s is None or not agreed:  # against what: the verification's
        return f"{word} {IMAGES_PER_S.text(measured)}"  # line, one figure, says
    change = against_text(measured, item.predicted_images_per_s)
    if delta:
        return f"{change}: {word} {IMAGES_PER_S.cell(measured)}"
    return f"{word} {IMAGES_PER_S.text(measured)} ({change})"


def run_again(session: Session) -> int | None:
    """The rank of the recommendation the verification re-ran (None: it is not listed)."""
    verify = session.verify
    assert verify is not None
    ranks = [i for i, r in enumerate(session.recommendations, 1) if r.change == verify.change]
    return ranks[0] if ranks else None


def verification_summary(session: Session) -> str:
    """Which recommendation was run again: "the first one verified" only where it was; where
    the pairs in alternation are the check, which recommendations they measured."""
    verify = session.verify
    if verify is None:
        return "none run again"
    pairs = _pairs_summary(session)
    if pairs is not None:
        return pairs
    rank = run_again(session)
    if rank == 1:
        return f"the first one {'verified' if verify.verified else 'measured again'}"
    if rank is not None:
        return f"the first one measured once; recommendation {rank} run again"
    return f"the first one measured once; {verify.change.setting} run again"


def _pairs_summary(session: Session) -> str | None:
    """Where the pairs in alternation are the check: which recommendations they measured (None:
    no pair, or none of them listed)."""
    verify = session.verify
    if verify is None or not verify.pairs:
        return None
    settings = {item.setting for item in verify.in_turn}
    ranks = [i for i, r in enumerate(session.recommendations, 1) if r.setting in settings]
    if len(ranks) > 1:
        listed = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
        return f"recommendations {listed} measured in alternation, the pairs their check"
    if ranks:
        return f"recommendation {ranks[0]} measured in alternation, the pairs its check"
    return None


OVERSUBSCRIBED, HOST_BUSY = "oversubscribed", "host busy"  # a point's marks in `point_grid`


def point_grid(session: Session) -> Grid:
    """A sweep's points (a doctor's too): each setting's images/s, data-wait and CPU cores,
    what it was (knee, best, oversubscribed, on a busy host), its run; then what was not run."""
    knob = session.knob
    knee = None if session.knee is None else session.knee.setting
    best = None if session.best is None else session.best.setting
    over = set(session.oversubscribed)
    predicting = session.curve is not None and knob == "num_workers"
    header = (
        knob,
        IMAGES_PER_S.heading + job_scope(session.devices),
        *(("predicted", "measured vs predicted") if predicting else ()),
        DATA_WAIT.heading,
        CPU.heading,
        "marks",
        "run",
    )
    rows = []
    for point in session.points:
        marks = [
            mark
            for mark, holds in (
                ("knee", point.setting == knee),
                ("best", point.setting == best),
                (OVERSUBSCRIBED, point.setting in over),
                (HOST_BUSY, point.host_busy),
            )
            if holds
        ]
        predicted = session.predicted(point.setting)
        against = (
            (IMAGES_PER_S.cell(predicted), against_text(point.images_per_s, predicted))
            if predicted is not None
            else ("-", "-")
        )
        rows.append(
            (
                str(point.setting),
                IMAGES_PER_S.cell(point.images_per_s, point.images_per_s_error),
                *(against if predicting else ()),
                DATA_WAIT.cell(point.data_wait_frac, point.data_wait_frac_error),
                CPU.cell(point.cpu_pct),
                ", ".join(marks),
                point.run_id or "",
            )
        )
    for skipped in session.skipped:  # no figure, predicted or measured, for what was not run
        rows.append((str(skipped.setting), "-", *(("-", "-") if predicting else ()), "-", "-",
                     "not run", ""))  # fmt: skip
    numeric = frozenset(range(len(header) - 2)) - ({3} if predicting else set())
    return Grid(header, tuple(rows), numeric)


def point_notes(session: Session) -> list[str]:
    """What `point_grid`'s marks mean, where a point has them, and why each setting not run
    was not."""
    notes = []
    if {point.setting for point in session.points} & set(session.oversubscribed):
        notes.append(f"{OVERSUBSCRIBED}: slower than the best setting measured")
    if any(point.host_busy for point in session.points):
        notes.append(f"{HOST_BUSY}: other processes took the host's CPU while it measured, so "
                     "its figures are not trusted")  # fmt: skip
    return notes + [f"{session.knob}={s.setting} not run: {s.reason}" for s in session.skipped]


def curve_lines(session: Session) -> list[str]:
    """The predicted curve's terms and its knee, for people (none without a curve); for a
    doctor, also the setting it aims at: the fewest workers within half the knee's margin, so
    that the curve's own error leaves the setting it measures within the margin."""
    curve = session.curve
    if curve is None or session.knob != "num_workers":
        return []

    def at(setting: int) -> str:
        rate = IMAGES_PER_S.text(curve.images_per_s(setting))
        return f"num_workers={setting}, {rate} (bound by the {curve.bound(setting)})"

    knee = curve.knee(curve.settings())
    line = (
        f"predicted from run {curve.run_id} (num_workers={curve.workers}): the knee (the fewest "
        f"workers within {KNEE_WITHIN:.0%} of its best) is {at(knee)}"
    )
    if session.kind is SessionKind.DOCTOR:
        aim = curve.knee(curve.settings(), KNEE_WITHIN / 2)
        line += (
            f"; the doctor aims within {KNEE_WITHIN / 2:.1%} (half that, to leave room for the "
            "curve's own error)"
            + (f", and that is num_workers={knee} too" if aim == knee else f": {at(aim)}")
        )
    return [line, f"its terms, measured: {curve.text}"]


def consumer_line(session: Session) -> str | None:
    """The consumer alone as the session measured it (lane 0's), per GPU where the session ran
    several lanes, with the job's."""
    alone = session.consumer_alone
    if not alone or not alone.get("images_per_s"):
        return None
    rate = alone["images_per_s"]
    shown = IMAGES_PER_S.text(rate, alone.get("images_per_s_error"))
    shown += per_device(device_word(session.devices), session.lanes or 1, rate)
    return (
        f"the consumer alone, on batches already on the device: {shown}: the most any input "
        "fix can give"
    )


def gpu_busy(figures: LaneFigures) -> str:
    """A lane's GPU busy-ness, labelled with its metric: SM activity (GPM) with NVML's
    kernel-active beside it, or kernel-active alone where there is no GPM."""
    busy = figures.busy
    if busy is None:
        return "-"
    shown = f"{busy.label} {busy.text(figures.sm_active_pct)} ({busy.source.value})"
    if busy is not KERNEL_ACTIVE and figures.kernel_active_pct is not None:
        kernel = KERNEL_ACTIVE.text(figures.kernel_active_pct)
        shown += f", {KERNEL_ACTIVE.label} {kernel} ({KERNEL_ACTIVE.source.value})"
    return shown


def headline(verdict: Verdict, partial: str = "the run did not complete") -> str:
    """A verdict in one line: its title, severity and data-wait, and whether it is partial (and
    why: `partial`) or not trusted."""
    text = verdict.title
    if verdict.severity is not Severity.NONE:
        wait = DATA_WAIT.text(verdict.data_wait_frac)
        text += f" ({verdict.severity.value}: {DATA_WAIT.label} {wait})"
    if verdict.partial:
        text += f" - partial: {partial}"
    if not verdict.reliable:
        text += " - not trusted: the host was busy"
    return text


def run_notes(document: RunDocument) -> list[str]:
    """What to know of its data, how it read and warmed up, the transients, lane failures,
    skipped files, the consumer's note and unavailable metrics."""
    config = document.config
    notes = [f"data: {note}" for note in config.get("data_notes", [])]
    read = config.get("read")
    if read:
        per_epoch = sorted({lane.get("batches_per_epoch") for lane in config.get("lanes", [])}
                           - {None})  # fmt: skip
        epochs = f", {'/'.join(map(str, per_epoch))} batches per epoch" if per_epoch else ""
        notes.append(f"read: {'one endless stream' if read == 'stream' else 'epoch by epoch'}"
                     f"{epochs}")  # fmt: skip
    for lane in document.lanes:
        notes += _transients(lane)
        if lane.reason:
            notes.append(f"lane {lane.lane}: {lane.status}: {lane.reason}")
        if lane.figures.skipped_files:
            notes.append(
                f"lane {lane.lane}: skipped {lane.figures.skipped_files} undecodable files"
            )
    if config.get("consumer_note"):
        notes.append(f"consumer: {config['consumer_note']}")
    unavailable: dict[str, set[str]] = {}
    for item in document.unavailable_metrics:
        unavailable.setdefault(item["reason"], set()).add(item["metric"])
    notes += [f"unavailable: {', '.join(sorted(m))}: {r}" for r, m in unavailable.items()]
    if document.status == "running":
        notes.append("the run is still going: figures so far")
    return notes


def _transients(lane: LaneDocument) -> list[str]:
    """A lane's start-up, warm-up, epoch starts and consumer alone: measured, and apart from
    its steady figures."""
    figures = lane.figures
    parts = []
    if figures.startup_s:
        parts.append(f"its process started in {figures.startup_s:.1f} s")
    if figures.build_s:
        parts.append(f"the pipeline built in {figures.build_s:.1f} s")
    if figures.warmup_batches:
        settled = ", not settled" if figures.warmup_settled is False else ""
        warm = counted(figures.warmup_batches, "batch")
        parts.append(f"warm-up {warm}, {figures.warmup_s:.1f} s{settled}")
    if figures.capped:
        parts.append(
            "measuring stopped at its time limit before images/s was known within the "
            "precision asked (--precision): its ± says how well it is known"
        )
    out = [f"lane {lane.lane}: " + "; ".join(parts)] if parts else []
    start = figures.epoch_start
    if start:
        split = ""
        if start.loader_start_ms is not None and start.refill_ms is not None:
            split = (
                f" ({start.loader_start_ms:,.0f} ms starting the loader, "
                f"{start.refill_ms:,.0f} ms refilling its prefetch)"
            )
        tails = ""
        if start.ends:
            tails = (
                f"; {start.ends} epoch tails (the last {start.tail_batches} of each epoch's "
                f"batches), {start.tail_ms:,.0f} ms each: {start.tail_share:.1%}"
            )
        out.append(
            f"lane {lane.lane}: {start.starts} epoch starts, {start.stall_ms:,.0f} ms "
            f"each{split}: {start.share:.1%} of the time{tails}"
        )
    alone = figures.consumer_alone
    if alone and alone.get("images_per_s"):
        tuned = f" (tuned first, in {alone['tune_s']:.1f} s)" if alone.get("tune_s") else ""
        rate = IMAGES_PER_S.text(alone["images_per_s"], alone.get("images_per_s_error"))
        out.append(
            f"lane {lane.lane}: the consumer alone{tuned}, on batches already on the device: {rate}"
        )
    return out


def epochs_lines(epochs: EpochsRun | None) -> list[str]:
    """Your setting read epoch by epoch, against the same read as one stream."""
    if epochs is None:
        return []
    if epochs.images_per_s is None:
        return [f"epoch by epoch: not measured{because(epochs.reason)}"]
    shown = IMAGES_PER_S.text(epochs.images_per_s, epochs.images_per_s_error)
    line = (
        f"epoch by epoch (num_workers={epochs.num_workers}, "
        f"{counted(epochs.batches_per_epoch, 'batch')} per epoch, as a `for` loop per epoch "
        f"reads it): {shown}"
    )
    if epochs.cost_frac is not None:
        side = "below" if epochs.cost_frac >= 0 else "above"
        line += (
            f", {abs(epochs.cost_frac):.1%} {side} the same read as one stream "
            f"({IMAGES_PER_S.text(epochs.stream_images_per_s)})"
        )
    start = epochs.epoch_start
    if start:
        line += f"; each epoch start {start.stall_ms:,.0f} ms, {start.share:.1%} of the time"
    return [line]


def because(reason: str | None) -> str:
    """': REASON' to follow what did not happen; nothing where no reason was recorded."""
    return f": {reason}" if reason else ""


def run_devices(document: RunDocument) -> tuple[str, ...]:
    """A run's lanes' devices: "cuda:N", or "cpu"."""
    return tuple(lane.device for lane in document.lanes)


def diagnosis_lines(
    verdict: Verdict,
    recommendations: Sequence[Recommendation],
    asides: Sequence[Recommendation] = (),
    scope: str = "",
    agreed: bool = True,
    findings: Sequence[Verdict] = (),
) -> list[str]:
    """A verdict with its evidence, the other findings (`also_lines`), then the
    recommendations, ranked, then the changes set aside (below yours); `scope` says whose
    images/s they are (`job_scope`); `agreed`: whether the run that measured a recommendation
    again agreed with it (it is "verified" only then)."""
    lines = [f"verdict: {headline(verdict)}"] + [f"  - {item.text}" for item in verdict.evidence]
    lines += also_lines(verdict, findings)
    for title, items in (("recommendations", recommendations),
                         (f"not recommended: {ASIDE}", asides)):  # fmt: skip
        if items:
            lines.append(f"{title}:")
        for rank, item in enumerate(items, 1):
            lines += _recommendation_lines(rank, item, scope, agreed)
    return lines


ASIDE = "each with why, in its last note"  # what sets a change aside is said by each


def also_lines(
    verdict: Verdict, findings: Sequence[Verdict], indent: str = "", headlines: bool = False
) -> list[str]:
    """The findings besides the verdict, worst first, one of each kind (its worst lane's), each
    with its first evidence: what else costs the run (epoch starts beside the CPU's cap, a step
    slowed by the loader); `headlines`: their titles alone."""
    lines, told = [], {verdict.kind}
    for finding in sorted(findings, key=verdict_rank, reverse=True):
        if finding.kind in told:  # the verdict's own kind, or a kind told for a worse lane
            continue
        told.add(finding.kind)
        lines.append(f"{indent}also: {headline(finding)}")
        if not headlines:
            lines += [f"{indent}  - {item.text}" for item in finding.evidence[:1]]
    return lines


def loader_lines(
    loaders: Sequence[tuple[RunDocument, Verdict, Sequence[Recommendation], Sequence[Verdict]]],
) -> list[str]:
    """What a watched script's loaders come to, given the training loader (the most batches)
    first: each one's verdict (or why it is not judged), its other findings' titles and its
    first change."""
    lines = []
    for index, (document, verdict, recommendations, findings) in enumerate(loaders):
        batches = sum(lane.figures.batches for lane in document.lanes)
        role = ", the training loader" if index == 0 and len(loaders) > 1 else ""
        told = headline(verdict, partial_words(document))
        if verdict.kind is VerdictKind.UNKNOWN or verdict.kind in FED_KINDS:
            told += f": {verdict.evidence[0].text}"  # what was measured, and how it tells
        measured = counted(batches, "batch")
        lines.append(f"{document.label or document.run_id}{role}, {measured} measured: {told}")
        lines += also_lines(verdict, findings, "  ", headlines=True)
        if recommendations:
            scope = job_scope(run_devices(document))
            lines.append(f"  first change: {recommendation_text(recommendations[0], scope)}")
        lines += [f"  {line}" for line in offer_lines(document, recommendations)]
        lines.append(f"  probe show {document.run_id}")
    return lines


def partial_words(document: RunDocument) -> str:
    """Why a run's verdict is partial, as it is when told: the lanes still running ("rank 1
    still running", where the answer at exit was told before they ended), else that the run
    did not complete."""
    running = [lane.lane for lane in document.lanes if lane.status == RunStatus.RUNNING.value]
    if document.status != RunStatus.RUNNING.value or not running:
        return "the run did not complete"
    word = "rank" if document.config.get("torchrun") else "lane"
    named = ", ".join(map(str, running[:-1])) + " and " * (len(running) > 1) + str(running[-1])
    return f"{word}{'s' * (len(running) > 1)} {named} still running"


def _recommendation_lines(
    rank: int, item: Recommendation, scope: str, agreed: bool = True
) -> list[str]:
    predicted = item.predicted_images_per_s
    line = f"  {rank}. {item.setting}: {item.action}"
    if predicted is not None:
        shown = IMAGES_PER_S.text(predicted, item.predicted_error)
        line += f"; predicted {shown}{scope} ({item.basis})"
    else:
        line += f" ({item.basis})"
    again = measured_again(item, agreed)
    if again:
        line += f"; {again}"
    return [line, *(f"     {note}" for note in item.notes)]
