"""The doctor: the whole diagnosis in one session on lanes kept warm.

It measures your setting first, then what is most likely to gain, by what that run shows: where
the loader starves with the CPU saturated, DALI next (more workers cannot add CPU); otherwise the
DataLoader's workers first, around the knee its run's curve predicts (`probe.judge.model`), or,
where a term of the curve was not measured, a search from yours (up where the CPU has room, down
where yours feeds the consumer). Each point gets its share of the budget left
(`probe.judge.session`): a slow pipeline gets longer points, not a refusal. It reads your setting
epoch by epoch where a shard is short enough for epoch starts to matter, diagnoses your setting,
weighs DALI against the DataLoader's answer as measured (the cores DALI frees count), and
verifies the first recommendation by running it again. A verification that disagrees beyond the
errors and the drift decides: yours and the candidate are measured in turn on the same lanes,
and the answer follows those runs, or keeps yours and says why. Every decision uses the points'
errors.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pipelines import Backend, BackendUnavailable, check_backend
from probe.judge.changes import Change, Knob, Recommendation, workers
from probe.judge.diagnosis import diagnose_run
from probe.judge.epochs import epoch_fixes
from probe.judge.evidence import Evidence, gpu_sharing, gpu_sharing_evidence, measured
from probe.judge.facts import run_facts
from probe.judge.knee import SweepAnalysis, SweepPoint, analyze_sweep, past_the_peak
from probe.judge.model import Curve, run_curve
from probe.judge.recommend import (
    dali_advice,
    dali_recommendation,
    dali_worth_it,
    recommend_measured,
)
from probe.judge.results import (
    NOT_VERIFIED,
    CoresFreed,
    DaliRun,
    EpochsRun,
    InTurn,
    Session,
    SessionKind,
    Verification,
)
from probe.judge.session import (
    Budget,
    OnEvent,
    Points,
    WarmSession,
    budget_short,
    check_budget,
    few_blocks,
    point_of,
    startup_guess,
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
from probe.steady import Estimate, above, at_least, margin, pooled
from probe.store.db import Store
from probe.store.documents import read_run

# Read epoch by epoch too where a stall of one batch per worker would cost this share of an
# epoch (a DataLoader refills one batch per worker at each epoch start).
EPOCHS_WORTH_MEASURING = EPOCH_START_SHARE / 2
EPOCHS_POINTS = 3  # reading whole epochs, each opening on its stall, costs about three points
REFINE_KNEE = 2  # halvings of the gap below the knee the doctor may measure
PREDICTED_POINTS = 3  # DataLoader settings measured around a predicted knee, yours included
NEIGHBOUR_STEP = 0.25  # the setting beside the predicted knee: a quarter of it away
IN_TURN = 4  # runs of yours and the candidate, in turn, where a verification disagrees
# Where yours starves with the CPU saturated, DALI (decoding on the GPU, or on DALI's threads)
# is what may gain: it is measured before any worker.
DALI_FIRST = frozenset({VerdictKind.STARVED_CPU_SATURATED})


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
    """The whole diagnosis: your setting, then DALI or the worker search (in order of the gain
    they may bring), the epoch reading, the verdict, the recommendations, the verification.
    Stores the session and returns it (its document: `Session.to_json`).

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
    budget = Budget(budget_s, started, startup_guess(base))
    stop = stop or threading.Event()
    grid = sorted(set(workers) | {baseline_workers})
    with Lanes(base.lanes, base.consumer, checked.num_classes, stop) as lanes:
        session = WarmSession(store, "doctor", stop, on_event, lanes, checked, budget)
        points = Points(session, base, "num_workers")
        heading: dict[str, Any] = {
            "kind": SessionKind.DOCTOR, "session_id": session.session_id,
            "created": session.created, "consumer": str(base.consumer), "budget_s": budget_s,
            "precision": base.precision, "consumer_note": model_note(base.consumer),
            "lanes": len(base.lanes),
            "devices": tuple(
                "cpu" if p.device is None else f"cuda:{p.device.index}" for p in base.lanes
            ),
        }  # fmt: skip
        # planned after yours: DALI or the search, and the verification
        baseline = points.measure(baseline_workers, later=2, reserve=0)
        if baseline is None:  # nothing judged on: answered from its run where it measured
            result = _unanswered(session, points, baseline_workers, heading)
            session.save(result)
            return result
        assert baseline.run_id is not None
        curve = run_curve(store, baseline.run_id)
        first = diagnose_run(store, baseline.run_id).verdict
        cores = run_facts(store, baseline.run_id)[0].host_cpus
        dali: DaliRun | None = None
        if dali_reason is None and first.reliable and first.kind in DALI_FIRST:
            dali = _dali_point(session, base, dali_threads, dali_reason)
        reserve = (1 if dali is None and dali_reason is None else 0) + 1  # DALI, verification
        ahead = dali is not None and _weigh_dali(store, dali, baseline, baseline.estimate,
                                                 first, cores)[1]  # fmt: skip
        if ahead:  # the budget goes to checking DALI: no number of workers changes the answer
            points.skip(
                [v for v in grid if v != baseline.setting],
                "DALI measured worth the migration against yours: the workers were not searched",
            )
        elif curve is None:  # a term was not measured: the ladder, measured
            _search(points, grid, baseline, reserve)
        else:
            _search_predicted(points, curve, baseline, reserve)
        # DataLoader points before DALI's where it comes after them: their workers then fork
        # from a process DALI's threads have not run in yet
        if dali is None:
            dali = _dali_point(session, base, dali_threads, dali_reason)
        analysis = analyze_sweep(list(points.measured.values()), "num_workers")
        verdict = _baseline_verdict(store, baseline, analysis, points)
        recommendations, dali = _answer(store, analysis, baseline, verdict, dali, curve, cores)
        verify, recommendations, dali = _verify(
            session, base, recommendations, baseline, verdict, dali, cores
        )
        # what is left of the budget reads your setting epoch by epoch: what its starts cost
        epochs = _epochs_point(session, base, baseline, checked)
        if verdict.reliable:
            fixes = _epoch_recommendations(store, epochs, baseline)
            recommendations = _one_each([*recommendations, *fixes])
    status, reason = points.status()
    if verify is None and status is RunStatus.COMPLETED and verdict.reliable:
        why = budget_short(budget) if not budget.fits() else "it is no change a session can run"
        earlier = [] if reason is None else [reason.removeprefix("partial: ")]
        reason = "partial: " + "; ".join([*earlier, f"{NOT_VERIFIED}: {why}"])
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
        startup_s=session.startup_s,
        consumer_alone=session.consumer_alone(),
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


