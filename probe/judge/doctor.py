"""The doctor: the whole diagnosis in one session on lanes kept warm.

It measures your setting first, and predicts from that run the DataLoader's images/s against
num_workers (`probe.judge.model`); it measures the knee the curve predicts and one setting beside
it. Where a term of the curve was not measured, it searches the workers from your setting
instead (up while more help, down while fewer do as well). It reads your setting epoch by
epoch where a shard is short enough for epoch starts to matter, runs DALI, diagnoses your
setting, ranks the changes by the throughput they were measured to give, and verifies the
first one by running it again. Every decision uses the points' errors: past the peak, the knee,
whether DALI is worth it, whether a verification agrees.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from typing import Any

from pipelines import Backend, BackendUnavailable, check_backend
from probe.judge.changes import Recommendation
from probe.judge.diagnosis import diagnose_run
from probe.judge.epochs import epoch_fixes
from probe.judge.evidence import Evidence, measured
from probe.judge.facts import run_facts
from probe.judge.knee import SweepAnalysis, SweepPoint, analyze_sweep, past_the_peak
from probe.judge.model import Curve, run_curve
from probe.judge.recommend import dali_advice, dali_worth_it, recommend_measured
from probe.judge.results import DaliRun, EpochsRun, Session, SessionKind, Verification
from probe.judge.session import (
    Budget,
    OnEvent,
    Points,
    WarmSession,
    check_budget,
    point_of,
    with_change,
    with_setting,
)
from probe.judge.thresholds import EPOCH_START_SHARE, KNEE_WITHIN, WAIT_MODERATE
from probe.judge.verdicts import Verdict, VerdictKind
from probe.measure.config import Checked, ProbeConfig, check_config
from probe.measure.consumers import model_note
from probe.measure.lane import Read
from probe.measure.runner import Lanes
from probe.metrics import CPU, IMAGES_PER_S, MEMORY, NVJPG
from probe.records import RunStatus
from probe.steady import Estimate, above, at_least, margin
from probe.store.db import Store
from probe.store.documents import read_run

# Read epoch by epoch too where a stall of one batch per worker would cost this share of an
# epoch (a DataLoader refills one batch per worker at each epoch start).
EPOCHS_WORTH_MEASURING = EPOCH_START_SHARE / 2
EPOCHS_POINTS = 3  # reading whole epochs, each opening on its stall, costs about three points
REFINE_KNEE = 2  # halvings of the gap below the knee the doctor may measure
PREDICTED_POINTS = 3  # DataLoader settings measured around a predicted knee, yours included
NEIGHBOUR_STEP = 0.25  # the setting beside the predicted knee: a quarter of it away


def run_doctor(
    base: ProbeConfig,
    workers: list[int],
    baseline_workers: int,
    dali_threads: int,
    budget_s: float,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_event: OnEvent = lambda kind, payload: None,
    started: float | None = None,
) -> Session:
    """The whole diagnosis: your setting, the worker search, DALI, the epoch reading, the
    verdict, the recommendations, the verification. Stores the session and returns it (its
    document: `Session.to_json`).

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
        session = WarmSession(store, "doctor", stop, on_event, lanes, checked, budget)
        points = Points(session, base, "num_workers")
        heading: dict[str, Any] = {
            "kind": SessionKind.DOCTOR, "session_id": session.session_id,
            "created": session.created, "consumer": str(base.consumer), "budget_s": budget_s,
        }  # fmt: skip
        baseline = points.measure(baseline_workers, reserve=0)
        if baseline is None:  # nothing to answer on: said, and kept with what it measured
            why = points.skipped[-1].reason if points.skipped else "it was not measured"
            unanswered = Session(
                **heading,
                status=RunStatus.INTERRUPTED if stop.is_set() else RunStatus.FAILED,
                reason=f"your setting, num_workers={baseline_workers}, was not measured: {why}",
                elapsed_s=budget.elapsed(),
                skipped=tuple(points.skipped),
                run_ids=tuple(session.run_ids),
            )
            session.save(unanswered)
            return unanswered
        assert baseline.run_id is not None
        curve = run_curve(store, baseline.run_id)
        if curve is None:  # a term was not measured: the ladder, measured
            _search(points, grid, baseline, reserve)
        else:
            _search_predicted(points, curve, baseline, reserve)
        analysis = analyze_sweep(list(points.measured.values()), "num_workers")
        # DataLoader points before DALI's: its workers then fork from a process DALI's threads
        # have not run in yet (all but a verification of num_workers)
        epochs = _epochs_point(session, base, baseline, checked, reserve)
        dali = _dali_point(session, base, dali_threads, dali_reason)
        verdict = _baseline_verdict(store, baseline, analysis, points)
        if verdict.reliable:
            dali = replace(dali, advice=dali_advice(analysis, dali, verdict))
            trade = dali_trade(store, analysis.best, dali) if dali_worth_it(analysis, dali) else []
            recommendations = recommend_measured(analysis, baseline, verdict, dali, trade, curve)
            recommendations += _epoch_recommendations(store, epochs, baseline)
        else:
            recommendations = recommend_measured(analysis, baseline, verdict)
        verify = _verify(session, base, recommendations)
    if verify is not None:
        measured_rate = verify.measured_images_per_s
        recommendations[0] = replace(recommendations[0], measured_images_per_s=measured_rate)
    status, reason = points.status()
    if verify is None and status is RunStatus.COMPLETED and verdict.reliable:
        reason = "partial: the budget ran out before the verification"
    result = Session(
        **heading,
        status=status,
        reason=reason,
        elapsed_s=budget.elapsed(),
        points=analysis.points,
        best=analysis.best,
        knee=analysis.knee,
        oversubscribed=tuple(p.setting for p in analysis.oversubscribed),
        skipped=tuple(points.skipped),
        run_ids=tuple(session.run_ids),
        precision=base.precision,
        startup_s=session.startup_s,
        consumer_alone=session.consumer_alone(),
        consumer_note=model_note(base.consumer),
        lanes=len(base.lanes),
        devices=tuple("cpu" if p.device is None else f"cuda:{p.device.index}" for p in base.lanes),
        verdict=verdict,
        verdict_run_id=baseline.run_id,
        recommendations=tuple(recommendations),
        dali=dali,
        epochs=epochs,
        verify=verify,
        curve=curve,
    )
    session.save(result)
    return result


