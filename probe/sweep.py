"""Sweeps and the doctor: several runs on lanes kept warm, under one time budget.

A session starts its lanes once (`probe.runner.Lanes`): each consumer is built, tuned and timed
alone once, and each point after that rebuilds only the pipeline. A point is a stored run,
measured until its images/s is known within the precision asked (or MAX_POINT_S). The budget
drops the points it cannot fit at that quality, and says which, rather than measuring them
less. Every decision uses the points' errors: past the peak, the knee, whether DALI is worth it,
whether a verification agrees.

The doctor measures your setting first, then searches the DataLoader's workers from it (up while
more help, down while fewer do as well), reads your setting epoch by epoch where a shard is short
enough for epoch starts to matter, runs DALI, diagnoses your setting, ranks the changes by the
throughput they were measured to give, and verifies the first one by running it again.
"""

from __future__ import annotations

import math
import secrets
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipelines import Backend, BackendUnavailable, InputError, check_backend
from probe.consumers import ConsumerKind, model_note
from probe.diagnose import (
    DALI_WORTH_IT,
    EPOCH_START_SHARE,
    KNEE_WITHIN,
    WAIT_MODERATE,
    Evidence,
    Recommendation,
    SweepAnalysis,
    SweepPoint,
    Verdict,
    VerdictKind,
    analyze_sweep,
    diagnose_run,
    epoch_fixes,
    past_the_peak,
    run_facts,
)
from probe.lane import Read
from probe.runner import Checked, Lanes, ProbeConfig, check_config
from probe.steady import above, at_least, margin, plus_minus
from probe.store import RunStatus, SessionRecord, Store
from probe.summary import images_per_s_error, run_document

SWEEP_SCHEMA = "feedscope.sweep/1"
DOCTOR_SCHEMA = "feedscope.doctor/1"
MAX_POINT_S = 20.0  # a point measures at most this long, precise or not
POINT_GUESS_S = 5.0  # a point's cost (pipeline start, warm-up, measuring), until one is timed
# Read epoch by epoch too where a stall of one batch per worker would cost this share of an
# epoch (a DataLoader refills one batch per worker at each epoch start).
EPOCHS_WORTH_MEASURING = EPOCH_START_SHARE / 2
EPOCHS_POINTS = 3  # reading whole epochs, each opening on its stall, costs about three points
REFINE_KNEE = 2  # halvings of the gap below the knee the doctor may measure


def startup_guess(config: ProbeConfig) -> float:
    """Seconds to start a session's lanes, before they have been timed: the process and torch,
    CUDA on a GPU, a model built and tuned, the consumer timed alone."""
    on_gpu = any(plan.device is not None for plan in config.lanes)
    model = config.consumer.kind is ConsumerKind.MODEL
    return 6.0 + (6.0 if on_gpu else 0.0) + (15.0 if model else 0.0)


def check_budget(budget_s: float, points: int, config: ProbeConfig, what: str) -> None:
    """Raises InputError if `budget_s` cannot fit `points` trustworthy points, with the least
    that would."""
    startup = startup_guess(config)
    least = startup + points * POINT_GUESS_S
    if not budget_s >= least:
        count = "one trustworthy point" if points == 1 else f"{points} trustworthy points"
        precision = f"±{config.precision:.0%}" if config.precision else "its precision"
        raise InputError(
            f"--budget {budget_s:g} s cannot fit {count} for {what}: starting the lanes takes "
            f"about {startup:.0f} s, and a point measured to {precision} about "
            f"{POINT_GUESS_S:.0f} s; give --budget {math.ceil(least)} or more"
        )


class Budget:
    """A session's seconds: the lanes' start-up, then points, each costing its pipeline's start,
    its warm-up and its measuring. A point that cannot fit is dropped, never shortened."""

    def __init__(self, total_s: float, started: float | None = None) -> None:
        self.total_s = total_s
        self.started = time.monotonic() if started is None else started
        self.point_costs: list[float] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.total_s - self.elapsed()

    def point_cost(self) -> float:
        """What a point costs: the median of those timed so far, or a first guess."""
        return statistics.median(self.point_costs) if self.point_costs else POINT_GUESS_S

    def fits(self, reserve: int = 0) -> bool:
        """Whether a point fits, with `reserve` more points' worth left over for later."""
        return self.remaining() >= (1 + reserve) * self.point_cost()

    def ran(self, seconds: float) -> None:
        self.point_costs.append(seconds)