def _unanswered(
    session: WarmSession, points: Points, setting: int, heading: dict[str, Any]
) -> Session:
    """The session where your setting was not judged on: answered from its run alone where
    that measured batches (its verdict, and its own recommendations, estimated), else failed
    or interrupted, with why."""
    why = points.skipped[-1].reason if points.skipped else "it was not measured"
    reason = f"your setting, num_workers={setting}, was not measured: {why}"
    common: dict[str, Any] = {
        **heading,
        "elapsed_s": session.budget.elapsed(),
        "skipped": tuple(points.skipped),
        "run_ids": tuple(session.run_ids),
        "startup_s": session.startup_s,
        "consumer_alone": session.consumer_alone(),
    }
    run_id = session.run_ids[-1] if session.run_ids else None
    if run_id is not None and not session.stop.is_set():
        document = read_run(session.store, run_id)
        if any(lane.figures.batches for lane in document.lanes):
            diagnosis = diagnose_run(session.store, run_id)
            return Session(
                **common,
                status=RunStatus.COMPLETED,
                reason=f"partial: your setting, num_workers={setting}, {why}; the answer rests "
                "on its run alone",
                verdict=diagnosis.verdict,
                verdict_run_id=run_id,
                recommendations=diagnosis.recommendations,
            )
    status = RunStatus.INTERRUPTED if session.stop.is_set() else RunStatus.FAILED
    return Session(**common, status=status, reason=reason)


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
    """DALI on the same lanes (the decoder asked for, else mixed on a GPU and cpu without), for
    its share of the budget with the verification after it."""
    decoder = base.lane_spec(base.lanes[0]).dali_decoder.value
    empty = DaliRun(decoder, threads)
    if reason is not None:
        return replace(empty, reason=reason)
    if not session.budget.fits():
        return replace(empty, reason=budget_short(session.budget))
    document = session.measure(with_setting(base, "num_threads", threads), later=1)
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
        cpu_pct=point.cpu_pct,
        reason=None if point.estimate.judged else few_blocks(point, session.budget),
    )


