"""The doctor's judgement: your setting's verdict told what the sweep measured, the
recommendations ranked (the DataLoader's answer, DALI weighed against it with what it costs,
what takes epoch starts' stalls away), and the verification of the first: what one that
disagrees decides, measuring yours and the change in turn where it must.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from probe.judge.changes import Change, Knob, Recommendation, workers
from probe.judge.dali_run import CoresFreed, DaliRun
from probe.judge.diagnosis import diagnose_run
from probe.judge.doctor.alternation import PIPELINES_SPREAD, Alternation, alternate
from probe.judge.epochs import epoch_fixes
from probe.judge.evidence import (
    Evidence,
    cpu_demand_evidence,
    gpu_sharing,
    gpu_sharing_evidence,
    measured,
)
from probe.judge.facts import run_facts
from probe.judge.knee import SweepAnalysis, SweepPoint
from probe.judge.model import Curve
from probe.judge.recommend import below_the_answer, one_each, recommend_measured, set_aside
from probe.judge.recommend_dali import (
    dali_advice,
    dali_gain_needed,
    dali_recommendation,
    dali_worth_it,
)
from probe.judge.results import EpochsRun, Verification
from probe.judge.session import Points, WarmSession, point_of, with_change
from probe.judge.thresholds import EPOCH_START_SHARE, KNEE_POINTS, KNEE_WITHIN
from probe.judge.verdicts import FED_KINDS, Verdict, VerdictKind
from probe.measure.config import ProbeConfig
from probe.metrics import CPU, IMAGES_PER_S, MEMORY, NVJPG, against_text, signed
from probe.records import RunStatus
from probe.steady import MIN_BLOCKS, Estimate, above, margin, pooled
from probe.store.db import Store
from probe.store.documents import read_run


def baseline_verdict(
    store: Store, baseline: SweepPoint, analysis: SweepAnalysis, points: Points
) -> Verdict:
    """Your setting's verdict, told what the sweep measured around it; with any point on a busy
    host, that the figures are not trusted."""
    assert baseline.run_id is not None  # points come from runs
    verdict = diagnose_run(store, baseline.run_id).verdict
    best, knee = analysis.best, analysis.knee
    gain = best.images_per_s / baseline.images_per_s - 1 if baseline.images_per_s > 0 else 0.0
    if len(analysis.points) == 1:
        text = f"sweep: num_workers={best.setting}, yours, the one setting measured"
    elif best.setting == baseline.setting:
        text = f"sweep: num_workers={best.setting}, yours, was the best measured"
    else:
        text = (
            f"sweep: num_workers={best.setting} was best "
            f"({IMAGES_PER_S.text(best.images_per_s, best.images_per_s_error)}, "
            f"{signed(gain)} on yours, num_workers={baseline.setting})"
        )
    busy = [p for p in points.measured.values() if p.host_busy]
    if knee_told(analysis, bool(busy)):
        text += f"; the knee is num_workers={knee.setting}"
    evidence = (*verdict.evidence, Evidence("images_per_s", best.images_per_s, text))
    if busy:
        settings = ", ".join(f"num_workers={p.setting}" for p in busy)
        fed = verdict.kind in FED_KINDS  # fed even so: that answer holds
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


def cap_as_measured(
    store: Store,
    verdict: Verdict,
    baseline: SweepPoint,
    analysis: SweepAnalysis,
    verification: Verification | None,
) -> Verdict:
    """Your setting's verdict with the CPU cap it states raised to the most that the session
    measured the DataLoader make (its points and its runs in alternation), per lane: the cap is
    an estimate, and one the measurements passed is no cap. Unchanged where raising it would
    change what holds the loader."""
    assert baseline.run_id is not None  # points come from runs
    facts = run_facts(store, baseline.run_id)
    rates = [p.images_per_s for p in analysis.points]
    if verification is not None:
        rates += [r.images_per_s for r in verification.in_turn if Change.parse(r.setting).knob
                  is Knob.NUM_WORKERS]  # fmt: skip
    if not facts or not rates:
        return verdict
    judged = next((f for f in facts if f.lane == verdict.lane), facts[0])
    most = max(rates) / len(facts)  # per lane
    lane = replace(judged, measured_up_to=most)
    told = {item.metric: item for item in cpu_demand_evidence(lane)}
    if lane.cpu_capped != judged.cpu_capped:  # raised, it would tell another cause: named
        passed = (f"; the session measured the DataLoader make {IMAGES_PER_S.text(most)}"
                  f"{judged.per_lane(most)}, past that estimate")  # fmt: skip
        told = {item.metric: replace(item, text=item.text + passed)
                for item in cpu_demand_evidence(judged)}  # fmt: skip
    evidence = tuple(told.get(item.metric, item) if item.metric == "cpu_demand_cores" else item
                     for item in verdict.evidence)  # fmt: skip
    return replace(verdict, evidence=evidence)


def knee_told(analysis: SweepAnalysis, busy: bool) -> bool:
    """Whether the sweep's knee can be stated: a point beside it measured, and no point taken
    while other processes took the host's CPU."""
    return len(analysis.points) >= KNEE_POINTS and not busy


