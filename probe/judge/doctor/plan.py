"""The doctor's plan: `run_doctor`, which orders the session (your setting first, then DALI or
the worker search by the gain they may bring, DALI's point, the verification, the epoch
reading), the searches that pick which DataLoader settings are measured, and the session where
your setting could not be judged on.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from pipelines import Backend, BackendUnavailable, check_backend
from probe.judge.changes import Knob, Recommendation
from probe.judge.changes import workers as yours
from probe.judge.dali_run import DaliRun
from probe.judge.diagnosis import diagnose_run
from probe.judge.doctor.answer import (
    answer,
    baseline_verdict,
    cap_as_measured,
    epoch_recommendations,
    keep_yours,
    knee_told,
    loader_at_best,
    smaller_first,
    verify,
    weigh_dali,
)
from probe.judge.doctor.dali_search import dali_search
from probe.judge.doctor.points import epochs_point, scaling_points
from probe.judge.facts import run_facts
from probe.judge.knee import SweepPoint, analyze_sweep, past_the_peak
from probe.judge.model import Curve, run_curve
from probe.judge.recommend import below_the_answer, one_each
from probe.judge.results import (
    DALI,
    NOT_VERIFIED,
    TORCH,
    EpochsRun,
    ScalePoint,
    Scaling,
    Session,
    SessionKind,
    Verification,
    alternation_source,
    in_alternation,
)
from probe.judge.scaling import predict
from probe.judge.session import (
    Budget,
    OnEvent,
    Points,
    WarmSession,
    budget_short,
    check_budget,
    startup_guess,
)
from probe.judge.thresholds import KNEE_WITHIN, WAIT_MODERATE
from probe.judge.verdicts import Verdict, VerdictKind
from probe.measure.config import ProbeConfig, check_config
from probe.measure.consumers import consumer_note
from probe.measure.lane import Read
from probe.measure.runner import Lanes
from probe.metrics import CPU, IMAGES_PER_S, signed
from probe.records import RunStatus
from probe.steady import Estimate, above, at_least, margin
from probe.store.db import Store
from probe.store.documents import read_run

REFINE_KNEE = 2  # halvings of the gap below the knee the doctor may measure
PREDICTED_POINTS = 3  # DataLoader settings measured around a predicted knee, yours included
NEIGHBOUR_STEP = 0.25  # the setting beside the predicted knee: a quarter of it away
# Where yours starves with the CPU saturated, DALI (decoding on the GPU, or on DALI's threads)
# is what may gain: it is measured before any worker.
DALI_FIRST = frozenset({VerdictKind.STARVED_CPU_SATURATED})
DALI_AHEAD = (
    "DALI measured worth the migration against the DataLoader at its best as your run predicts "
    "it: the workers were not searched"
)
DALI_FELL_BACK = (
    "not searched: DALI first measured worth the migration against the DataLoader at its best, "
    "and the budget went "
    "to checking it, which did not make it the answer; `probe sweep` searches the workers"
)


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
    scaling: bool = False,
    like: str | None = None,
    step_read: str | None = None,
) -> Session:
    """The whole diagnosis: your setting, then DALI or the worker search (in order of the gain
    they may bring), the epoch reading, the verdict, the recommendations, the verification;
    on several lanes, the job on 1 to N of them predicted (and with `scaling`, measured on 1
    and each power of two below N). Stores the session and returns it (its document:
    `Session.to_json`).

    Args:
        base: the probe (consumer, lanes, pipeline options, reading) every run shares.
        workers: the DataLoader worker counts the search may visit (the baseline is added).
        baseline_workers: your setting, whose run the verdict is about.
        dali_threads: DALI's threads where its search starts.
        started: when the budget started counting (the command's start); default now.
        like: the watched run whose job the session measured like (`probe doctor --like`).
        step_read: how the consumer standing in for `like`'s step was read from its batches,
            where that needs saying (a DDP job's: its ranks' step without their wait for each
            other); its consumer note says it.

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
            "precision": base.precision, "consumer_note": consumer_note(base.consumer, step_read),
            "lanes": len(base.lanes), "like": like,
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
            dali = dali_search(session, base, dali_threads, dali_reason, later=2)
        reserve = (1 if dali is None and dali_reason is None else 0) + 1  # DALI, verification
        ahead = dali is not None and _dali_ahead(store, dali, curve, baseline, first, cores)
        if ahead:  # the budget goes to checking DALI: no number of workers changes the answer
            points.skip([v for v in grid if v != baseline.setting], DALI_AHEAD)
        elif curve is None:  # a term was not measured: the ladder, measured
            _search(points, grid, baseline, reserve)
        else:
            _search_predicted(points, curve, baseline, reserve)
        # DataLoader points before DALI's where it comes after them: their workers then fork
        # from a process DALI's threads have not run in yet
        if dali is None:
            dali = dali_search(session, base, dali_threads, dali_reason)
        analysis = analyze_sweep(list(points.measured.values()), "num_workers")
        verdict = baseline_verdict(store, baseline, analysis, points)
        recommendations, asides, dali = answer(
            store, analysis, baseline, verdict, dali, curve, cores
        )
        verification, recommendations, dali = verify(
            session, base, recommendations, baseline, verdict, dali, cores
        )
        verdict = cap_as_measured(store, verdict, baseline, analysis, verification)
        scaled = _scaling(session, base, analysis.knee, curve, dali, cores, scaling)
        # what is left of the budget reads your setting epoch by epoch: what its starts cost
        epochs = epochs_point(session, base, baseline, checked)
        recommendations, asides, epochs, verification = _ranked(
            store, recommendations, asides, baseline, verdict, epochs, verification
        )
        if ahead and recommendations and recommendations[0].change.knob is not Knob.PIPELINE:
            _dali_fell_back(points, recommendations)
    status, reason = points.status()
    if verification is None and status is RunStatus.COMPLETED and verdict.reliable:
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
        knee=analysis.knee if knee_told(analysis, verdict.kind is VerdictKind.HOST_BUSY) else None,
        oversubscribed=tuple(p.setting for p in analysis.oversubscribed),
        skipped=tuple(points.skipped),
        run_ids=tuple(session.run_ids),
        startup_s=session.startup_s,
        consumer_alone=session.consumer_alone(),
        verdict=verdict,
        verdict_run_id=baseline.run_id,
        recommendations=tuple(recommendations),
        asides=tuple(asides),
        dali=dali,
        epochs=epochs,
        verify=verification,
        curve=curve,
        scaling=scaled,
    )
    session.save(result)
    return result