def _dali_unavailable() -> str | None:
    try:
        check_backend(Backend.DALI)
    except BackendUnavailable as error:
        return str(error)
    return None


def _search(points: Points, grid: list[int], baseline: SweepPoint, reserve: int) -> None:
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
        busy = max(facts, key=lambda f: f.figures.cpu_pct or 0.0)
        points.skip(
            higher,
            f"the CPU is saturated at num_workers={baseline.setting} (the lane used "
            f"{CPU.text(busy.figures.cpu_pct or 0.0)}, {busy.cores_per_lane_text}): more "
            "workers cannot add CPU",
        )
    else:
        for position, value in enumerate(higher):
            best = points.best()
            point = points.measure(value, reserve)
            if points.session.stop.is_set():  # what follows was not reached: no verdict on it
                points.skip(higher[position + 1 :], "interrupted")
                break
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
        if middle in points.tried() or points.measure(middle, reserve) is None:
            break


def _search_predicted(points: Points, curve: Curve, baseline: SweepPoint, reserve: int) -> None:
    """Around the knee the curve predicts from your setting's run: the knee, then one setting
    on the side the measurements leave open (fewer, where the knee measured as fast as the best
    so far; more, where it fell short). At most PREDICTED_POINTS settings with yours."""
    settings = curve.settings()
    # the knee is measured within KNEE_WITHIN of the best: aimed at half that, the model's
    # error leaves the setting measured inside it
    knee = curve.knee(settings, KNEE_WITHIN / 2)
    if knee not in points.tried():
        points.measure(knee, reserve)
    if len(points.measured) >= PREDICTED_POINTS or knee not in points.measured:
        return
    best = points.best()
    step = max(1, round(knee * NEIGHBOUR_STEP))
    enough = at_least(points.measured[knee].estimate, 1 - KNEE_WITHIN, best.estimate)
    neighbour = knee - step if enough else knee + step
    if neighbour < 0 or neighbour in points.tried():
        return
    if enough and neighbour < baseline.setting < knee:
        return  # yours, below the knee, was measured already
    points.measure(neighbour, reserve)


