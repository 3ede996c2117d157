"""The doctor's judgement: your setting's verdict told what the sweep measured, the
recommendations ranked (the DataLoader's answer, DALI weighed against it with what it costs,
what takes epoch starts' stalls away), and the verification of the first: what one that
disagrees decides, measuring yours and the change in turn where it must.
"""

from __future__ import annotations

import math
from dataclasses import replace

from probe.judge.changes import Change, Knob, Recommendation, workers
from probe.judge.dali_run import CoresFreed, DaliRun
from probe.judge.diagnosis import diagnose_run
from probe.judge.epochs import epoch_fixes
from probe.judge.evidence import Evidence, gpu_sharing, gpu_sharing_evidence, measured
from probe.judge.facts import run_facts
from probe.judge.knee import SweepAnalysis, SweepPoint
from probe.judge.model import Curve
from probe.judge.recommend import (
    dali_advice,
    dali_recommendation,
    dali_worth_it,
    one_each,
    recommend_measured,
    set_aside,
)
from probe.judge.results import EpochsRun, InTurn, Verification
from probe.judge.session import Points, WarmSession, point_of, with_change, with_setting
from probe.judge.thresholds import EPOCH_START_SHARE, KNEE_POINTS, KNEE_WITHIN
from probe.judge.verdicts import Verdict, VerdictKind
from probe.measure.config import ProbeConfig
from probe.metrics import CPU, IMAGES_PER_S, MEMORY, NVJPG, against_text
from probe.records import RunStatus
from probe.steady import Estimate, above, at_least, margin, pooled
from probe.store.db import Store
from probe.store.documents import read_run

IN_TURN = 4  # runs of yours and the candidate, in turn, where a verification disagrees