def _dali_ahead(
    store: Store,
    dali: DaliRun,
    curve: Curve | None,
    baseline: SweepPoint,
    verdict: Verdict,
    cores: float,
) -> bool:
    """Whether DALI, measured first, is worth the migration against the DataLoader at its
    best as your run predicts it (`loader_at_best`): not against yours, where more workers may
    come within its bar and are then measured."""
    loader, setting = loader_at_best(curve, [baseline], baseline)
    return weigh_dali(store, dali, baseline, loader, verdict, cores, setting)[1]


def _ranked(
    store: Store,
    recommendations: list[Recommendation],
    asides: list[Recommendation],
    baseline: SweepPoint,
    verdict: Verdict,
    epochs: EpochsRun,
    verification: Verification | None,
) -> tuple[list[Recommendation], list[Recommendation], EpochsRun, Verification | None]:
    """The answer, each setting the pairs measured at its one figure (`in_alternation`), any
    change predicted below it set aside (`below_the_answer`), then the epoch reading's fixes
    where your setting's verdict is relied on, each weighed against your setting read the same
    way, epoch by epoch (`_against_epochs`). Where the answer is no change, read as one stream,
    the endless sampler is what gives it that figure: said in its notes, not listed at it.
    Returns them, the changes set aside, the epoch reading against that same figure, and the
    verification, its outcome saying where the pairs' figure left the change it kept first
    below yours (`_below_yours`)."""
    recommendations = list(in_alternation(recommendations, verification))
    mine = None  # no change, at its one figure: its runs in alternation pooled, where paired
    if verdict.reliable:
        mine = in_alternation([keep_yours(baseline)], verification)[0]
    checked = recommendations[0] if recommendations else None
    recommendations, below = below_the_answer(recommendations, mine)
    taken = mine is not None and recommendations[0].change == mine.change  # yours now first
    if checked is not None and mine is not None and taken and checked.change != mine.change:
        below, verification = _below_yours(checked, mine, below, verification)
    stream, source = _yours_as_stream(recommendations, baseline, verification)
    fixes = epoch_recommendations(store, epochs, baseline, stream, source) if mine else []
    gaining, losing = _against_epochs(fixes, epochs)
    first = recommendations[0] if recommendations else None
    endless = next((f for f in gaining if f.change.knob is Knob.SAMPLER), None)
    rate = None if endless is None else endless.predicted_images_per_s
    if (
        first is not None
        and endless is not None
        and rate is not None
        and epochs.images_per_s
        and first.change == yours(baseline.setting)
    ):
        gaining.remove(endless)
        by_epoch = Estimate(epochs.images_per_s, epochs.images_per_s_error, 0)
        _, gain = _gain(Estimate(rate, endless.predicted_error, 0), by_epoch)
        note = (
            f"read epoch by epoch, as a `for` loop per epoch reads it, it gave "
            f"{IMAGES_PER_S.text(by_epoch.value, by_epoch.error)} (run {epochs.run_id}): an "
            f"endless sampler ({endless.setting}) reads it as one stream, at this figure, {gain}"
        )
        recommendations[0] = replace(first, notes=(*first.notes, note))
    listed, aside = one_each([*recommendations, *gaining]), one_each([*asides, *below, *losing])
    return listed, aside, epochs.against(stream.value), verification