@dataclass
class _Session:
    store: Store
    kind: str
    stop: threading.Event
    on_event: Callable[[str, dict[str, Any]], None]
    lanes: Lanes
    checked: Checked
    budget: Budget
    run_ids: list[str] = field(default_factory=list)
    startup_s: float | None = None  # the lanes' start and the consumer timed alone

    def __post_init__(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.session_id = f"{self.kind}-{stamp}-{secrets.token_hex(2)}"
        self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def save(self, status: RunStatus, reason: str | None, document: dict[str, Any]) -> None:
        self.store.save_session(
            SessionRecord(
                session_id=self.session_id,
                kind=self.kind,
                created=self.created,
                status=status,
                reason=reason,
                hostname=socket.gethostname(),
                pid=None,
                document=document,
            )
        )

    def measure(self, config: ProbeConfig) -> dict[str, Any] | None:
        """Measures one point on the warm lanes; its run document (None: stopped before)."""
        if self.stop.is_set():
            return None
        cap = min(MAX_POINT_S, max(1.0, self.budget.remaining()))
        config = replace(config, batches=None, duration_s=None, max_s=cap)
        self.on_event("start", {"label": config.label, "max_s": cap})
        started = time.monotonic()
        run_id = self.lanes.measure(config, self.store, self.checked, session_id=self.session_id)
        self.run_ids.append(run_id)
        document = run_document(self.store, run_id)
        wall = time.monotonic() - started
        if self.startup_s is None:  # the first point also started the lanes
            self.startup_s = max(
                (lane.get("startup_s") or 0.0)
                + ((lane.get("consumer_alone") or {}).get("seconds") or 0.0)
                for lane in document["lanes"]
            )
            wall = max(0.0, wall - self.startup_s)
        self.budget.ran(wall)
        self.on_event("run", document)
        return document

    def consumer_alone(self) -> dict[str, Any] | None:
        """The consumer alone (lane 0's), as the lanes measured it once."""
        return self.lanes.consumer_alone.get(min(self.lanes.plans), None)


def with_setting(config: ProbeConfig, knob: str, value: int) -> ProbeConfig:
    """The same probe with `num_workers` (DataLoader) or `num_threads` (DALI) set to `value`."""
    spec = config.spec
    if knob == "num_workers":
        spec = replace(spec, dataloader=replace(spec.dataloader, num_workers=value))
        return replace(config, backend=Backend.TORCH, spec=spec, label=f"num_workers={value}")
    spec = replace(spec, dali=replace(spec.dali, num_threads=value))
    return replace(config, backend=Backend.DALI, spec=spec, label=f"DALI num_threads={value}")


def point_of(store: Store, document: dict[str, Any], setting: int) -> SweepPoint:
    """A run as a sweep point: images/s over all lanes (errors added in quadrature), the worst
    lane's data-wait, and whether the host's other load could have moved it."""
    lanes = document["lanes"]
    worst = max(
        (lane for lane in lanes if lane["data_wait_frac"] is not None),
        key=lambda lane: lane["data_wait_frac"],
        default=None,
    )
    cpus = [lane["cpu_pct"] for lane in lanes if lane.get("cpu_pct") is not None]
    completed = document["status"] == RunStatus.COMPLETED.value
    return SweepPoint(
        setting=setting,
        images_per_s=document["images_per_s"] if completed else 0.0,
        data_wait_frac=None if worst is None else worst["data_wait_frac"],
        cpu_pct=sum(cpus) if cpus else None,
        run_id=document["run_id"],
        images_per_s_error=images_per_s_error(lanes),
        blocks=min((lane["blocks"] for lane in lanes), default=0),
        data_wait_frac_error=None if worst is None else worst["data_wait_frac_error"],
        host_busy=any(f.host_busy for f in run_facts(store, document["run_id"])),
    )


def _dali_unavailable() -> str | None:
    try:
        check_backend(Backend.DALI)
    except BackendUnavailable as error:
        return str(error)
    return None


class _Points:
    """The points of one knob measured so far, and those not measured, with why."""

    def __init__(self, session: _Session, base: ProbeConfig, knob: str) -> None:
        self.session, self.base, self.knob = session, base, knob
        self.measured: dict[int, SweepPoint] = {}
        self.skipped: list[dict[str, Any]] = []

    def skip(self, values: list[int], reason: str) -> None:
        self.skipped += [{"setting": v, "reason": reason} for v in values]

    def best(self) -> SweepPoint:
        return max(self.measured.values(), key=lambda p: p.images_per_s)

    def measure(self, value: int, reserve: int) -> SweepPoint | None:
        """Measures the setting if the budget fits it with `reserve` points left over."""
        session = self.session
        if session.stop.is_set():
            self.skip([value], "interrupted")
            return None
        if not session.budget.fits(reserve):
            precision = self.base.precision or 0.0
            self.skip([value], f"the budget cannot fit it measured to ±{precision:.0%}")
            return None
        document = session.measure(with_setting(self.base, self.knob, value))
        if document is None or document["status"] == RunStatus.INTERRUPTED.value:
            self.skip([value], "interrupted")
            return None
        if document["status"] == RunStatus.FAILED.value:
            self.skip([value], f"the run failed: {document['reason']}")
            return None
        point = point_of(session.store, document, value)
        if not point.estimate.judged:
            self.skip([value], f"too few batches to judge ({point.blocks} blocks)")
            return None
        self.measured[value] = point
        session.on_event("point", {"knob": self.knob, **vars(point)})
        return point


def run_sweep(
    base: ProbeConfig,
    knob: str,
    values: list[int],
    budget_s: float,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, payload: None,
    started: float | None = None,
) -> dict[str, Any]:
    """Measures the settings smallest first, on lanes kept warm, until throughput has clearly
    fallen past its peak; returns the sweep's document.

    Raises:
        InputError: fewer than two settings, or a budget that cannot fit two points.
    """
    values = sorted(set(values))
    if len(values) < 2:
        raise InputError("a sweep needs at least two settings")
    check_budget(budget_s, 2, base, "a sweep")
    checked = check_config(with_setting(base, knob, values[0]))
    budget = Budget(budget_s, started)
    stop = stop or threading.Event()
    with Lanes(base.lanes, base.consumer, checked.num_classes, stop) as lanes:
        session = _Session(store, "sweep", stop, on_event, lanes, checked, budget)
        points = _Points(session, base, knob)
        for position, value in enumerate(values):
            points.measure(value, reserve=0)
            measured = [points.measured[v] for v in values[: position + 1] if v in points.measured]
            if past_the_peak(measured):
                points.skip(values[position + 1 :], "past the peak")
                break
    analysis = analyze_sweep(list(points.measured.values()), knob) if points.measured else None
    status, reason = _status(session, analysis, points.skipped)
    document = {
        "schema": SWEEP_SCHEMA,
        "session_id": session.session_id,
        "status": status.value,
        "reason": reason,
        "created": session.created,
        "pipeline": "torch" if knob == "num_workers" else "dali",
        "consumer": str(base.consumer),
        "read": base.read.value,
        "precision": base.precision,
        "budget_s": budget_s,
        "elapsed_s": budget.elapsed(),
        "startup_s": session.startup_s,
        "consumer_alone": session.consumer_alone(),
        **_sweep_fields(analysis, points.skipped, knob),
        "host_busy": sorted(p.setting for p in points.measured.values() if p.host_busy),
        "run_ids": session.run_ids,
    }
    session.save(status, reason, document)
    return document


def _sweep_fields(
    analysis: SweepAnalysis | None, skipped: list[dict[str, Any]], knob: str
) -> dict[str, Any]:
    if analysis is None:
        return {
            "knob": knob, "points": [], "best": None, "knee": None, "oversubscribed": [],
            "skipped": skipped,
        }  # fmt: skip
    return {
        "knob": knob,
        "points": [point_dict(p, knob) for p in analysis.points],
        "best": point_dict(analysis.best, knob),
        "knee": point_dict(analysis.knee, knob),
        "oversubscribed": [p.setting for p in analysis.oversubscribed],
        "skipped": skipped,
    }


def point_dict(point: SweepPoint, knob: str) -> dict[str, Any]:
    return {
        knob: point.setting,
        "images_per_s": point.images_per_s,
        "images_per_s_error": point.images_per_s_error,
        "data_wait_frac": point.data_wait_frac,
        "data_wait_frac_error": point.data_wait_frac_error,
        "cpu_pct": point.cpu_pct,
        "host_busy": point.host_busy,
        "run_id": point.run_id,
    }


def _status(
    session: _Session, analysis: SweepAnalysis | None, skipped: list[dict[str, Any]]
) -> tuple[RunStatus, str | None]:
    if session.stop.is_set():
        return RunStatus.INTERRUPTED, "stopped before its end (interrupted)"
    if analysis is None:
        return RunStatus.FAILED, "no setting was measured well enough to judge"
    dropped = sorted(
        {item["reason"] for item in skipped if item["reason"].startswith("the budget")}
        | {item["reason"] for item in skipped if item["reason"].startswith("the run failed")}
    )
    if dropped:
        return RunStatus.COMPLETED, "partial: " + "; ".join(dropped)
    return RunStatus.COMPLETED, None


def run_doctor(
    base: ProbeConfig,
    workers: list[int],
    baseline_workers: int,
    dali_threads: int,
    budget_s: float,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, payload: None,
    started: float | None = None,
) -> dict[str, Any]:
    """The whole diagnosis: your setting, the worker search, DALI, the epoch reading, the
    verdict, the recommendations, the verification.

    Args:
        base: the probe (consumer, lanes, pipeline options, reading) every run shares.
        workers: the DataLoader worker counts the search may visit (the baseline is added).
        baseline_workers: your setting, whose run the verdict is about.
        dali_threads: DALI's threads for its run.
        started: when the budget started counting (the command's start); default now.

    Raises:
        InputError: the budget cannot fit one trustworthy point, or no lane could read a batch
            of its input.
    """
    check_budget(budget_s, 1, base, "a diagnosis")
    base = replace(base, read=Read.STREAM)  # the epoch reading is a point of its own
    checked = check_config(base)
    dali_reason = _dali_unavailable()
    budget = Budget(budget_s, started)
    stop = stop or threading.Event()
    grid = sorted(set(workers) | {baseline_workers})
    reserve = 0 if dali_reason else 1  # DALI comes after the search (a verification if it fits)
    with Lanes(base.lanes, base.consumer, checked.num_classes, stop) as lanes:
        session = _Session(store, "doctor", stop, on_event, lanes, checked, budget)
        points = _Points(session, base, "num_workers")
        baseline = points.measure(baseline_workers, reserve=0)
        if baseline is None:  # nothing to answer on: said, and kept with what it measured
            why = points.skipped[-1]["reason"] if points.skipped else "it was not measured"
            status = RunStatus.INTERRUPTED if stop.is_set() else RunStatus.FAILED
            said = f"your setting, num_workers={baseline_workers}, was not measured: {why}"
            unanswered: dict[str, Any] = {
                "schema": DOCTOR_SCHEMA, "session_id": session.session_id,
                "status": status.value, "reason": said, "created": session.created,
                "consumer": str(base.consumer), "verdict": None, "recommendations": [],
                "sweep": [], "knee": None, "skipped": points.skipped, "dali": None,
                "epochs": None, "verify": None, "budget_s": budget_s,
                "elapsed_s": budget.elapsed(), "run_ids": session.run_ids,
            }  # fmt: skip
            session.save(status, said, unanswered)
            return unanswered
        _search(points, grid, baseline, reserve)
        analysis = analyze_sweep(list(points.measured.values()), "num_workers")
        # DataLoader points before DALI's: its workers then fork from a process DALI's threads
        # have not run in yet (all but a verification of num_workers)
        epochs = _epochs_point(session, base, baseline, checked, reserve)
        dali = _dali_point(session, base, dali_threads, dali_reason)
        verdict = _baseline_verdict(store, baseline, analysis, points)
        recommendations = _doctor_recommendations(store, analysis, baseline, verdict, dali)
        if verdict.reliable:
            recommendations += _epoch_recommendations(store, epochs, baseline)
        verify = _verify(session, base, recommendations, dali_threads)
    if verify is not None and recommendations:
        recommendations[0] = replace(
            recommendations[0], measured_images_per_s=verify["measured_images_per_s"]
        )
    status, reason = _status(session, analysis, points.skipped)
    if verify is None and status is RunStatus.COMPLETED and verdict.reliable:
        reason = "partial: the budget ran out before the verification"
    document = {
        "schema": DOCTOR_SCHEMA,
        "session_id": session.session_id,
        "status": status.value,
        "reason": reason,
        "created": session.created,
        "consumer": str(base.consumer),
        "consumer_note": model_note(base.consumer),
        "lanes": len(base.lanes),
        "devices": ["cpu" if p.device is None else f"cuda:{p.device.index}" for p in base.lanes],
        "precision": base.precision,
        "budget_s": budget_s,
        "elapsed_s": budget.elapsed(),
        "startup_s": session.startup_s,
        "consumer_alone": session.consumer_alone(),
        "verdict": {**verdict.as_dict(), "run_id": baseline.run_id},
        "recommendations": [r.as_dict() for r in recommendations],
        "sweep": [point_dict(p, "num_workers") for p in analysis.points],
        "knee": point_dict(analysis.knee, "num_workers"),
        "oversubscribed": [p.setting for p in analysis.oversubscribed],
        "skipped": points.skipped,
        "host_busy": sorted(p.setting for p in points.measured.values() if p.host_busy),
        "dali": dali,
        "epochs": epochs,
        "verify": verify,
        "run_ids": session.run_ids,
    }
    session.save(status, reason, document)
    return document


def _search(points: _Points, grid: list[int], baseline: SweepPoint, reserve: int) -> None:
    """From your setting: up the grid while more workers measure significantly faster (not
    when your setting already feeds the consumer, nor when the CPU is saturated), then down
    while the fewest measured are still within the knee's reach of the best; then the gap
    between the knee and the setting below it that fell short, halved up to REFINE_KNEE
    times."""
    higher = [v for v in grid if v > baseline.setting]
    fed = baseline.data_wait_frac is not None and baseline.data_wait_frac < WAIT_MODERATE
    assert baseline.run_id is not None
    facts = run_facts(points.session.store, baseline.run_id)
    if fed:
        points.skip(
            higher,
            f"num_workers={baseline.setting} feeds the consumer: more workers cannot make it "
            "faster",
        )
    elif any(f.cpu_saturated for f in facts):
        busy = max(facts, key=lambda f: f.lane_cpu_pct or 0.0)
        points.skip(
            higher,
            f"the CPU is saturated at num_workers={baseline.setting} (the lane used "
            f"{(busy.lane_cpu_pct or 0) / 100:.1f} cores, {busy.cores_per_lane_text}): more "
            "workers cannot add CPU",
        )
    else:
        for position, value in enumerate(higher):
            best = points.best()
            point = points.measure(value, reserve)
            if point is None:
                continue
            if not above(point.estimate, 1.0, best.estimate):
                why = "past the peak" if past_the_peak([best, point]) else "no faster than fewer"
                points.skip(higher[position + 1 :], why)
                break
    lower = [v for v in reversed(grid) if v < baseline.setting]
    for position, value in enumerate(lower):
        fewest = points.measured[min(points.measured)]
        if not at_least(fewest.estimate, 1 - KNEE_WITHIN, points.best().estimate):
            points.skip(
                lower[position:],
                f"below the knee: num_workers={fewest.setting} is already more than "
                f"{KNEE_WITHIN:.0%} slower than the best",
            )
            break
        points.measure(value, reserve)
    for _ in range(REFINE_KNEE):  # the grid's steps double: the knee may lie between two
        knee = analyze_sweep(list(points.measured.values())).knee.setting
        short = [v for v in points.measured if v < knee]
        middle = (knee + max(short)) // 2 if short else knee
        tried = {item["setting"] for item in points.skipped} | set(points.measured)
        if middle in tried or points.measure(middle, reserve) is None:
            break


def _dali_point(
    session: _Session, base: ProbeConfig, threads: int, reason: str | None
) -> dict[str, Any]:
    decoder = "mixed" if base.lanes[0].device is not None else "cpu"
    setting = f"DALI decoder={decoder} num_threads={threads}"
    empty = {
        "images_per_s": None, "images_per_s_error": None, "setting": setting, "run_id": None,
        "data_wait_frac": None, "host_busy": False,
    }  # fmt: skip
    if reason is not None:
        return {**empty, "reason": reason}
    if not session.budget.fits():
        return {**empty, "reason": "the budget ran out before DALI ran"}
    document = session.measure(with_setting(base, "num_threads", threads))
    if document is None:
        return {**empty, "reason": "interrupted before DALI ran"}
    if document["status"] != RunStatus.COMPLETED.value:
        return {**empty, "run_id": document["run_id"], "reason": document["reason"]}
    point = point_of(session.store, document, threads)
    return {
        "images_per_s": point.images_per_s,
        "images_per_s_error": point.images_per_s_error,
        "setting": setting,
        "run_id": point.run_id,
        "data_wait_frac": point.data_wait_frac,
        "host_busy": point.host_busy,
        "reason": None if point.estimate.judged else "too few batches to judge",
    }


def _epochs_point(
    session: _Session, base: ProbeConfig, baseline: SweepPoint, checked: Checked, reserve: int
) -> dict[str, Any]:
    """Your setting read epoch by epoch, where a shard is short enough for its epoch starts
    to matter: what they cost against the same setting read as a stream."""
    images = min(checked.shard_images.values())
    batch = base.spec.batch_size
    per_epoch = math.ceil(images / batch)
    workers = max(1, baseline.setting)
    out: dict[str, Any] = {
        "setting": f"num_workers={baseline.setting}",
        "batches_per_epoch": per_epoch,
        "persistent_workers": base.spec.dataloader.persistent_workers,
        "run_id": None,
        "images_per_s": None,
        "images_per_s_error": None,
        "stream_images_per_s": baseline.images_per_s,
        "cost_frac": None,
        "epoch_start": None,
    }
    if images < batch:
        return {**out, "reason": f"a shard holds {images} images, less than one batch"}
    if workers / (per_epoch + workers) < EPOCHS_WORTH_MEASURING:
        return {
            **out,
            "reason": f"{per_epoch} batches per epoch: a refill of {workers} batches would "
            f"cost under {EPOCHS_WORTH_MEASURING:.1%} of an epoch",
        }
    if not session.budget.fits(reserve + EPOCHS_POINTS):
        return {**out, "reason": "the budget cannot fit it besides DALI and the verification"}
    config = with_setting(base, "num_workers", baseline.setting)
    config = replace(config, read=Read.EPOCHS, label=f"num_workers={baseline.setting}, epochs")
    document = session.measure(config)
    if document is None or document["status"] != RunStatus.COMPLETED.value:
        why = "interrupted" if document is None else document["reason"]
        return {**out, "reason": why}
    point = point_of(session.store, document, baseline.setting)
    starts = document["lanes"][0].get("epoch_start")
    return {
        **out,
        "run_id": document["run_id"],
        "images_per_s": point.images_per_s,
        "images_per_s_error": point.images_per_s_error,
        "cost_frac": 1 - point.images_per_s / baseline.images_per_s
        if baseline.images_per_s
        else None,
        "epoch_start": starts,
        "reason": None,
    }


def _baseline_verdict(
    store: Store, baseline: SweepPoint, analysis: SweepAnalysis, points: _Points
) -> Verdict:
    """Your setting's verdict, told what the sweep measured around it; with any point on a busy
    host, that the figures are not trusted."""
    assert baseline.run_id is not None  # points come from runs
    verdict = diagnose_run(store, baseline.run_id).verdict
    best, knee = analysis.best, analysis.knee
    gain = best.images_per_s / baseline.images_per_s - 1 if baseline.images_per_s > 0 else 0.0
    if best.setting == baseline.setting:
        text = f"sweep: num_workers={best.setting}, yours, was the best measured"
    else:
        text = (
            f"sweep: num_workers={best.setting} was best ({_pm(best)} images/s, "
            f"{gain:+.0%} on yours, num_workers={baseline.setting})"
        )
    text += f"; the knee is num_workers={knee.setting}"
    evidence = (*verdict.evidence, Evidence("images_per_s", best.images_per_s, text))
    busy = [p for p in points.measured.values() if p.host_busy]
    if busy:
        settings = ", ".join(f"num_workers={p.setting}" for p in busy)
        fed = verdict.kind is VerdictKind.FED  # fed even so: that answer holds
        note = Evidence(
            "host_busy",
            float(len(busy)),
            f"measured while other processes took the host's CPU: {settings}; "
            + (
                "fed even so, but fewer workers may do as well on a quiet host"
                if fed
                else "the sweep's knee and the DataLoader against DALI cannot be told on such "
                "figures"
            ),
        )
        if fed:
            return replace(verdict, evidence=(*evidence, note))
        return replace(
            verdict, kind=VerdictKind.HOST_BUSY, evidence=(*evidence, note), reliable=False
        )
    kind = verdict.kind
    if baseline in analysis.oversubscribed:
        kind = VerdictKind.OVERSUBSCRIBED
    elif kind is VerdictKind.STARVED_CPU_HEADROOM and not above(
        best.estimate, 1 + KNEE_WITHIN, baseline.estimate
    ):
        kind = VerdictKind.STARVED_LOADER_LIMIT  # more workers were measured: they do not help
    return replace(verdict, kind=kind, evidence=evidence)


def _pm(point: SweepPoint | dict[str, Any]) -> str:
    """'3,945 ± 40' for a point or a point's dict."""
    if isinstance(point, SweepPoint):
        return plus_minus(point.images_per_s, point.images_per_s_error)
    return plus_minus(point["images_per_s"], point.get("images_per_s_error"))


def _doctor_recommendations(
    store: Store,
    analysis: SweepAnalysis,
    baseline: SweepPoint,
    verdict: Verdict,
    dali: dict[str, Any],
) -> list[Recommendation]:
    if not verdict.reliable:
        return [
            Recommendation(
                "measure again on a quiet host: other processes took CPU the pipeline needs "
                "while it measured, so which setting is best cannot be told",
                "measure again",
                None,
                "not predicted: the figures are not trusted",
            )
        ]
    knee = analysis.knee
    out: list[Recommendation] = []
    measured = f"measured in the sweep, run {knee.run_id}"
    if knee.setting == baseline.setting:
        action = "no change: num_workers is at the knee of the sweep"
        if verdict.kind is VerdictKind.FED:
            action = "no change: compute-bound; the DataLoader keeps up and DALI would not help"
        out.append(
            Recommendation(
                action,
                f"num_workers={baseline.setting}",
                baseline.images_per_s,
                f"measured in the sweep, run {baseline.run_id}",
                predicted_error=baseline.images_per_s_error,
            )
        )
    elif knee.setting < baseline.setting:
        out.append(
            Recommendation(
                f"lower num_workers from {baseline.setting} to {knee.setting}: as fast within "
                f"{KNEE_WITHIN:.0%} and its error, with fewer processes and less CPU",
                f"num_workers={knee.setting}",
                knee.images_per_s,
                measured,
                predicted_error=knee.images_per_s_error,
            )
        )
    else:
        out.append(
            Recommendation(
                f"raise num_workers from {baseline.setting} to {knee.setting}: the smallest "
                f"setting within {KNEE_WITHIN:.0%} of the best measured",
                f"num_workers={knee.setting}",
                knee.images_per_s,
                measured,
                predicted_error=knee.images_per_s_error,
            )
        )
    if dali.get("images_per_s") and dali.get("reason") is None:
        dali_point = SweepPoint(0, dali["images_per_s"], images_per_s_error=dali.get(
            "images_per_s_error"))  # fmt: skip
        if above(dali_point.estimate, 1 + DALI_WORTH_IT, analysis.best.estimate):
            out.insert(
                0,
                Recommendation(
                    "move decoding and augmentation to DALI",
                    dali["setting"],
                    dali["images_per_s"],
                    f"measured in the DALI run {dali['run_id']}",
                    notes=tuple(_dali_trade(store, analysis.best, dali)),
                    predicted_error=dali.get("images_per_s_error"),
                ),
            )
        else:
            dali["advice"] = _dali_not_worth_it(analysis, dali, verdict)
    return out


def _epoch_recommendations(
    store: Store, epochs: dict[str, Any], baseline: SweepPoint
) -> list[Recommendation]:
    """Where reading epoch by epoch cost EPOCH_START_SHARE or more: what takes it away, as
    measured against your setting read as one stream."""
    if epochs.get("run_id") is None or not epochs.get("epoch_start"):
        return []
    if epochs["epoch_start"]["share"] < EPOCH_START_SHARE:
        return []
    facts = run_facts(store, epochs["run_id"])
    assert baseline.run_id is not None
    stream = {
        lane["lane"]: lane["images_per_s"] for lane in run_document(store, baseline.run_id)["lanes"]
    }
    basis = f"measured: your setting read as one stream, run {baseline.run_id}"
    return epoch_fixes(facts, stream, basis)


def _dali_trade(store: Store, best: SweepPoint, dali: dict[str, Any]) -> list[str]:
    """What moving to DALI frees (CPU) and costs (GPU memory, GPU time), as measured."""
    assert best.run_id is not None
    torch_doc = run_document(store, best.run_id)
    dali_doc = run_document(store, dali["run_id"])
    notes = []
    torch_cpu = sum(lane.get("cpu_pct") or 0.0 for lane in torch_doc["lanes"]) / 100
    dali_cpu = sum(lane.get("cpu_pct") or 0.0 for lane in dali_doc["lanes"]) / 100
    if torch_cpu or dali_cpu:
        freed = torch_cpu - dali_cpu
        verb = f"frees {freed:.1f} CPU cores" if freed >= 0 else f"uses {-freed:.1f} more CPU cores"
        notes.append(
            f"{verb}: the DataLoader at num_workers={best.setting} used {torch_cpu:.1f}, DALI "
            f"{dali_cpu:.1f}"
        )
    torch_memory = _total(torch_doc, "memory_used_mib")
    dali_memory = _total(dali_doc, "memory_used_mib")
    if torch_memory is not None and dali_memory is not None:
        notes.append(f"costs {dali_memory - torch_memory:+,.0f} MiB of GPU memory")
    lane = dali_doc["lanes"][0]
    if lane.get("nvjpg_pct") is not None or lane.get("sm_active_source"):
        busy = []
        if lane.get("nvjpg_pct") is not None:
            busy.append(f"the hardware JPEG decoder {lane['nvjpg_pct']:.0f}% busy")
        if lane.get("sm_active_source"):
            source = "GPM" if lane["sm_active_source"] == "gpm" else "NVML kernel-active"
            torch_busy = torch_doc["lanes"][0].get("sm_active_pct")
            against = (
                "" if torch_busy is None else f", against {torch_busy:.0f}% with the DataLoader"
            )
            busy.append(f"SM activity {lane['sm_active_pct']:.0f}% ({source}){against}")
        notes.append("costs GPU time: decoding runs on the GPU (" + "; ".join(busy) + ")")
    return notes


def _dali_not_worth_it(analysis: SweepAnalysis, dali: dict[str, Any], verdict: Verdict) -> str:
    best = analysis.best
    rate = dali["images_per_s"]
    gain = rate / best.images_per_s - 1 if best.images_per_s > 0 else 0.0
    if verdict.kind is VerdictKind.FED:
        return (
            f"DALI would not help: the DataLoader feeds the GPU (compute-bound); DALI measured "
            f"{_pm(dali)} images/s, {gain:+.0%} on num_workers={best.setting}"
        )
    return (
        f"DALI measured {_pm(dali)} images/s, {gain:+.0%} on the best DataLoader setting "
        f"(num_workers={best.setting}, {_pm(best)}): not significantly more than the "
        f"{DALI_WORTH_IT:.0%} a migration should gain"
    )


def _verify(
    session: _Session, base: ProbeConfig, recommendations: list[Recommendation], dali_threads: int
) -> dict[str, Any] | None:
    """Runs the first recommendation again: what it predicted, what it measures, and whether
    the two agree within their errors and the drift between runs."""
    if not recommendations or session.stop.is_set():
        return None
    top = recommendations[0]
    if top.predicted_images_per_s is None or not session.budget.fits():
        return None
    if top.setting.startswith("DALI"):
        config = with_setting(base, "num_threads", dali_threads)
    elif top.setting.startswith("num_workers="):
        config = with_setting(base, "num_workers", int(top.setting.split("=")[1]))
    else:
        return None
    document = session.measure(replace(config, label=f"verify {top.setting}"))
    if document is None or document["status"] != RunStatus.COMPLETED.value:
        return None
    point = point_of(session.store, document, 0)
    predicted = top.predicted_images_per_s
    measured = point.images_per_s
    was = SweepPoint(0, predicted, images_per_s_error=top.predicted_error)
    allowed = margin(point.estimate, 1.0, was.estimate, drift=True)
    return {
        "setting": top.setting,
        "predicted_images_per_s": predicted,
        "predicted_images_per_s_error": top.predicted_error,
        "measured_images_per_s": measured,
        "measured_images_per_s_error": point.images_per_s_error,
        "error_frac": (measured - predicted) / predicted if predicted else None,
        "agrees": abs(measured - predicted) <= allowed,
        "host_busy": point.host_busy,
        "run_id": document["run_id"],
    }


def _total(document: dict[str, Any], key: str) -> float | None:
    values = [lane.get(key) for lane in document["lanes"]]
    present = [v for v in values if v is not None]
    return sum(present) if present else None
