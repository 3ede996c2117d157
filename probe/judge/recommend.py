"""Recommendations: ranked, exact changes, each with the images/s it is predicted to give and how
that was predicted. `recommend` answers one run's verdicts, estimating where nothing was
measured (and saying so), or reading a sweep where one is known; `recommend_measured` answers a
doctor's session from what its sweep measured. The DataLoader's changes, storage, transfers and
the answer's order are here; changes in DALI's terms, a move to DALI, and DALI's place beside
the DataLoader's answer are `probe.judge.recommend_dali`'s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from probe.judge.changes import (
    MEASURE_AGAIN,
    NO_CHANGE,
    STORAGE,
    Change,
    Knob,
    Recommendation,
    to_dali,
    workers,
)
from probe.judge.epochs import epoch_fixes, in_rounds, read_by_epoch
from probe.judge.facts import LaneFacts
from probe.judge.knee import SweepAnalysis, SweepPoint
from probe.judge.model import Curve, curve_of
from probe.judge.recommend_dali import in_dalis_terms, more_threads, off_the_sms, to_dali_estimate
from probe.judge.thresholds import KNEE_POINTS, KNEE_WITHIN, WAIT_HIGH
from probe.judge.verdicts import FED_KINDS, STARVED, Verdict, VerdictKind, rank
from probe.metrics import CPU_PER_IMAGE, DATA_WAIT, IMAGES_PER_S, against_text, signed
from probe.steady import Estimate, above


def recommend(
    facts: Sequence[LaneFacts],
    verdicts: Sequence[Verdict],
    findings: Sequence[Verdict] = (),
    sweep: SweepAnalysis | None = None,
) -> list[Recommendation]:
    """Recommendations from one run: estimates, and said to be; where `sweep` (of the same
    lanes and knob) is known, a new setting is one it measured, never one past its best."""
    lane, verdict = max(zip(facts, verdicts, strict=True), key=lambda item: rank(item[1]))
    if not verdict.reliable:
        return [_measure_again()]
    lanes = len(facts)  # every prediction is for the job: all its lanes
    out: list[Recommendation] = []
    if verdict.kind in FED_KINDS:
        out.append(_keeps_up(facts, lane, verdict))
    if _more_workers_help(lane, verdict):
        if sweep is not None and sweep.knob == Knob.NUM_WORKERS.value:
            out += _measured_workers(lane, sweep, lanes)
        else:
            more = _predicted_workers(lane, lanes) or _estimated_workers(lane, lanes)
            out += [] if more is None else [more]
    out += _slowed_steps(facts, lane, verdict, findings)
    if lane.backend == "dali" and verdict.kind in STARVED:
        out += in_dalis_terms(lane, verdict, lanes)
    if any(v.kind is VerdictKind.EPOCH_START_STALL for v in [*verdicts, *findings]):
        out += epoch_fixes(facts)
    if verdict.kind in STARVED - {VerdictKind.IO_BOUND, VerdictKind.EPOCH_START_STALL} and (
        lane.backend == "torch"
    ):
        out += [*_transfer_fixes(lane), *_to_dali(lane, verdict, lanes)]
    if verdict.kind is VerdictKind.IO_BOUND:
        out.append(
            Recommendation(
                "faster storage or a local copy of the data: the loader waits for reads, and "
                "DALI will not fix storage",
                STORAGE,
                None,
                "not predicted: storage is outside the pipeline",
            )
        )
    if verdict.kind is VerdictKind.DALI_DECODER_SATURATED:
        out.append(
            Recommendation(
                "send fewer JPEGs to the hardware decoder and more to nvJPEG on the SMs",
                Change(Knob.HW_DECODER_LOAD, 0.5),
                None,
                "not predicted: the split between the decoders is not measured apart",
            )
        )
    held = verdict.kind is VerdictKind.STARVED_CPU_HEADROOM  # by its workers: more come first
    return one_each(
        sorted(
            out,
            key=lambda r: (
                held and r.change.knob is not Knob.NUM_WORKERS,
                -(r.predicted_images_per_s or 0.0),
            ),
        )
    )


def _to_dali(lane: LaneFacts, verdict: Verdict, lanes: int) -> list[Recommendation]:
    """A move to DALI where the CPU caps the DataLoader or its main process holds it; where its
    workers hold it (`LaneFacts.workers_hold`) below a CPU cap short of what the step could
    take (`LaneFacts.cpu_short`), past what more workers can give. Not for a loader held by
    something unmeasured: DALI is no answer to an unknown."""
    if verdict.kind in (VerdictKind.STARVED_CPU_SATURATED, VerdictKind.MAIN_PROCESS_BOUND):
        return [to_dali_estimate(lane, lanes)]
    if verdict.kind is not VerdictKind.STARVED_CPU_HEADROOM or not lane.cpu_short:
        return []
    dali = to_dali_estimate(lane, lanes)
    cap, rate = lane.cpu_cap_images_per_s, lane.consumer_images_per_s
    note = (
        f"past what more workers can give: the CPU would cap them near "
        f"{IMAGES_PER_S.text(cap)}{lane.per_lane(cap)}, short of the "
        f"{IMAGES_PER_S.text(rate)}{lane.per_lane(rate)} the step could take"
    )
    return [replace(dali, notes=(*dali.notes, note))]


def _keeps_up(facts: Sequence[LaneFacts], lane: LaneFacts, verdict: Verdict) -> Recommendation:
    """No change for a fed job, measured as it ran; told by its interval alone
    (`LaneFacts.fed_by_interval`), with what holds it instead and the most a loader that never
    made it wait could gain."""
    action = "compute-bound: the pipeline keeps up"
    if verdict.kind is VerdictKind.FED_WITHIN_ERROR:
        figures = lane.figures
        wait, error = figures.data_wait_frac or 0.0, figures.data_wait_frac_error or 0.0
        held = ""
        if lane.step_ms_mean is not None and lane.batch_ms_mean is not None:
            held = f" ({lane.step_ms_mean:.1f} ms of each {lane.batch_ms_mean:.1f} ms batch)"
        action = (
            f"no loader change: fed, or at most moderately input-bound ({DATA_WAIT.label} "
            f"{DATA_WAIT.text(wait, error)}, below {WAIT_HIGH:.0%} throughout): the training "
            f"step holds the job{held}; a loader that never made it wait would gain at most "
            f"{1 / (1 - wait - error) - 1:.0%}"
        )
    return Recommendation(
        action + ("" if lane.backend == "dali" else ", and DALI would not help"),
        NO_CHANGE,
        sum(f.figures.images_per_s for f in facts),
        "measured in this run",
    )


def _more_workers_help(lane: LaneFacts, verdict: Verdict) -> bool:
    """Whether more DataLoader workers may help: the CPU has room for them, or it caps the
    loader (`LaneFacts.cpu_capped`) while fewer workers than its cores use only part of it (up
    to that cap, below which they are predicted)."""
    if lane.backend != "torch":
        return False
    if verdict.kind is VerdictKind.STARVED_CPU_HEADROOM:
        return True
    return (
        verdict.kind is VerdictKind.STARVED_CPU_SATURATED
        and lane.cpu_capped
        and not lane.cpu_saturated
        and (lane.num_workers or 0) < lane.cores_per_lane
    )


def one_each(recommendations: Sequence[Recommendation]) -> list[Recommendation]:
    """The recommendations with one for each setting: the first, best ranked, of those that
    name it (a change has one prediction)."""
    seen: set[str] = set()
    out = []
    for item in recommendations:
        if item.setting not in seen:
            seen.add(item.setting)
            out.append(item)
    return out


def below_the_answer(
    recommendations: Sequence[Recommendation], yours: Recommendation | None = None
) -> tuple[list[Recommendation], list[Recommendation]]:
    """The first recommendation, the answer, and those predicted no lower than it; and the
    changes predicted below it, set aside with what they cost against it (a change that gives
    less than the answer is not recommended beside it). With `yours` (no change, as measured),
    fewer workers predicted below it are no answer either: yours is (and where nothing is
    left, yours is the answer)."""
    recommendations = list(recommendations)
    if not recommendations:
        return ([] if yours is None else [yours]), []
    if recommendations[0].predicted_images_per_s is None:
        return recommendations, []
    first = recommendations[0]
    rate = first.predicted_images_per_s
    mine = None if yours is None else yours.predicted_images_per_s
    if (
        yours is not None
        and rate is not None
        and mine is not None
        and first.change.knob is Knob.NUM_WORKERS
        and first.change != yours.change
        and rate < mine
    ):
        recommendations, first = [yours, *recommendations], yours
    answer = first.predicted_images_per_s
    assert answer is not None
    keep, aside = [first], []
    for item in recommendations[1:]:
        rate = item.predicted_images_per_s
        if rate is None or rate >= answer or item.change.knob is None:
            keep.append(item)
            continue
        cost = (
            f"not recommended: predicted {IMAGES_PER_S.text(rate)}, {signed(rate / answer - 1)} "
            f"against the answer, {first.setting} ({IMAGES_PER_S.text(answer)})"
        )
        aside.append(replace(item, notes=(*item.notes, cost)))
    return one_each(keep), aside


def set_aside(
    recommendations: Sequence[Recommendation], yours: Estimate, own: Change, source: str = ""
) -> tuple[list[Recommendation], list[Recommendation]]:
    """The recommendations that may gain, and the changes set aside: those predicted or
    measured significantly below `yours` (your setting `own` as measured, for the job; beyond
    both errors and the drift between runs). A change that loses is no recommendation; it is
    told after them, with what it costs (fewer workers may be worth it to free cores). `source`
    names whose figure `yours` is where the page may show yours at another (a doctor's: its
    run in the sweep, where the answer may pool its runs in alternation)."""
    keep, aside = [], []
    for item in recommendations:
        rates = [
            Estimate(rate, error, 0)
            for rate, error in (
                (item.predicted_images_per_s, item.predicted_error),
                (item.measured_images_per_s, None),
            )
            if rate is not None
        ]
        loses = [rate for rate in rates if above(yours, 1.0, rate)]
        if item.change.knob is None or item.change == own or not loses:
            keep.append(item)
            continue
        worst = min(rate.value for rate in loses)
        cost = (
            f"not recommended: {IMAGES_PER_S.text(worst)}, {signed(worst / yours.value - 1)} "
            f"against yours ({IMAGES_PER_S.text(yours.value, yours.error)}, {own.setting}"
            f"{', ' + source if source else ''})"
        )
        aside.append(replace(item, notes=(*item.notes, cost)))
    return keep, aside


def _measure_again(
    why: str = ", so what more workers or DALI would give cannot be told from these figures",
) -> Recommendation:
    return Recommendation(
        f"measure again on a quiet host: other processes took CPU the pipeline needs{why}",
        MEASURE_AGAIN,
        None,
        "not predicted: the figures are not trusted",
    )


def _estimated_workers(lane: LaneFacts, lanes: int) -> Recommendation | None:
    """More workers, from this run alone: its images/s per worker times workers (a loader at
    num_workers=0, which loads in the training process, counted as one), enough for the
    consumer, at most the cores per lane and what they can make at the CPU each image costs
    (`LaneFacts.cpu_cap_images_per_s`). Throughput flattens, and may fall, before the cores
    run out: said, with what measures it. A loader read epoch by epoch is predicted in rounds
    (`in_rounds`: None where more workers do not gain)."""
    start = lane.figures.epoch_start
    if start is not None and start.starts and lane.num_workers:
        return in_rounds(lane, lanes)
    workers_now = max(lane.num_workers or 1, 1)
    rate, start = lane.figures.images_per_s, lane.figures.epoch_start
    if start is not None and start.starts and start.steady_images_per_s:
        rate = start.steady_images_per_s  # between epoch starts: `read_by_epoch` adds them
    per_worker = rate / workers_now
    cap = lane.cpu_cap_images_per_s
    bounds = [b for b in (lane.consumer_images_per_s, cap) if b is not None]
    wanted = min(bounds) if bounds else rate * 2
    needed = math.ceil(wanted / per_worker) if per_worker > 0 else workers_now * 2
    target = int(min(max(needed, workers_now + 1), lane.cores_per_lane))
    predicted = min([per_worker * target, *bounds])
    cpu = (
        ""
        if cap is None
        else f" (at {CPU_PER_IMAGE.text(lane.figures.cpu_ms_per_image)} of CPU an image, "
        f"{IMAGES_PER_S.text(cap)})"
    )
    advice = Recommendation(
        f"raise num_workers from {lane.num_workers or 0} to {target}",
        workers(target),
        predicted * lanes,
        f"estimated, not measured: {per_worker:,.0f} images/s per worker times workers, bounded "
        f"by the {lane.cores_per_lane_text}{cpu} and at most the consumer's own rate "
        "(min(pipeline, consumer)); workers stop adding long before that bound on many hosts: "
        "`probe sweep` measures the knee",
    )
    return read_by_epoch(advice, lane, lanes)


def _predicted_workers(lane: LaneFacts, lanes: int) -> Recommendation | None:
    """num_workers at the knee of the curve this run predicts (`probe.judge.model`), where
    every term of it was measured."""
    curve = curve_of(lane, lanes=lanes)
    if curve is None:
        return None
    knee = curve.knee(curve.settings())
    workers_now = lane.num_workers or 0
    if knee == workers_now:
        return None
    verb = "raise" if knee > workers_now else "lower"
    advice = Recommendation(
        f"{verb} num_workers from {workers_now} to {knee}",
        workers(knee),
        curve.images_per_s(knee),
        f"predicted by the model from this run, not measured (bound by the "
        f"{curve.bound(knee)} there): {curve.text}; `probe doctor` measures it",
    )
    return read_by_epoch(advice, lane, lanes)


def _free_the_step(lane: LaneFacts, lanes: int) -> list[Recommendation]:
    """Where the loader's CPU slows the step: fewer workers, as the curve predicts them, or on
    a GPU DALI, which decodes there; at best the consumer alone's rate."""
    out = []
    predicted = _predicted_workers(lane, lanes)
    value = None if predicted is None else predicted.change.value
    if predicted is not None and isinstance(value, int) and value < (lane.num_workers or 0):
        out.append(predicted)
    alone = (lane.figures.consumer_alone or {}).get("images_per_s")
    if lane.on_gpu and lane.backend == "torch":
        out.append(
            Recommendation(
                "move decoding to DALI (nvJPEG and the hardware decoder), freeing the CPU the "
                "training step needs",
                to_dali("mixed", min(8, max(1, int(lane.cores_per_lane)))),
                None if alone is None else alone * lanes,
                "estimated: at best the consumer alone's rate; `probe doctor` measures it",
            )
        )
    return out