def _epochs_point(
    session: WarmSession, base: ProbeConfig, baseline: SweepPoint, checked: Checked
) -> EpochsRun:
    """Your setting read epoch by epoch, where a shard is short enough for its epoch starts
    to matter and the budget left fits it: what they cost against the same setting read as a
    stream."""
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
    if not session.budget.fits(EPOCHS_POINTS - 1):  # whole epochs, each opening on its stall
        return replace(out, reason=budget_short(session.budget, EPOCHS_POINTS - 1))
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


def dali_trade(store: Store, reference: SweepPoint, dali: DaliRun) -> list[str]:
    """What moving to DALI costs, as measured against the DataLoader's `reference` point: GPU
    memory and GPU time, and a step it slows on the GPU (the CPU it frees is `CoresFreed`'s).
    """
    assert reference.run_id is not None and dali.run_id is not None
    torch_run, dali_run = read_run(store, reference.run_id), read_run(store, dali.run_id)
    notes = []
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
    shared = [f for f in run_facts(store, dali.run_id) if gpu_sharing(f) is not None]
    if shared:  # the step pays for DALI's kernels on its GPU: not a matter of DALI's threads
        notes.append(
            f"slows the step on the GPU: {gpu_sharing_evidence(shared[0])[0].text}; DALI's "
            "cpu decoder leaves the SMs to the model"
        )
    return notes


def _answer(
    store: Store,
    analysis: SweepAnalysis,
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    curve: Curve | None,
    cores: float,
) -> tuple[list[Recommendation], DaliRun]:
    """The recommendations, ranked: the DataLoader's answer (the knee, or yours), DALI before
    it where it is worth a migration against that answer's point, what takes epoch starts'
    stalls away; one recommendation a setting. DALI comes back with its weighing."""
    answer = recommend_measured(analysis, baseline, verdict, curve if verdict.reliable else None)
    if not verdict.reliable:
        return answer, dali
    point = _point_of(analysis, answer[0].change) or baseline
    dali, worth = _weigh_dali(store, dali, point, point.estimate, verdict, cores)
    if worth:
        notes = [dali.freed.text] if dali.freed is not None else []
        answer.insert(0, dali_recommendation(dali, [*notes, *dali_trade(store, point, dali)]))
    return _one_each(answer), dali


def _point_of(analysis: SweepAnalysis, change: Change) -> SweepPoint | None:
    """The measured point of a change of num_workers (None: another change)."""
    if change.knob is not Knob.NUM_WORKERS:
        return None
    return next((p for p in analysis.points if p.setting == change.value), None)