def _below_yours(
    checked: Recommendation,
    mine: Recommendation,
    below: list[Recommendation],
    verification: Verification | None,
) -> tuple[list[Recommendation], Verification | None]:
    """Where the pairs kept `checked`, fewer workers, first (against DALI), and its figure
    there fell below yours (`mine`), so that yours is the answer: the verification's outcome
    says so, in its own words and in the notes of `checked`, set aside (it no longer "stays
    first")."""
    if verification is None or not verification.outcome:
        return below, verification
    was = verification.outcome
    figure = IMAGES_PER_S.text(checked.predicted_images_per_s, checked.predicted_error)
    ours = IMAGES_PER_S.text(mine.predicted_images_per_s, mine.predicted_error)
    outcome = (
        f"{was.replace(smaller_first(checked.setting), smaller_first(checked.setting, False))}; "
        f"at its figure there, {figure}, {checked.setting} gives less than yours, "
        f"{mine.setting} ({ours}): yours, no change, is the answer"
    )
    below = [
        replace(item, notes=tuple(outcome if note == was else note for note in item.notes))
        for item in below
    ]
    return below, replace(verification, outcome=outcome)


def _yours_as_stream(
    recommendations: list[Recommendation], baseline: SweepPoint, verification: Verification | None
) -> tuple[Estimate, str]:
    """Your setting read as one stream at its one figure in the answer, and whose it is: its
    runs in alternation pooled, else as the answer predicts it (two runs of it apart: their
    mean), else its run."""
    setting = yours(baseline.setting)
    pooled = None if verification is None or not verification.pairs else (
        verification.pooled(setting.setting)
    )  # fmt: skip
    if verification is not None and pooled is not None:
        runs = [r.run_id for r in verification.in_turn if r.setting == setting.setting]
        return pooled, alternation_source(runs)
    listed = next((r for r in recommendations if r.change == setting), None)
    rate = None if listed is None else listed.predicted_images_per_s
    if listed is not None and rate is not None and rate != baseline.images_per_s:
        return Estimate(rate, listed.predicted_error, 0), "the mean of its runs, as answered"
    return baseline.estimate, f"run {baseline.run_id}"