def _dali_point(
    session: WarmSession, base: ProbeConfig, threads: int, reason: str | None
) -> DaliRun:
    """DALI on the same lanes: the decoder asked for, else mixed on a GPU and cpu without."""
    decoder = base.lane_spec(base.lanes[0]).dali_decoder.value
    empty = DaliRun(decoder, threads)
    if reason is not None:
        return replace(empty, reason=reason)
    if not session.budget.fits():
        return replace(empty, reason="the budget ran out before DALI ran")
    document = session.measure(with_setting(base, "num_threads", threads))
    if document is None:
        return replace(empty, reason="interrupted before DALI ran")
    if document.status != RunStatus.COMPLETED.value:
        return replace(empty, run_id=document.run_id, reason=document.reason)
    point = point_of(session.store, document, threads)
    return replace(
        empty,
        images_per_s=point.images_per_s,
        images_per_s_error=point.images_per_s_error,
        run_id=point.run_id,
        data_wait_frac=point.data_wait_frac,
        host_busy=point.host_busy,
        reason=None if point.estimate.judged else "too few batches to judge",
    )


def _epochs_point(
    session: WarmSession, base: ProbeConfig, baseline: SweepPoint, checked: Checked, reserve: int
) -> EpochsRun:
    """Your setting read epoch by epoch, where a shard is short enough for its epoch starts
    to matter: what they cost against the same setting read as a stream."""
    images = min(checked.shard_images.values())
    batch = base.spec.batch_size
    per_epoch = math.ceil(images / batch)
    refill = max(1, baseline.setting)  # batches: one per worker
    out = EpochsRun(
        num_workers=baseline.setting,
        batches_per_epoch=per_epoch,
        persistent_workers=base.spec.dataloader.persistent_workers,
        stream_images_per_s=baseline.images_per_s,
        reason=None,
    )
    if images < batch:
        return replace(out, reason=f"a shard holds {images} images, less than one batch")
    if refill / (per_epoch + refill) < EPOCHS_WORTH_MEASURING:
        return replace(
            out,
            reason=f"{per_epoch} batches per epoch: a refill of {refill} batches would cost "
            f"under {EPOCHS_WORTH_MEASURING:.1%} of an epoch",
        )
    if not session.budget.fits(reserve + EPOCHS_POINTS):
        return replace(out, reason="the budget cannot fit it besides DALI and the verification")
    config = with_setting(base, "num_workers", baseline.setting)
    config = replace(config, read=Read.EPOCHS, label=f"num_workers={baseline.setting}, epochs")
    document = session.measure(config)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return replace(out, reason="interrupted" if document is None else document.reason)
    point = point_of(session.store, document, baseline.setting)
    stream = baseline.images_per_s
    return replace(
        out,
        run_id=document.run_id,
        images_per_s=point.images_per_s,
        images_per_s_error=point.images_per_s_error,
        cost_frac=1 - point.images_per_s / stream if stream else None,
        epoch_start=document.lanes[0].figures.epoch_start,
    )