def _measured_workers(lane: LaneFacts, sweep: SweepAnalysis, lanes: int) -> list[Recommendation]:
    """More workers, as a sweep of these lanes measured them: the fewest past the lane's own
    that give what the consumers take (else the knee), never past the best; none where the
    lane's own setting was measured to give that already, or more were not measured to help."""
    workers_now = lane.num_workers or 0
    consumer = lane.consumer_images_per_s
    wanted = sweep.best.estimate if consumer is None else Estimate(consumer * lanes, None, 0)
    if any(p.setting <= workers_now and sweep.gives(p, wanted) for p in sweep.points):
        return []  # as many workers, or fewer, give it already: what holds it is not them
    point = sweep.reaching(wanted, workers_now)
    if point is None:
        return []
    predicted, error = point.images_per_s, point.images_per_s_error
    if consumer is not None and consumer * lanes < predicted:
        predicted, error = consumer * lanes, None
    advice = Recommendation(
        f"raise num_workers from {workers_now} to {point.setting}",
        workers(point.setting),
        predicted,
        f"measured in a sweep: num_workers={point.setting} gave "
        f"{IMAGES_PER_S.text(point.images_per_s, point.images_per_s_error)}"
        f"{f' (run {point.run_id})' if point.run_id else ''}, the best "
        f"{IMAGES_PER_S.text(sweep.best.images_per_s)} at num_workers={sweep.best.setting}; "
        "at most the consumer's own rate",
        predicted_error=error,
    )
    return [read_by_epoch(advice, lane, lanes)]