def _against_epochs(
    fixes: list[Recommendation], epochs: EpochsRun
) -> tuple[list[Recommendation], list[Recommendation]]:
    """The epoch reading's fixes that gain over your setting read epoch by epoch (the reading
    they change) beyond the two figures' errors, each with its gain; and those that do not so
    compared, set aside with what they give against it. A fix not predicted is kept."""
    if epochs.images_per_s is None or not fixes:
        return fixes, []
    mine = Estimate(epochs.images_per_s, epochs.images_per_s_error, 0)
    against = (
        f"{yours(epochs.num_workers).setting} read epoch by epoch "
        f"({IMAGES_PER_S.text(mine.value, mine.error)}, run {epochs.run_id})"
    )
    keep, aside = [], []
    for item in fixes:
        rate = item.predicted_images_per_s
        if rate is None:
            keep.append(item)
            continue
        beyond, gain = _gain(Estimate(rate, item.predicted_error, 0), mine)
        if beyond:
            keep.append(replace(item, notes=(*item.notes, f"{gain} on {against}")))
        else:
            cost = f"not recommended: predicted {IMAGES_PER_S.text(rate)}, {gain} on {against}"
            aside.append(replace(item, notes=(*item.notes, cost)))
    return keep, aside


def _gain(rate: Estimate, mine: Estimate) -> tuple[bool, str]:
    """`rate` against `mine`, two runs' figures: whether it gains beyond their errors, and the
    gain as shown with its error, "+5% ± 3%"."""
    error = margin(rate, 1.0, mine)
    shown = signed(rate.value / mine.value - 1)
    return (
        rate.value - mine.value > error,
        f"{shown} ± {error / mine.value:.0%}" if error else shown,
    )


def _dali_fell_back(points: Points, recommendations: list[Recommendation]) -> None:
    """DALI, measured worth the migration against yours, took the workers' share of the budget
    and then was not the answer: the workers' points say so, and so does the answer."""
    points.skipped = [
        replace(item, reason=DALI_FELL_BACK) if item.reason == DALI_AHEAD else item
        for item in points.skipped
    ]
    top = recommendations[0]
    note = "the workers were not searched (the budget went to DALI): `probe sweep` searches them"
    recommendations[0] = replace(top, notes=(*top.notes, note))


def _scaling(
    session: WarmSession,
    base: ProbeConfig,
    knee: SweepPoint | None,
    curve: Curve | None,
    dali: DaliRun,
    cores: float,
    check: bool,
) -> Scaling | None:
    """On several lanes, the job on 1 to N of them: predicted from the runs on N, with what
    the session measured on N beside it (the DataLoader's `knee`, DALI), and with `check`,
    measured on fewer."""
    alone = (session.consumer_alone() or {}).get("images_per_s")
    on_gpu = any(plan.device is not None for plan in base.lanes)
    scaled = predict(curve, dali, alone, len(base.lanes), cores, on_gpu)
    if scaled is None:
        return None
    lanes = scaled.lanes
    if curve is not None and knee is not None and knee.run_id is not None:  # on N, measured
        point = ScalePoint(lanes, TORCH, yours(knee.setting).setting,
                           curve.images_per_s(knee.setting), knee.images_per_s,
                           knee.images_per_s_error, knee.run_id,
                           fitted=knee.setting == curve.workers)  # fmt: skip
        scaled = scaled.with_point(point)
    if dali.judged and dali.run_id is not None and dali.images_per_s is not None:
        scaled = scaled.with_measured(
            DALI, lanes, dali.images_per_s, dali.images_per_s_error, dali.run_id, fitted=True
        )
    if not check:
        return replace(scaled, unchecked="predicted: `probe doctor --scaling` measures it")
    return scaling_points(session, base, scaled, later=1)


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
