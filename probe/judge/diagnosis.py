"""A run's diagnosis: its lanes' verdicts, what only several lanes show, the run's verdict (the
worst), and ranked recommendations (`diagnose_run` for a stored run, `judge_run` for facts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipelines import InputError
from probe.judge.across_lanes import held_lanes, judge_lanes
from probe.judge.changes import Knob, Recommendation
from probe.judge.evidence import Evidence
from probe.judge.facts import LaneFacts, run_facts
from probe.judge.knee import SweepAnalysis
from probe.judge.like import dali_as_measured, what_if, what_if_text
from probe.judge.recipe import with_recipe
from probe.judge.recommend import recommend, set_aside
from probe.judge.results import Session, SessionKind, read_session
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind, judge_lane, rank
from probe.records import RunRecord, RunStatus
from probe.steady import Estimate
from probe.store.db import Store


@dataclass(frozen=True)
class RunDiagnosis:
    """A run's verdict, its lanes' verdicts, and recommendations: from this run (and the sweep
    it belongs to, where it belongs to one), or for a run of a doctor session that answered,
    the session's, measured (`answered_by` names it): a run's own estimate never stands
    beside its session's measured answer."""

    run_id: str
    verdict: Verdict
    lanes: tuple[Verdict, ...]
    findings: tuple[Verdict, ...]  # what only several lanes show
    recommendations: tuple[Recommendation, ...]
    partial: bool
    answered_by: str | None = None  # the doctor session whose recommendations these are
    asides: tuple[Recommendation, ...] = ()  # changes that lose against yours: told after
    verified: bool = True  # the session's run again bore its recommendation out ("verified")
    what_if: str | None = None  # a watched run's: the doctor session measured like it, quoted

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "partial": self.partial,
            "verdict": self.verdict.to_json(),
            "lanes": [v.to_json() for v in self.lanes],
            "findings": [v.to_json() for v in self.findings],
            "recommendations": [r.to_json() for r in self.recommendations],
            "asides": [r.to_json() for r in self.asides],
            "answered_by": self.answered_by,
            "what_if": self.what_if,
        }


def diagnose_run(store: Store, run_id: str, sweep: SweepAnalysis | None = None) -> RunDiagnosis:
    """Diagnoses one stored run. A failed or interrupted run is judged on what it recorded and
    marked partial. A new num_workers is read from `sweep` (measured on the same lanes), or
    else from the sweep or doctor session the run belongs to, where that is stored."""
    run = store.run(run_id)
    session = _session_of(store, run)
    if sweep is None and session is not None and session.knob == "num_workers":
        sweep = session.analysis() if run.pipeline == "torch" else None
    facts = run_facts(store, run.run_id)
    diagnosis = judge_run(run.run_id, run.status, facts, sweep)
    if run.kind == "watch":
        recommendations = with_recipe(
            store, run, facts, diagnosis.verdict, diagnosis.recommendations
        )
        diagnosis = _with_what_if(
            store, run, replace(diagnosis, recommendations=tuple(recommendations))
        )
    if session is not None and session.kind is SessionKind.DOCTOR and session.answered:
        return replace(
            diagnosis,
            recommendations=session.recommendations,
            asides=session.asides,
            answered_by=session.session_id,
            verified=session.verify is None or session.verify.verified,
        )
    return diagnosis


def judge_run(
    run_id: str,
    status: RunStatus,
    facts: Sequence[LaneFacts],
    sweep: SweepAnalysis | None = None,
) -> RunDiagnosis:
    """A run's diagnosis from its lanes' facts."""
    own = [judge_lane(f) for f in facts]
    findings = tuple(judge_lanes(facts, own))
    lanes = tuple(held_lanes(facts, own))
    partial = status is not RunStatus.COMPLETED or any(v.partial for v in lanes)
    candidates = [*lanes, *findings]
    if not candidates:
        none = Evidence("lanes", 0.0, "the run has no lanes")
        empty = Verdict(VerdictKind.UNKNOWN, Severity.NONE, None, (none,), partial=True)
        return RunDiagnosis(run_id, empty, (), (), (), True)
    worst = max(candidates, key=rank)
    worst_facts = max(zip(facts, lanes, strict=True), key=lambda item: rank(item[1]))[0]
    waits = [v.data_wait_frac for v in lanes if v.data_wait_frac is not None]
    overall = Verdict(
        worst.kind,
        worst.severity,
        max(waits) if waits else None,
        worst.evidence,
        worst.lane,
        partial,
        all(v.reliable for v in candidates),
    )
    measured = [f for f in facts if f.figures.batches]
    recommendations = recommend(facts, lanes, findings, sweep)
    asides: list[Recommendation] = []
    if measured:  # a change below yours, all lanes together, is no recommendation
        errors = [f.figures.images_per_s_error for f in measured]
        yours = Estimate(
            sum(f.figures.images_per_s for f in measured),
            None if None in errors else math.hypot(*(e or 0.0 for e in errors)),
            min(f.figures.blocks for f in measured),
        )
        recommendations, asides = set_aside(recommendations, yours, worst_facts.change)
    return RunDiagnosis(
        run_id, overall, lanes, findings, tuple(recommendations), partial, asides=tuple(asides)
    )


def _with_what_if(store: Store, run: RunRecord, diagnosis: RunDiagnosis) -> RunDiagnosis:
    """A watched run's diagnosis with the doctor session measured like it (`what_if`) quoted,
    and its move to DALI as that session measured it, not estimated: recommended with its
    figure, or set aside with why."""
    found = what_if(store, run)
    if found is None:
        return diagnosis
    out, asides = [], list(diagnosis.asides)
    for item in diagnosis.recommendations:
        if item.change.knob is not Knob.PIPELINE:
            out.append(item)
            continue
        measured, aside = dali_as_measured(found, item)
        out += [] if measured is None else [measured]
        asides += [] if aside is None else [aside]
        if measured is None and aside is None:
            out.append(item)
    return replace(
        diagnosis,
        recommendations=tuple(out),
        asides=tuple(asides),
        what_if=what_if_text(found),
    )


def _session_of(store: Store, run: RunRecord) -> Session | None:
    """The sweep or doctor session a run belongs to (None: none, or not stored yet, as while a
    doctor judges your setting)."""
    if run.session_id is None:
        return None
    try:
        return read_session(store, run.session_id)
    except (InputError, KeyError, TypeError, ValueError):  # absent, or written unlike this one
        return None