def epoch_recommendations(
    store: Store,
    epochs: EpochsRun,
    baseline: SweepPoint,
    stream: Estimate | None = None,
    source: str | None = None,
) -> list[Recommendation]:
    """Where reading epoch by epoch cost EPOCH_START_SHARE or more: what takes it away, as
    measured against your setting read as one stream: at `stream` for the job (its one figure
    in the answer, `source` says whose; default: its run's)."""
    if epochs.run_id is None or not epochs.epoch_start:
        return []
    if epochs.epoch_start.share < EPOCH_START_SHARE:
        return []
    assert baseline.run_id is not None
    lanes = read_run(store, baseline.run_id).lanes
    rate = stream.value if stream is not None else sum(lane.figures.images_per_s for lane in lanes)
    scale = rate / baseline.images_per_s if baseline.images_per_s else 1.0
    by_lane = {lane.lane: lane.figures.images_per_s * scale for lane in lanes}
    basis = f"measured: your setting read as one stream, {source or f'run {baseline.run_id}'}"
    # the lane's cap, an estimate, is never below what the same setting made as one stream
    facts = [replace(f, measured_up_to=by_lane.get(f.lane, 0.0))
             for f in run_facts(store, epochs.run_id)]  # fmt: skip
    return epoch_fixes(facts, by_lane, basis)


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
    run = "" if baseline.run_id is None else f"run {baseline.run_id}"
    ranked, asides = set_aside(ranked, baseline.estimate, workers(baseline.setting), run)
    ranked, below = below_the_answer(ranked, keep_yours(baseline))
    asides = [*asides, *below]
    point = _point_of(analysis, ranked[0].change) or baseline
    reference, setting = loader_at_best(curve, analysis.points, point)
    dali, worth = weigh_dali(store, dali, point, reference, verdict, cores, setting)
    if worth or dali_reach(dali, reference):  # a close call: below it, "either"
        notes = [dali.freed.text] if dali.freed is not None else []
        notes += [*dali_trade(store, point, dali), *([dali.advice] if dali.advice else [])]
        ranked.insert(0 if worth else 1, dali_recommendation(dali, notes))
    return one_each(ranked), asides, dali


