"""Sweeps and the doctor: several probe runs under one time budget, and what they show together.

A sweep runs one setting after another (DataLoader workers or DALI threads), each a stored run
in one session, and stops early once throughput has clearly fallen past its peak. The doctor
sweeps DataLoader workers with the chosen consumer, runs DALI with it, diagnoses the baseline
(the user's setting), ranks the changes by the throughput they were measured to give, and
verifies the first one by running it again.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pipelines import Backend, BackendUnavailable, InputError, check_backend
from probe.consumers import model_note
from probe.diagnose import (
    DALI_WORTH_IT,
    KNEE_WITHIN,
    Evidence,
    Recommendation,
    SweepAnalysis,
    SweepPoint,
    Verdict,
    VerdictKind,
    analyze_sweep,
    diagnose_run,
    past_the_peak,
)
from probe.runner import ProbeConfig, run_probe
from probe.store import RunStatus, SessionRecord, Store
from probe.summary import run_document

SWEEP_SCHEMA = "feedscope.sweep/1"
DOCTOR_SCHEMA = "feedscope.doctor/1"
MIN_MEASURE_S = 1.0  # the least a run measures; less says little
MAX_MEASURE_S = 30.0  # beyond this a longer budget buys little precision
FIRST_OVERHEAD_S = 5.0  # a run's start-up and warm-up, until one has been timed


class Budget:
    """Shares a time budget among the runs still to come.

    Each run costs its start-up and warm-up (the overhead, learned from the runs so far) plus
    the seconds it measures; what is left is shared equally among the runs left.
    """

    def __init__(self, total_s: float, runs: int) -> None:
        self.total_s = total_s
        self.runs_left = runs
        self.started = time.monotonic()
        self.overheads: list[float] = []

    @property
    def overhead_s(self) -> float:
        """A run's cost beyond what it measures: the worst seen so far, or a first guess."""
        return max(self.overheads) if self.overheads else FIRST_OVERHEAD_S

    def require(self, runs: int, what: str) -> None:
        """Raises InputError if the budget cannot measure `runs` runs at all."""
        needed = runs * (self.overhead_s + MIN_MEASURE_S)
        if self.total_s < needed:
            raise InputError(
                f"--budget {self.total_s:g} s is too small to measure anything: {what} needs "
                f"{runs} runs of about {self.overhead_s:g} s to start and warm up plus at least "
                f"{MIN_MEASURE_S:g} s of measuring each; give --budget {needed:.0f} or more"
            )

    def next_duration(self) -> float | None:
        """Seconds the next run may measure, or None if the budget has run out for it."""
        remaining = self.total_s - (time.monotonic() - self.started)
        share = remaining / max(self.runs_left, 1) - self.overhead_s
        self.runs_left -= 1
        if share < MIN_MEASURE_S:
            return None
        return min(share, MAX_MEASURE_S)

    def ran(self, wall_s: float, measured_s: float) -> None:
        self.overheads.append(max(0.0, wall_s - measured_s))


def check_budget(budget_s: float, runs: int, what: str) -> None:
    """Raises InputError if `budget_s` cannot measure `runs` runs at all."""
    Budget(budget_s, runs).require(runs, what)


def doctor_minimum() -> tuple[int, str]:
    """The fewest runs a diagnosis needs, and what they are: two worker counts, DALI where it
    is installed, and a verification."""
    if _dali_unavailable() is None:
        return 4, "a diagnosis (two worker counts, DALI, a verification)"
    return 3, "a diagnosis (two worker counts and a verification)"


def _dali_unavailable() -> str | None:
    try:
        check_backend(Backend.DALI)
    except BackendUnavailable as error:
        return str(error)
    return None