def _weigh_dali(
    store: Store,
    dali: DaliRun,
    point: SweepPoint,
    reference: Estimate,
    verdict: Verdict,
    cores: float,
) -> tuple[DaliRun, bool]:
    """DALI weighed against the DataLoader's `point` as measured (`reference`: its run, or its
    runs pooled once verified): whether it is worth a migration, the cores it frees, and where
    it is not worth it, by how much it falls short."""
    if not dali.judged or point.cpu_pct is None or dali.cpu_pct is None:
        return dali, False
    freed = CoresFreed(
        workers(point.setting).setting, point.cpu_pct * CPU.scale, dali.cpu_pct * CPU.scale, cores
    )
    worth = dali_worth_it(reference, dali, freed)
    advice = dali_advice(reference, freed.setting, dali, verdict, freed)
    return replace(dali, freed=freed, advice=advice), worth


def _one_each(recommendations: Sequence[Recommendation]) -> list[Recommendation]:
    """The recommendations with one for each setting: the first, best ranked, of those that
    name it (a setting has one prediction)."""
    seen: set[str] = set()
    out = []
    for item in recommendations:
        if item.setting not in seen:
            seen.add(item.setting)
            out.append(item)
    return out


def _verify(
    session: WarmSession,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification | None, list[Recommendation], DaliRun]:
    """Runs the first recommendation again: what it predicted against what it measures. Where
    the two disagree beyond their errors and the drift, that decides: a change that even its
    worse run bears out against yours stays, predicted at its runs' mean; one it does not is
    measured in turn with yours, and stays the answer only if those runs bear it out; your own
    setting, measured apart by more than that twice, is predicted at its runs' mean, and DALI
    is weighed against that again."""
    if not recommendations or session.stop.is_set() or not verdict.reliable:
        return None, recommendations, dali
    top = recommendations[0]
    predicted = top.predicted_images_per_s
    config = with_change(base, top.change)
    if predicted is None or config is None or not session.budget.fits():
        return None, recommendations, dali  # nothing a session can run: epochs, storage
    # its share leaves room for yours and the change in turn, should it disagree
    document = session.measure(replace(config, label=f"verify {top.setting}"), later=2)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return None, recommendations, dali
    point = point_of(session.store, document, 0)
    was = Estimate(predicted, top.predicted_error, point.blocks)
    agrees = abs(point.images_per_s - predicted) <= margin(point.estimate, 1.0, was, drift=True)
    verification = Verification(
        change=top.change,
        predicted_images_per_s=predicted,
        predicted_images_per_s_error=top.predicted_error,
        measured_images_per_s=point.images_per_s,
        measured_images_per_s_error=point.images_per_s_error,
        agrees=agrees,
        host_busy=point.host_busy,
        run_id=document.run_id,
    )
    if agrees:
        recommendations[0] = replace(top, measured_images_per_s=point.images_per_s)
        return verification, recommendations, dali
    return _disagreed(session, base, verification, point, recommendations, baseline, verdict,
                      dali, cores)  # fmt: skip


def _disagreed(
    session: WarmSession,
    base: ProbeConfig,
    verification: Verification,
    point: SweepPoint,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification, list[Recommendation], DaliRun]:
    """What a verification that disagrees with its prediction decides (`_verify`)."""
    top = recommendations[0]
    predicted = verification.predicted_images_per_s
    if top.change == workers(baseline.setting):
        return _yours_twice(session, verification, point, recommendations, baseline, verdict,
                            dali, cores)  # fmt: skip
    first = Estimate(predicted, top.predicted_error, point.blocks)
    worse = min(first, point.estimate, key=lambda e: e.value)
    if _bears_out(top.change, baseline.estimate, worse, baseline.setting, dali, cores):
        both = pooled([first, point.estimate])
        spread = abs(first.value - point.images_per_s) / 2  # the runs differ: so may the next
        outcome = (
            f"{_refuted(top, verification)}; even its lower run bears it out against yours "
            f"({IMAGES_PER_S.text(baseline.images_per_s, baseline.images_per_s_error)}): it "
            "stays the answer, predicted at its runs' mean"
        )
        stays = replace(
            top,
            predicted_images_per_s=both.value,
            predicted_error=math.hypot(both.error or 0.0, spread),
            measured_images_per_s=point.images_per_s,
            notes=(*top.notes, outcome),
        )
        out = [stays, *recommendations[1:]]
        return replace(verification, outcome=outcome), out, dali
    return _in_turn(session, base, verification, recommendations, baseline, dali, cores)