def _slowed_steps(
    facts: Sequence[LaneFacts], lane: LaneFacts, verdict: Verdict, findings: Sequence[Verdict]
) -> list[Recommendation]:
    """DALI's threads where they are all busy; and for a step slower than alone, what frees it:
    of the loader's CPU (the noisy neighbour), or of DALI's kernels on its GPU, where more
    threads cannot help."""
    found = {(v.kind, v.lane) for v in findings}
    on_gpu = [f for f in facts if (VerdictKind.GPU_SHARED, f.lane) in found]
    neighbours = [f for f in facts if (VerdictKind.NOISY_NEIGHBOUR, f.lane) in found]
    out = []
    # Threads all busy with the step slowed on the GPU: more threads only push more JPEGs to
    # nvJPEG on the SMs, slowing the step further.
    if verdict.kind is VerdictKind.DALI_THREADS_SATURATED and (
        (VerdictKind.GPU_SHARED, lane.lane) not in found
    ):
        out += more_threads(lane, len(facts))
    if neighbours:
        out += _free_the_step(neighbours[0], len(facts))
    if on_gpu:
        out += off_the_sms(on_gpu[0], len(facts))
    return out


def _transfer_fixes(lane: LaneFacts) -> list[Recommendation]:
    basis = "not predicted: the copy's share of the wait is not measured apart"
    out = []
    if lane.on_gpu and lane.pin_memory is False:
        out.append(
            Recommendation(
                "pin the host buffers, so that copies to the GPU run asynchronously",
                Change(Knob.PIN_MEMORY, True),
                None,
                basis,
            )
        )
    if lane.output_dtype == "float32" and lane.on_gpu:
        out.append(
            Recommendation(
                "hand over uint8 pixels and normalize on the device (4x less traffic)",
                Change(Knob.OUTPUT_DTYPE, "uint8"),
                None,
                basis,
            )
        )
    return out