@dataclass
class _Session:
    store: Store
    kind: str
    stop: threading.Event
    on_event: Callable[[str, dict[str, Any]], None]

    def __post_init__(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.session_id = f"{self.kind}-{stamp}-{secrets.token_hex(2)}"
        self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.run_ids: list[str] = []

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

    def run(self, config: ProbeConfig, budget: Budget) -> dict[str, Any] | None:
        """Runs one probe within the budget; its document, or None if the budget ran out."""
        duration = budget.next_duration()
        if duration is None:
            return None
        started = time.monotonic()
        config = replace(config, duration_s=duration, batches=None)
        self.on_event("start", {"label": config.label, "duration_s": duration})
        run_id = run_probe(config, self.store, stop=self.stop, session_id=self.session_id)
        self.run_ids.append(run_id)
        document = run_document(self.store, run_id)
        measured = max((lane["seconds"] for lane in document["lanes"]), default=0.0)
        budget.ran(time.monotonic() - started, measured)
        self.on_event("run", document)
        return document


def with_setting(config: ProbeConfig, knob: str, value: int) -> ProbeConfig:
    """The same probe with `num_workers` (DataLoader) or `num_threads` (DALI) set to `value`."""
    spec = config.spec
    if knob == "num_workers":
        spec = replace(spec, dataloader=replace(spec.dataloader, num_workers=value))
        return replace(config, backend=Backend.TORCH, spec=spec, label=f"num_workers={value}")
    spec = replace(spec, dali=replace(spec.dali, num_threads=value))
    return replace(config, backend=Backend.DALI, spec=spec, label=f"DALI num_threads={value}")


def point_of(document: dict[str, Any], setting: int) -> SweepPoint:
    """A run as a sweep point: images/s over all lanes, the worst lane's data-wait."""
    lanes = document["lanes"]
    waits = [lane["data_wait_frac"] for lane in lanes if lane["data_wait_frac"] is not None]
    cpus = [lane["cpu_pct"] for lane in lanes if lane.get("cpu_pct") is not None]
    return SweepPoint(
        setting=setting,
        images_per_s=document["images_per_s"] if document["status"] == "completed" else 0.0,
        data_wait_frac=max(waits) if waits else None,
        cpu_pct=sum(cpus) if cpus else None,
        run_id=document["run_id"],
    )


def run_sweep(
    base: ProbeConfig,
    knob: str,
    values: list[int],
    budget_s: float,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, payload: None,
) -> dict[str, Any]:
    """Runs the settings in order (smallest first) and returns the sweep's document.

    Raises:
        InputError: the budget cannot measure two settings, or fewer than two are given.
    """
    if len(values) < 2:
        raise InputError("a sweep needs at least two settings")
    check_budget(budget_s, 2, "a sweep")
    budget = Budget(budget_s, len(values))
    session = _Session(store, "sweep", stop or threading.Event(), on_event)
    points, skipped = _sweep_points(session, base, knob, sorted(set(values)), budget)
    analysis = analyze_sweep(points, knob) if points else None
    status, reason = _status(session, points, skipped)
    document = {
        "schema": SWEEP_SCHEMA,
        "session_id": session.session_id,
        "status": status.value,
        "reason": reason,
        "created": session.created,
        "pipeline": "torch" if knob == "num_workers" else "dali",
        "consumer": str(base.consumer),
        "budget_s": budget_s,
        "elapsed_s": time.monotonic() - budget.started,
        **_sweep_fields(analysis, skipped),
        "run_ids": session.run_ids,
    }
    session.save(status, reason, document)
    return document


def _sweep_points(
    session: _Session, base: ProbeConfig, knob: str, values: list[int], budget: Budget
) -> tuple[list[SweepPoint], list[dict[str, Any]]]:
    points: list[SweepPoint] = []
    skipped: list[dict[str, Any]] = []
    for position, value in enumerate(values):
        if session.stop.is_set():
            skipped += [{"setting": v, "reason": "interrupted"} for v in values[position:]]
            break
        document = session.run(with_setting(base, knob, value), budget)
        if document is None:
            skipped.append({"setting": value, "reason": "the budget ran out"})
            continue
        if document["status"] == RunStatus.FAILED.value:
            skipped.append({"setting": value, "reason": f"the run failed: {document['reason']}"})
            continue
        points.append(point_of(document, value))
        session.on_event("point", {"knob": knob, **vars(points[-1])})
        if past_the_peak(points):
            later = values[position + 1 :]
            skipped += [{"setting": v, "reason": "past the peak"} for v in later]
            break
    return points, skipped


def _sweep_fields(analysis: SweepAnalysis | None, skipped: list[dict[str, Any]]) -> dict[str, Any]:
    if analysis is None:
        return {"points": [], "best": None, "knee": None, "oversubscribed": [], "skipped": skipped}
    knob = analysis.knob
    return {
        "knob": knob,
        "points": [_point_dict(p, knob) for p in analysis.points],
        "best": _point_dict(analysis.best, knob),
        "knee": _point_dict(analysis.knee, knob),
        "oversubscribed": [p.setting for p in analysis.oversubscribed],
        "skipped": skipped,
    }


def _point_dict(point: SweepPoint, knob: str) -> dict[str, Any]:
    return {
        knob: point.setting,
        "images_per_s": point.images_per_s,
        "data_wait_frac": point.data_wait_frac,
        "cpu_pct": point.cpu_pct,
        "run_id": point.run_id,
    }


def _status(
    session: _Session, points: list[SweepPoint], skipped: list[dict[str, Any]]
) -> tuple[RunStatus, str | None]:
    if session.stop.is_set():
        return RunStatus.INTERRUPTED, "stopped before its end (interrupted)"
    if len(points) < 2:
        return RunStatus.FAILED, "fewer than two settings were measured"
    reasons = {item["reason"] for item in skipped if item["reason"] != "past the peak"}
    if reasons:
        return RunStatus.COMPLETED, "partial: " + "; ".join(sorted(reasons))
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
) -> dict[str, Any]:
    """The whole diagnosis: DataLoader sweep, DALI, verdict, recommendations, verification.

    Args:
        base: the probe (consumer, lanes, pipeline options) every run shares.
        workers: DataLoader worker counts to sweep (the baseline is added).
        baseline_workers: the user's setting, whose run the verdict is about.
        dali_threads: DALI's threads for its run.

    Raises:
        InputError: the budget cannot measure the least a diagnosis needs.
    """
    values = sorted(set(workers) | {baseline_workers})
    dali_reason = _dali_unavailable()
    check_budget(budget_s, *doctor_minimum())
    budget = Budget(budget_s, len(values) + (0 if dali_reason else 1) + 1)
    session = _Session(store, "doctor", stop or threading.Event(), on_event)
    points, skipped = _sweep_points(session, base, "num_workers", values, budget)
    if len(points) < 1:
        raise InputError("no DataLoader setting could be measured: see `probe runs`")
    analysis = analyze_sweep(points, "num_workers")
    dali = _dali_run(session, base, dali_threads, budget, dali_reason)
    baseline = next((p for p in points if p.setting == baseline_workers), analysis.knee)
    verdict = _baseline_verdict(store, baseline, analysis)
    recommendations = _doctor_recommendations(store, analysis, baseline, verdict, dali)
    verify = _verify(session, base, recommendations, dali_threads, budget)
    if verify is not None and recommendations:
        recommendations[0] = replace(
            recommendations[0], measured_images_per_s=verify["measured_images_per_s"]
        )
    status, reason = _status(session, points, skipped)
    if verify is None and status is RunStatus.COMPLETED:
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
        "budget_s": budget_s,
        "elapsed_s": time.monotonic() - budget.started,
        "verdict": {**verdict.as_dict(), "run_id": baseline.run_id},
        "recommendations": [r.as_dict() for r in recommendations],
        "sweep": [_point_dict(p, "num_workers") for p in analysis.points],
        "knee": _point_dict(analysis.knee, "num_workers"),
        "oversubscribed": [p.setting for p in analysis.oversubscribed],
        "skipped": skipped,
        "dali": dali,
        "verify": verify,
        "run_ids": session.run_ids,
    }
    session.save(status, reason, document)
    return document