def _yours_twice(
    session: WarmSession,
    verification: Verification,
    again: SweepPoint,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification, list[Recommendation], DaliRun]:
    """Your setting ("no change") measured apart, beyond the errors and the drift, by its
    verification: the machine's rate moved between them. The answer keeps it, predicted at the
    two runs' mean, and DALI is weighed against that again."""
    both = pooled([baseline.estimate, again.estimate])
    moved = again.images_per_s / baseline.images_per_s - 1
    outcome = (
        f"your setting measured {IMAGES_PER_S.text(baseline.images_per_s)} and then "
        f"{IMAGES_PER_S.text(again.images_per_s)} ({moved:+.0%}): more than their errors and "
        f"the drift between runs; it is predicted at their mean, "
        f"{IMAGES_PER_S.text(both.value, both.error)}"
    )
    top = replace(
        recommendations[0],
        predicted_images_per_s=both.value,
        predicted_error=both.error,
        measured_images_per_s=again.images_per_s,
        notes=(*recommendations[0].notes, outcome),
    )
    out = [top, *recommendations[1:]]
    dali, worth = _weigh_dali(session.store, dali, baseline, both, verdict, cores)
    if worth and dali.change.setting not in {r.setting for r in out}:
        notes = [dali.freed.text] if dali.freed is not None else []
        out.insert(0, dali_recommendation(dali, notes))
        outcome += "; against that, DALI is worth the migration (measured once, not verified)"
    return replace(verification, outcome=outcome), _one_each(out), dali