def recommend_measured(
    analysis: SweepAnalysis,
    baseline: SweepPoint,
    verdict: Verdict,
    curve: Curve | None = None,
) -> list[Recommendation]:
    """A doctor's DataLoader answer, from what its sweep of num_workers measured around your
    setting (`baseline`): the knee, within KNEE_WITHIN of the best measured (DALI's place
    beside it is `dali_recommendation`'s)."""
    if not verdict.reliable:
        return [_measure_again(" while it measured, so which setting is best cannot be told")]
    knee = analysis.knee
    if knee.setting == baseline.setting:
        action = "no change: num_workers is at the knee of the sweep"
        if len(analysis.points) < KNEE_POINTS:  # a knee needs a point beside it
            action = "no change: yours was the one DataLoader setting measured"
        if verdict.kind in FED_KINDS:
            action = "no change: compute-bound; the DataLoader keeps up and DALI would not help"
        return [_measured(action, baseline, curve)]
    if knee.setting < baseline.setting:
        action = (
            f"lower num_workers from {baseline.setting} to {knee.setting}: as fast within "
            f"{KNEE_WITHIN:.0%} and its error, with fewer processes and less CPU"
        )
    else:
        action = (
            f"raise num_workers from {baseline.setting} to {knee.setting}: the smallest "
            f"setting within {KNEE_WITHIN:.0%} of the best measured"
        )
    return [_measured(action, knee, curve)]


def _measured(action: str, point: SweepPoint, curve: Curve | None = None) -> Recommendation:
    basis = f"measured in the sweep, run {point.run_id}"
    if curve is not None:
        predicted = curve.images_per_s(point.setting)
        basis += (
            f"; the model predicted {IMAGES_PER_S.text(predicted)} "
            f"(measured {against_text(point.images_per_s, predicted)} against it)"
        )
    return Recommendation(
        action,
        workers(point.setting),
        point.images_per_s,
        basis,
        predicted_error=point.images_per_s_error,
    )