def _dali_run(
    session: _Session, base: ProbeConfig, threads: int, budget: Budget, reason: str | None
) -> dict[str, Any]:
    decoder = "mixed" if base.lanes[0].device is not None else "cpu"
    setting = f"DALI decoder={decoder} num_threads={threads}"
    empty = {"images_per_s": None, "setting": setting, "run_id": None, "data_wait_frac": None}
    if reason is not None:
        return {**empty, "reason": reason}
    if session.stop.is_set():
        return {**empty, "reason": "interrupted before DALI ran"}
    document = session.run(with_setting(base, "num_threads", threads), budget)
    if document is None:
        return {**empty, "reason": "the budget ran out before DALI ran"}
    if document["status"] != RunStatus.COMPLETED.value:
        return {**empty, "run_id": document["run_id"], "reason": document["reason"]}
    point = point_of(document, threads)
    return {
        "images_per_s": point.images_per_s,
        "setting": setting,
        "run_id": point.run_id,
        "data_wait_frac": point.data_wait_frac,
        "reason": None,
    }


def _baseline_verdict(store: Store, baseline: SweepPoint, analysis: SweepAnalysis) -> Verdict:
    """The baseline run's verdict, told what the sweep measured around it."""
    assert baseline.run_id is not None  # points come from runs
    verdict = diagnose_run(store, baseline.run_id).verdict
    best, knee = analysis.best, analysis.knee
    gain = best.images_per_s / baseline.images_per_s - 1 if baseline.images_per_s > 0 else 0.0
    if best.setting == baseline.setting:
        text = f"sweep: num_workers={best.setting}, yours, was the best measured"
    else:
        text = (
            f"sweep: num_workers={best.setting} was best ({best.images_per_s:,.0f} images/s, "
            f"{gain:+.0%} on yours, num_workers={baseline.setting})"
        )
    text += f"; the knee is num_workers={knee.setting}"
    evidence = (*verdict.evidence, Evidence("images_per_s", best.images_per_s, text))
    kind = verdict.kind
    if baseline in analysis.oversubscribed:
        kind = VerdictKind.OVERSUBSCRIBED
    elif kind is VerdictKind.STARVED_CPU_HEADROOM and gain < KNEE_WITHIN:
        kind = VerdictKind.STARVED_LOADER_LIMIT  # more workers were measured: they do not help
    return replace(verdict, kind=kind, evidence=evidence)


