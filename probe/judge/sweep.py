"""A sweep: one knob's settings, smallest first, each a stored run on lanes kept warm, until
throughput has clearly fallen past its peak or the budget ends; then its knee, and for
num_workers the curve predicted from the first point alone (`probe.judge.model`), which the
other points check."""

from __future__ import annotations

import threading
from dataclasses import replace

from pipelines import InputError
from probe.judge.knee import analyze_sweep, past_the_peak
from probe.judge.model import run_curve
from probe.judge.results import Session, SessionKind
from probe.judge.session import (
    SHARE_PCT,
    Budget,
    OnEvent,
    Points,
    WarmSession,
    check_budget,
    startup_guess,
    with_setting,
)
from probe.measure.config import ProbeConfig, check_config
from probe.measure.runner import Lanes
from probe.store.db import Store


def run_sweep(
    base: ProbeConfig,
    knob: str,
    values: list[int],
    budget_s: float,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_event: OnEvent = lambda kind, payload: None,
    started: float | None = None,
) -> Session:
    """Measures the settings smallest first, on lanes kept warm, until throughput has clearly
    fallen past its peak; stores the session and returns it (its document: `Session.to_json`).

    Raises:
        InputError: fewer than two settings, or a budget that cannot fit two points.
    """
    values = sorted(set(values))
    # more workers or threads cost CPU: a knee, and settings past the peak; a larger share of
    # the hardware decoder costs none (SHARE_PCT): its best alone
    costs = knob != SHARE_PCT
    if len(values) < 2:
        raise InputError("a sweep needs at least two settings")
    check_budget(budget_s, 2, base, "a sweep")
    checked = check_config(with_setting(base, knob, values[0]))
    budget = Budget(budget_s, started, startup_guess(base))
    stop = stop or threading.Event()
    with Lanes(base.lanes, base.consumer, checked.num_classes, stop) as lanes:
        session = WarmSession(store, "sweep", stop, on_event, lanes, checked, budget)
        points = Points(session, base, knob)
        for position, value in enumerate(values):
            points.measure(value, later=len(values) - position - 1, reserve=0)
            if stop.is_set():  # what follows was not reached: no verdict on it
                points.skip(values[position + 1 :], "interrupted")
                break
            measured = [points.measured[v] for v in values[: position + 1] if v in points.measured]
            if costs and past_the_peak(measured):
                points.skip(values[position + 1 :], "past the peak")
                break
    analysis = analyze_sweep(list(points.measured.values()), knob) if points.measured else None
    if analysis is not None and not costs:  # a larger share costs nothing: no knee, none over
        analysis = replace(analysis, knee=analysis.best, oversubscribed=())
    first = analysis.points[0] if analysis is not None else None
    curve = None  # predicted from the first point alone: the others check it
    if knob == "num_workers" and first is not None and first.run_id is not None:
        curve = run_curve(store, first.run_id)
    status, reason = points.status()
    result = Session(
        kind=SessionKind.SWEEP,
        session_id=session.session_id,
        status=status,
        reason=reason,
        created=session.created,
        consumer=str(base.consumer),
        budget_s=budget_s,
        elapsed_s=budget.elapsed(),
        knob=knob,
        points=() if analysis is None else analysis.points,
        best=None if analysis is None else analysis.best,
        knee=None if analysis is None or not costs else analysis.knee,
        oversubscribed=()
        if analysis is None
        else tuple(p.setting for p in analysis.oversubscribed),
        skipped=tuple(points.skipped),
        run_ids=tuple(session.run_ids),
        precision=base.precision,
        startup_s=session.startup_s,
        consumer_alone=session.consumer_alone(),
        pipeline="torch" if knob == "num_workers" else "dali",
        read=base.read.value,
        curve=curve,
    )
    session.save(result)
    return result