def baseline_verdict(
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
    busy = [p for p in points.measured.values() if p.host_busy]
    if knee_told(analysis, bool(busy)):
        text += f"; the knee is num_workers={knee.setting}"
    evidence = (*verdict.evidence, Evidence("images_per_s", best.images_per_s, text))
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


def knee_told(analysis: SweepAnalysis, busy: bool) -> bool:
    """Whether the sweep's knee can be stated: a point beside it measured, and no point taken
    while other processes took the host's CPU."""
    return len(analysis.points) >= KNEE_POINTS and not busy


def epoch_recommendations(
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


def answer(
    store: Store,
    analysis: SweepAnalysis,
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    curve: Curve | None,
    cores: float,
) -> tuple[list[Recommendation], list[Recommendation], DaliRun]:
    """The recommendations, ranked: the DataLoader's answer (the knee, or yours), DALI before
    it where it is worth a migration against that answer's point; one recommendation a
    setting. A knee measured significantly below yours is no answer: yours is, and the knee is
    set aside (what it frees is in its point). Returns the recommendations, the changes set
    aside, and DALI with its weighing."""
    ranked = recommend_measured(analysis, baseline, verdict, curve if verdict.reliable else None)
    if not verdict.reliable:
        return ranked, [], dali
    ranked, asides = set_aside(ranked, baseline.estimate, workers(baseline.setting))
    if not ranked:
        ranked = [keep_yours(baseline, baseline.estimate)]
    point = _point_of(analysis, ranked[0].change) or baseline
    dali, worth = weigh_dali(store, dali, point, point.estimate, verdict, cores)
    if worth:
        notes = [dali.freed.text] if dali.freed is not None else []
        ranked.insert(0, dali_recommendation(dali, [*notes, *dali_trade(store, point, dali)]))
    return one_each(ranked), asides, dali


def _point_of(analysis: SweepAnalysis, change: Change) -> SweepPoint | None:
    """The measured point of a change of num_workers (None: another change)."""
    if change.knob is not Knob.NUM_WORKERS:
        return None
    return next((p for p in analysis.points if p.setting == change.value), None)


def weigh_dali(
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


def verify(
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
    else:
        verification, recommendations, dali = _disagreed(
            session, base, verification, point, recommendations, baseline, verdict, dali, cores
        )
    stays = recommendations[0].change == top.change and not verification.in_turn
    if stays and top.change.knob is Knob.PIPELINE:  # a ratio of runs apart: measured side by side
        return _beside_yours(session, base, verification, point, recommendations, baseline,
                             dali, cores)  # fmt: skip
    return verification, recommendations, dali


def _beside_yours(
    session: WarmSession,
    base: ProbeConfig,
    verification: Verification,
    point: SweepPoint,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification, list[Recommendation], DaliRun]:
    """DALI, verified, against the DataLoader's answer (the next recommendation of workers, else
    yours) measured again right after it: the migration is weighed on two runs a point apart,
    not on runs minutes apart (a shared host's rate moves more than their errors between them).
    Where that pair does not bear it out, either may be the answer, and the DataLoader's,
    measured twice, stays first."""
    top = recommendations[0]
    loader = next((r for r in recommendations[1:] if r.change.knob is Knob.NUM_WORKERS), None)
    setting = baseline.setting
    if loader is not None and isinstance(loader.change.value, int):
        setting = loader.change.value
    config = with_setting(base, "num_workers", setting)
    if config is None or session.stop.is_set() or not session.budget.fits():
        return verification, recommendations, dali
    name = workers(setting).setting
    document = session.measure(replace(config, label=f"in turn with DALI: {name}"), later=0)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return verification, recommendations, dali
    mine = point_of(session.store, document, 0)
    run = InTurn(name, mine.images_per_s, mine.images_per_s_error, document.run_id)
    pair = (
        f"measured beside {name} again, it gave {IMAGES_PER_S.text(point.images_per_s)} against "
        f"{IMAGES_PER_S.text(mine.images_per_s, mine.images_per_s_error)}"
    )
    earlier = f"{verification.outcome}; " if verification.outcome else ""
    if _bears_out(top.change, mine.estimate, point.estimate, setting, dali, cores):
        outcome = f"{earlier}{pair}: it stays the answer"
        return replace(verification, in_turn=(run,), outcome=outcome), recommendations, dali
    outcome = earlier + (
        f"{pair} ({against_text(point.images_per_s, mine.images_per_s, 0)}): not the gain a "
        f"migration must show beyond their errors and the drift; either may be the answer, and "
        f"{name}, measured twice, stays first"
    )
    if loader is None or loader.change == workers(baseline.setting):
        first = keep_yours(baseline, pooled([baseline.estimate, mine.estimate]), outcome, None)
    else:
        first = replace(loader, notes=(*loader.notes, outcome))
    either = replace(top, notes=(*top.notes, f"either: {pair}"))
    out = one_each([first, either, *recommendations[1:]])
    return replace(verification, in_turn=(run,), outcome=outcome), out, dali


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
    """What a verification that disagrees with its prediction decides (`verify`)."""
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
    dali, worth = weigh_dali(session.store, dali, baseline, both, verdict, cores)
    if worth and dali.change.setting not in {r.setting for r in out}:
        # against your first run it was not worth it: either may be the answer, and the one
        # measured twice stays first (the same first answer, whichever run the host favoured)
        either = (
            "either: against your setting's two runs DALI is worth the migration, against its "
            "first it was not; it was measured once, not verified"
        )
        notes = [dali.freed.text] if dali.freed is not None else []
        out.insert(1, dali_recommendation(dali, [*notes, either]))
        outcome += "; against that, DALI is worth the migration: either (recommendation 2)"
    return replace(verification, outcome=outcome), one_each(out), dali


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
        keep = keep_yours(baseline, baseline.estimate, outcome, None)
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
        out = one_each([stays, *recommendations[1:]])
        return replace(verification, in_turn=tuple(runs), outcome=outcome), out, dali
    outcome = (
        f"{refuted}; measured in turn with yours, it gave {IMAGES_PER_S.text(b.value, b.error)} "
        f"against {IMAGES_PER_S.text(a.value, a.error)} for yours: the answer keeps yours"
    )
    keep = keep_yours(baseline, a, outcome, mine[-1].value)
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


def keep_yours(
    baseline: SweepPoint,
    rate: Estimate,
    outcome: str | None = None,
    measured_rate: float | None = None,
) -> Recommendation:
    """Your setting as the answer, predicted at `rate`; `outcome` says why, where a change
    was refuted (and `measured_rate` is yours as measured in turn with it)."""
    return Recommendation(
        f"no change: keep num_workers={baseline.setting}",
        workers(baseline.setting),
        rate.value,
        f"measured: your setting, run {baseline.run_id}"
        + (", and in turn with the change its verification refuted" if measured_rate else ""),
        measured_images_per_s=measured_rate,
        notes=() if outcome is None else (outcome,),
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
        one_each([keep, *rest]),
    )