def loader_at_best(
    curve: Curve | None, measured: Sequence[SweepPoint], point: SweepPoint
) -> tuple[Estimate, str]:
    """The DataLoader a migration must beat, and its setting: `point`, the DataLoader's answer,
    as measured; where the curve predicts its knee faster and that knee was not measured, the
    knee as predicted (DALI is not weighed against yours where more workers may come within its
    bar: the doctor measures them first)."""
    mine = point.estimate, workers(point.setting).setting
    if curve is None:
        return mine
    knee = curve.knee(curve.settings())
    rate = curve.images_per_s(knee)
    if any(p.setting == knee for p in measured) or rate <= point.images_per_s:
        return mine
    return Estimate(rate, None, point.estimate.blocks), f"num_workers={knee} as predicted"


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
    setting: str | None = None,
) -> tuple[DaliRun, bool]:
    """DALI weighed against the DataLoader's `reference`, `setting` (default: `point`'s): its
    run, its runs pooled once verified, or the knee predicted (`loader_at_best`); whether it is
    worth a migration, the cores it frees against `point`, and where it is not worth it, by how
    much it falls short."""
    if not dali.judged or point.cpu_pct is None or dali.cpu_pct is None:
        return dali, False
    freed = CoresFreed(
        workers(point.setting).setting, point.cpu_pct * CPU.scale, dali.cpu_pct * CPU.scale, cores
    )
    worth = dali_worth_it(reference, dali, freed)
    advice = dali_advice(reference, setting or freed.setting, dali, verdict, freed)
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
    DALI is among the recommendations (first, or "either" below the DataLoader's answer), DALI
    against the DataLoader's answer is a close call, measured in alternation until the pairs
    decide it (`_dali_call`); a change of workers is measured in alternation with yours
    (`_workers_call`); your own setting, run again, where it measures apart from its first run
    by more than their errors and the drift, is predicted at the runs' mean, and DALI weighed
    against that again (`_yours_twice`)."""
    if not recommendations or session.stop.is_set() or not verdict.reliable:
        return None, recommendations, dali
    top = recommendations[0]
    config = with_change(base, top.change)
    if top.predicted_images_per_s is None or config is None or not session.budget.fits():
        return None, recommendations, dali  # nothing a session can run: epochs, storage
    if any(r.change.knob is Knob.PIPELINE for r in recommendations):
        call = _dali_call
    elif top.change != workers(baseline.setting):
        call = _workers_call
    else:
        return _verify_yours(session, base, recommendations, baseline, verdict, dali, cores)
    return call(session, base, recommendations, baseline, dali)


def _verify_yours(
    session: WarmSession,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    verdict: Verdict,
    dali: DaliRun,
    cores: float,
) -> tuple[Verification | None, list[Recommendation], DaliRun]:
    """Your setting, the answer, run again."""
    top = recommendations[0]
    config = with_change(base, top.change)
    assert config is not None  # a change of workers
    # your setting: its share leaves room for DALI in alternation, should the two runs differ
    document = session.measure(replace(config, label=f"verify {top.setting}"), later=2)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return None, recommendations, dali
    point = point_of(session.store, document, 0)
    verification = _against(top, point, document.run_id, base)
    if not verification.agrees:
        return _yours_twice(
            session, base, verification, point, recommendations, baseline, verdict, dali, cores
        )
    recommendations[0] = replace(top, measured_images_per_s=point.images_per_s)
    return verification, recommendations, dali


def _against(
    top: Recommendation, point: SweepPoint, run_id: str, base: ProbeConfig
) -> Verification:
    """One run of the first recommendation against its prediction."""
    assert top.predicted_images_per_s is not None
    was = Estimate(top.predicted_images_per_s, top.predicted_error, point.blocks)
    agrees = abs(point.images_per_s - was.value) <= margin(point.estimate, 1.0, was, drift=True)
    return Verification(
        change=top.change,
        predicted_images_per_s=was.value,
        predicted_images_per_s_error=was.error,
        measured_images_per_s=point.images_per_s,
        measured_images_per_s_error=point.images_per_s_error,
        agrees=agrees,
        host_busy=point.host_busy,
        run_id=run_id,
        precise=_precise(point.estimate, base),
    )


def _precise(estimate: Estimate, base: ProbeConfig) -> bool:
    """Whether a figure is known within the precision the session asked (any, where it asked
    none)."""
    relative = estimate.relative_error
    return base.precision is None or (relative is not None and relative <= base.precision)


def dali_reach(dali: DaliRun, reference: Estimate) -> bool:
    """Whether DALI, as measured, may clear what a migration must gain over the DataLoader's
    `reference` within their errors and the drift (it is then a call for measuring to decide)."""
    if not dali.judged or dali.images_per_s is None:
        return False
    measured = Estimate(dali.images_per_s, dali.images_per_s_error, MIN_BLOCKS)
    bar = 1 + dali_gain_needed(dali.freed)
    return measured.value + margin(measured, bar, reference, drift=True) >= bar * reference.value


def _dali_call(
    session: WarmSession,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    dali: DaliRun,
) -> tuple[Verification | None, list[Recommendation], DaliRun]:
    """DALI against the DataLoader's answer (its first recommendation of workers, else yours),
    measured in alternation, the first recommendation's run first (its verification): DALI
    leads where the pairs clear what a migration must gain, the DataLoader where they fall short
    of it, and where they hold it, either may be the answer and the DataLoader, the smaller
    change, stays first, with how many more pairs would decide it."""
    top = recommendations[0]
    loader = next(
        (r for r in recommendations if r.change.knob is Knob.NUM_WORKERS),
        keep_yours(baseline),
    )
    migration = next(r for r in recommendations if r.change.knob is Knob.PIPELINE)
    # what its first measurement said of DALI against the DataLoader, the pairs now say
    migration = replace(migration, notes=tuple(n for n in migration.notes if n != dali.advice))
    rest = [r for r in recommendations if r.change not in (loader.change, migration.change)]
    a, b = loader.change, migration.change
    bar = 1 + dali_gain_needed(dali.freed)
    assert dali.images_per_s is not None  # a migration is recommended where DALI measured
    initial = (
        Estimate(loader.predicted_images_per_s or 0.0, loader.predicted_error, 0),
        Estimate(dali.images_per_s, dali.images_per_s_error, 0),
    )
    call = alternate(session, base, a, b, bar, first=top.change, length_s=_pair_length(session),
                     label="in alternation", spread=PIPELINES_SPREAD, initial=initial)  # fmt: skip
    if not call.runs:
        return None, recommendations, dali
    if not call.pairs and not call.clear:
        return (*_alone(session, base, recommendations, call), dali)
    gain = f"DALI gave {call.gain_text()} on {a.setting}"
    need = f"the {bar - 1:.0%} a migration must gain"
    if call.decided == b:
        outcome = f"{call.how}, {gain}: it clears {need}: DALI is the answer"
        out = [
            _measured(migration, call, top, outcome),
            _measured(loader, call, top),
        ]
        out += rest
        dali = replace(dali, advice=None)
    elif call.decided == a:
        outcome = f"{call.how}, {gain}: short of {need}: {a.setting} is the answer"
        out = [_measured(loader, call, top, outcome), *rest]
        dali = replace(dali, advice=f"DALI is not worth the migration: {outcome}")
    else:
        outcome = (
            f"{call.how}, {gain}: {need} lies within that; either may be the answer, and "
            f"{smaller_first(a.setting)}; {call.undecided()}"
        )
        either = f"either: {gain}, and {need} lies within that"
        out = [
            _measured(loader, call, top, outcome),
            _measured(migration, call, top, either),
        ]
        out += rest
        dali = replace(dali, advice=either)
    return _verification(session, base, top, call, outcome), one_each(out), dali


def smaller_first(setting: str, first: bool = True) -> str:
    """The DataLoader's change before DALI where the pairs hold the call: it stays first, or
    (`first` False: yours, measured faster, is the answer) it goes before DALI."""
    return f"{setting}, the smaller change, " + ("stays first" if first else "goes before DALI")


def _pair_length(session: WarmSession) -> float:
    """The most a run in alternation measures: half the longest point so far (pairs pool,
    and each run stops once precise: a fast pipeline soon, a slow one, whose every batch is
    long, not before it has measured enough batches to judge)."""
    return max(session.budget.measured, default=0.0) / 2


def _alone(
    session: WarmSession,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    call: Alternation,
) -> tuple[Verification, list[Recommendation]]:
    """The first recommendation's run where the budget fit no pair in alternation: its
    verification alone, and the answer as first measured."""
    top = recommendations[0]
    rival = call.b if top.change == call.a else call.a
    outcome = (
        f"the budget fit no pair in alternation with {rival.setting} (--budget "
        f"{session.budget.needed(1)} would): the answer stands as first measured"
    )
    out = [_measured(top, call, top), *recommendations[1:]]
    return _verification(session, base, top, call, outcome), out


def _measured(
    recommendation: Recommendation,
    call: Alternation,
    verified: Recommendation,
    note: str | None = None,
) -> Recommendation:
    """A recommendation with `note`, and where it is the one `verified`, its runs in alternation
    pooled as what it measured again: its check where it ran alone; where pairs ran, the pairs
    are its check, and `in_alternation` gives it their figure instead."""
    runs = call.of(recommendation.change)
    again = recommendation.measured_images_per_s
    if recommendation.change == verified.change and runs is not None:
        again = runs.value
    return replace(
        recommendation,
        measured_images_per_s=again,
        notes=recommendation.notes if note is None else (*recommendation.notes, note),
    )


def _verification(
    session: WarmSession, base: ProbeConfig, top: Recommendation, call: Alternation, outcome: str
) -> Verification:
    """The first recommendation's runs in alternation as its verification: their mean against
    what it predicted."""
    assert top.predicted_images_per_s is not None
    runs = call.of(top.change)
    assert runs is not None  # it ran first
    was = Estimate(top.predicted_images_per_s, top.predicted_error, 0)
    agrees = abs(runs.value - was.value) <= margin(runs, 1.0, was, drift=True)
    busy = any(f.host_busy for run in call.runs for f in run_facts(session.store, run.run_id))
    return Verification(
        change=top.change,
        predicted_images_per_s=was.value,
        predicted_images_per_s_error=was.error,
        measured_images_per_s=runs.value,
        measured_images_per_s_error=runs.error,
        agrees=agrees,
        host_busy=busy,
        run_id=next(run.run_id for run in call.runs if run.setting == top.setting),
        in_turn=call.runs,
        outcome=outcome,
        precise=_precise(runs, base),
        ratio=None if call.ratio is None else call.ratio.value,
        ratio_error=None if call.ratio is None else call.ratio.error,
        ratio_over=call.a.setting,
    )


def _yours_twice(
    session: WarmSession,
    base: ProbeConfig,
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
    two runs' mean, and DALI is weighed against that again: where it may now clear what a
    migration must gain, the two are measured in alternation, and that decides."""
    both = pooled([baseline.estimate, again.estimate])
    moved = against_text(again.images_per_s, baseline.images_per_s)
    outcome = (
        f"your setting measured {IMAGES_PER_S.text(baseline.images_per_s)} and then "
        f"{IMAGES_PER_S.text(again.images_per_s)} ({moved}): more than their errors and "
        f"the drift between runs; it is predicted at their mean, "
        f"{IMAGES_PER_S.text(both.value, both.error)}"
    )
    top = replace(
        recommendations[0],
        predicted_images_per_s=both.value,
        predicted_error=both.error,
        basis=f"measured: your setting, the mean of runs {baseline.run_id} and {again.run_id}",
        measured_images_per_s=None,  # its run again is part of that mean: not its check
        notes=(*recommendations[0].notes, outcome),
    )
    out = [top, *recommendations[1:]]
    verification = replace(verification, outcome=outcome)
    dali, _ = weigh_dali(session.store, dali, baseline, both, verdict, cores)
    if not dali_reach(dali, both):
        return verification, one_each(out), dali
    # against your first run DALI could not clear the bar; against the two it may: measured
    # in alternation, as any close call, the pairs decide
    notes = [dali.freed.text] if dali.freed is not None else []
    out.insert(1, dali_recommendation(dali, notes))
    called, out, dali = _dali_call(session, base, one_each(out), baseline, dali)
    if called is None:
        return verification, out, dali
    return replace(called, outcome=f"{outcome}; {called.outcome}"), out, dali


def _workers_call(
    session: WarmSession,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    baseline: SweepPoint,
    dali: DaliRun,
) -> tuple[Verification | None, list[Recommendation], DaliRun]:
    """A change of workers against yours, measured in alternation on the same warm lanes, the
    change first (its verification): runs minutes apart on a shared host differ by more than
    their errors, pairs a point apart do not. It stays the answer where the pairs bear it out
    (more workers faster, fewer as fast within KNEE_WITHIN); else the answer keeps yours, and
    says why ("either", where the pairs hold the bar within their interval)."""
    top = recommendations[0]
    yours = workers(baseline.setting)
    fewer = isinstance(top.change.value, int) and top.change.value < baseline.setting
    bar = 1 - KNEE_WITHIN if fewer else 1.0
    change = Estimate(top.predicted_images_per_s or 0.0, top.predicted_error, 0)
    initial = (baseline.estimate, change)
    call = alternate(session, base, yours, top.change, bar, first=top.change,
                     length_s=_pair_length(session), label="in alternation",
                     initial=initial)  # fmt: skip
    if not call.runs:
        return None, recommendations, dali
    if not call.pairs and not call.clear:
        return (*_alone(session, base, recommendations, call), dali)
    mine, theirs = initial if call.clear else (call.of(yours), call.of(top.change))
    assert mine is not None and theirs is not None  # a pair, or the first measurements
    against = (
        f"{call.how} with yours, {top.setting} gave "
        f"{IMAGES_PER_S.text(theirs.value)} against {IMAGES_PER_S.text(mine.value)} "
        f"({call.gain_text()})"
    )
    rest = [r for r in recommendations[1:] if r.change != yours]
    if call.decided == top.change:
        outcome = f"{against}: it stays the answer"
        out = [_measured(top, call, top, outcome), *rest]
    else:
        why = "the answer keeps yours" if call.decided == yours else (
            f"either may be the answer, and yours, no change, stays first; {call.undecided()}"
        )  # fmt: skip
        outcome = f"{against}: {why}"
        keep = keep_yours(baseline, outcome)
        out = [keep, *[r for r in rest if r.change != top.change]]
    return _verification(session, base, top, call, outcome), one_each(out), dali


def keep_yours(baseline: SweepPoint, outcome: str | None = None) -> Recommendation:
    """Your setting as the answer, predicted at its run; `outcome` says why, where a change was
    refuted (its pairs with yours then give yours its figure: `in_alternation`)."""
    return Recommendation(
        f"no change: keep num_workers={baseline.setting}",
        workers(baseline.setting),
        baseline.images_per_s,
        f"measured: your setting, run {baseline.run_id}",
        notes=() if outcome is None else (outcome,),
        predicted_error=baseline.images_per_s_error,
    )