def _in_turn(
    session: WarmSession,
    base: ProbeConfig,
    verification: Verification,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification, list[Recommendation], DaliRun]:
    """A change its verification disagreed with, measured in turn with yours on the same warm
    lanes (yours, the change, yours, the change, as the budget allows): it stays the answer,
    predicted at its runs' mean, only where those runs bear it out against yours; else the
    answer keeps yours, and says why."""
    top = recommendations[0]
    yours = workers(baseline.setting)
    turns = [(yours, with_setting(base, "num_workers", baseline.setting)),
             (top.change, with_change(base, top.change))] * (IN_TURN // 2)  # fmt: skip
    runs: list[InTurn] = []
    # runs in turn as long as half the shorter of yours and the verification, or none
    least = min(_measured_s(session.store, r) for r in (baseline.run_id, verification.run_id)) / 2
    for position, (change, config) in enumerate(turns):
        # the turns left share the budget, or, where that is too short, this pair alone
        fitting = (n for n in (len(turns) - position - 1, 1 - position % 2)
                   if session.budget.share(n) >= least)  # fmt: skip
        later = next(fitting, None)
        if session.stop.is_set() or config is None or later is None or not session.budget.fits():
            break
        label = f"in turn: {'yours, ' if change == yours else ''}{change.setting}"
        document = session.measure(replace(config, label=label), later=later)
        if document is None or document.status != RunStatus.COMPLETED.value:
            break
        point = point_of(session.store, document, 0)
        runs.append(
            InTurn(change.setting, point.images_per_s, point.images_per_s_error, document.run_id)
        )
    mine = [Estimate(r.images_per_s, r.images_per_s_error, 0) for r in runs if r.setting ==
            yours.setting]  # fmt: skip
    theirs = [Estimate(r.images_per_s, r.images_per_s_error, 0) for r in runs
              if r.setting == top.setting]  # fmt: skip
    refuted = _refuted(top, verification)
    if not mine or not theirs:
        needed = session.budget.needed(1)
        outcome = (
            f"{refuted}; the budget could not measure it in turn with yours (--budget {needed} "
            f"would): the answer keeps yours"
        )
        keep = _keep_yours(baseline, baseline.estimate, outcome, None)
        return (*_without(verification, runs, outcome, keep, recommendations), dali)
    a, b = pooled(mine), pooled(theirs)
    if _bears_out(top.change, a, b, baseline.setting, dali, cores):
        outcome = (
            f"{refuted}; measured in turn with yours, it gave {IMAGES_PER_S.text(b.value, b.error)}"
            f" against {IMAGES_PER_S.text(a.value, a.error)}: it stays the answer, predicted at "
            "its runs' mean"
        )
        stays = replace(
            top,
            predicted_images_per_s=b.value,
            predicted_error=b.error,
            measured_images_per_s=theirs[-1].value,
            basis=f"measured in turn with yours ({len(runs)} runs)",
            notes=(*top.notes, outcome),
        )
        out = _one_each([stays, *recommendations[1:]])
        return replace(verification, in_turn=tuple(runs), outcome=outcome), out, dali
    outcome = (
        f"{refuted}; measured in turn with yours, it gave {IMAGES_PER_S.text(b.value, b.error)} "
        f"against {IMAGES_PER_S.text(a.value, a.error)} for yours: the answer keeps yours"
    )
    keep = _keep_yours(baseline, a, outcome, mine[-1].value)
    return (*_without(verification, runs, outcome, keep, recommendations), dali)


def _measured_s(store: Store, run_id: str | None) -> float:
    """A run's measured seconds (its slowest lane's)."""
    if run_id is None:
        return 0.0
    return max((lane.figures.seconds for lane in read_run(store, run_id).lanes), default=0.0)


def _refuted(top: Recommendation, verification: Verification) -> str:
    """What a verification that disagrees says."""
    return (
        f"{top.setting} was predicted at {IMAGES_PER_S.text(top.predicted_images_per_s)} and "
        f"verified at {IMAGES_PER_S.text(verification.measured_images_per_s)} "
        f"({verification.error_frac or 0.0:+.0%}), beyond their errors and the drift"
    )


def _bears_out(
    change: Change, yours: Estimate, theirs: Estimate, setting: int, dali: DaliRun, cores: float
) -> bool:
    """Whether runs of a change, measured in turn with yours, bear it out: fewer workers as fast
    within KNEE_WITHIN, more workers faster, DALI worth a migration (their errors and the drift
    between runs allowed for)."""
    if change.knob is Knob.NUM_WORKERS and isinstance(change.value, int):
        if change.value < setting:
            return at_least(theirs, 1 - KNEE_WITHIN, yours)
        return above(theirs, 1.0, yours)
    if change.knob is Knob.PIPELINE:
        measured_dali = replace(dali, images_per_s=theirs.value, images_per_s_error=theirs.error)
        return dali_worth_it(yours, measured_dali, dali.freed)
    return False


def _keep_yours(
    baseline: SweepPoint, rate: Estimate, outcome: str, measured_rate: float | None
) -> Recommendation:
    return Recommendation(
        f"no change: keep num_workers={baseline.setting}",
        workers(baseline.setting),
        rate.value,
        f"measured: your setting, run {baseline.run_id}"
        + (", and in turn with the change its verification refuted" if measured_rate else ""),
        measured_images_per_s=measured_rate,
        notes=(outcome,),
        predicted_error=rate.error,
    )


def _without(
    verification: Verification,
    runs: list[InTurn],
    outcome: str,
    keep: Recommendation,
    recommendations: list[Recommendation],
) -> tuple[Verification, list[Recommendation]]:
    """The answer once a change is refuted: yours first, the change gone."""
    rest = [r for r in recommendations[1:] if r.setting != verification.change.setting]
    return (
        replace(verification, in_turn=tuple(runs), outcome=outcome),
        _one_each([keep, *rest]),
    )