def _doctor_recommendations(
    store: Store,
    analysis: SweepAnalysis,
    baseline: SweepPoint,
    verdict: Verdict,
    dali: dict[str, Any],
) -> list[Recommendation]:
    knee = analysis.knee
    out: list[Recommendation] = []
    measured = f"measured in the sweep, run {knee.run_id}"
    if knee.setting == baseline.setting or baseline.images_per_s >= knee.images_per_s:
        action = "no change: num_workers is at the knee of the sweep"
        if verdict.kind is VerdictKind.FED:
            action = "no change: compute-bound; the DataLoader keeps up and DALI would not help"
        out.append(
            Recommendation(
                action,
                f"num_workers={baseline.setting}",
                baseline.images_per_s,
                f"measured in the sweep, run {baseline.run_id}",
            )
        )
    else:
        direction = "lower" if knee.setting < baseline.setting else "raise"
        out.append(
            Recommendation(
                f"{direction} num_workers from {baseline.setting} to {knee.setting}: the "
                f"smallest setting within {KNEE_WITHIN:.0%} of the best measured",
                f"num_workers={knee.setting}",
                knee.images_per_s,
                measured,
            )
        )
    dali_rate = dali.get("images_per_s")
    if dali_rate and dali_rate >= (1 + DALI_WORTH_IT) * analysis.best.images_per_s:
        out.insert(
            0,
            Recommendation(
                "move decoding and augmentation to DALI",
                dali["setting"],
                dali_rate,
                f"measured in the DALI run {dali['run_id']}",
                notes=tuple(_dali_trade(store, analysis.best, dali)),
            ),
        )
    elif dali_rate:
        dali["advice"] = _dali_not_worth_it(analysis, dali_rate, verdict)
    return out


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


def _dali_not_worth_it(analysis: SweepAnalysis, dali_rate: float, verdict: Verdict) -> str:
    best = analysis.best
    gain = dali_rate / best.images_per_s - 1 if best.images_per_s > 0 else 0.0
    if verdict.kind is VerdictKind.FED:
        return (
            f"DALI would not help: the DataLoader feeds the GPU (compute-bound); DALI measured "
            f"{dali_rate:,.0f} images/s, {gain:+.0%} on num_workers={best.setting}"
        )
    return (
        f"DALI measured {dali_rate:,.0f} images/s, {gain:+.0%} on the best DataLoader setting "
        f"(num_workers={best.setting}): less than the {DALI_WORTH_IT:.0%} a migration should gain"
    )


def _verify(
    session: _Session,
    base: ProbeConfig,
    recommendations: list[Recommendation],
    dali_threads: int,
    budget: Budget,
) -> dict[str, Any] | None:
    """Runs the first recommendation again: what it predicted, and what it measures."""
    if not recommendations or session.stop.is_set():
        return None
    top = recommendations[0]
    if top.setting.startswith("DALI"):
        config = with_setting(base, "num_threads", dali_threads)
    else:
        config = with_setting(base, "num_workers", int(top.setting.split("=")[1]))
    document = session.run(replace(config, label=f"verify {top.setting}"), budget)
    if document is None or document["status"] != RunStatus.COMPLETED.value:
        return None
    measured = document["images_per_s"]
    predicted = top.predicted_images_per_s or 0.0
    return {
        "setting": top.setting,
        "predicted_images_per_s": predicted,
        "measured_images_per_s": measured,
        "error_frac": (measured - predicted) / predicted if predicted else None,
        "run_id": document["run_id"],
    }


def _total(document: dict[str, Any], key: str) -> float | None:
    values = [lane.get(key) for lane in document["lanes"]]
    present = [v for v in values if v is not None]
    return sum(present) if present else None