def _baseline_verdict(
    store: Store, baseline: SweepPoint, analysis: SweepAnalysis, points: Points
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
            f"sweep: num_workers={best.setting} was best "
            f"({IMAGES_PER_S.text(best.images_per_s, best.images_per_s_error)}, "
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


def _epoch_recommendations(
    store: Store, epochs: EpochsRun, baseline: SweepPoint
) -> list[Recommendation]:
    """Where reading epoch by epoch cost EPOCH_START_SHARE or more: what takes it away, as
    measured against your setting read as one stream."""
    if epochs.run_id is None or not epochs.epoch_start:
        return []
    if epochs.epoch_start.share < EPOCH_START_SHARE:
        return []
    assert baseline.run_id is not None
    stream = {
        lane.lane: lane.figures.images_per_s for lane in read_run(store, baseline.run_id).lanes
    }
    basis = f"measured: your setting read as one stream, run {baseline.run_id}"
    return epoch_fixes(run_facts(store, epochs.run_id), stream, basis)


def dali_trade(store: Store, best: SweepPoint, dali: DaliRun) -> list[str]:
    """What moving to DALI frees (CPU) and costs (GPU memory, GPU time), as measured."""
    assert best.run_id is not None and dali.run_id is not None
    torch_run, dali_run = read_run(store, best.run_id), read_run(store, dali.run_id)
    notes = []
    torch_cpu = (torch_run.cpu_pct or 0.0) * CPU.scale
    dali_cpu = (dali_run.cpu_pct or 0.0) * CPU.scale
    if torch_cpu or dali_cpu:
        freed = torch_cpu - dali_cpu
        verb = f"frees {freed:.1f} CPU cores" if freed >= 0 else f"uses {-freed:.1f} more CPU cores"
        notes.append(
            f"{verb}: the DataLoader at num_workers={best.setting} used {torch_cpu:.1f}, DALI "
            f"{dali_cpu:.1f}"
        )
    torch_memory = MEMORY.of_run(lane.figures.memory_used_mib for lane in torch_run.lanes)
    dali_memory = MEMORY.of_run(lane.figures.memory_used_mib for lane in dali_run.lanes)
    if torch_memory is not None and dali_memory is not None:
        notes.append(f"costs {dali_memory - torch_memory:+,.0f} MiB of GPU memory")
    lane, torch_lane = dali_run.lanes[0].figures, torch_run.lanes[0].figures
    busy = []
    if lane.nvjpg_pct is not None:
        busy.append(f"the hardware {NVJPG.label} {NVJPG.text(lane.nvjpg_pct)} busy")
    if lane.busy is not None:
        # the GPU's busy-ness by the metric each run had: GPM's SM activity, else NVML's
        # kernel-active, which overstates it
        against = ""
        if torch_lane.sm_active_pct is not None:
            shown = measured(torch_lane.busy, torch_lane.sm_active_pct) if (
                torch_lane.busy is not None and torch_lane.busy is not lane.busy
            ) else f"{torch_lane.sm_active_pct:.0f}%"  # fmt: skip
            against = f", against {shown} with the DataLoader"
        busy.append(f"{measured(lane.busy, lane.sm_active_pct)}{against}")
    if busy:
        notes.append("costs GPU time: decoding runs on the GPU (" + "; ".join(busy) + ")")
    return notes


def _verify(
    session: WarmSession, base: ProbeConfig, recommendations: list[Recommendation]
) -> Verification | None:
    """Runs the first recommendation again: what it predicted, what it measures, and whether
    the two agree within their errors and the drift between runs."""
    if not recommendations or session.stop.is_set():
        return None
    top = recommendations[0]
    predicted = top.predicted_images_per_s
    if predicted is None or not session.budget.fits():
        return None
    config = with_change(base, top.change)
    if config is None:  # nothing a session can run: epochs, samplers, storage
        return None
    document = session.measure(replace(config, label=f"verify {top.setting}"))
    if document is None or document.status != RunStatus.COMPLETED.value:
        return None
    point = point_of(session.store, document, 0)
    was = Estimate(predicted, top.predicted_error, point.blocks)
    allowed = margin(point.estimate, 1.0, was, drift=True)
    return Verification(
        change=top.change,
        predicted_images_per_s=predicted,
        predicted_images_per_s_error=top.predicted_error,
        measured_images_per_s=point.images_per_s,
        measured_images_per_s_error=point.images_per_s_error,
        agrees=abs(point.images_per_s - predicted) <= allowed,
        host_busy=point.host_busy,
        run_id=document.run_id,
    )
