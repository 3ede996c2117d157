"""DALI at its best for the job: the doctor's search of its settings (`num_threads`, and for
the `mixed` decoder `hw_decoder_load`, the share of JPEGs sent to the GPU's hardware decoder;
the `cpu` decoder where the SMs hold it), each point chosen by what the points before it
measured (`probe.judge.dali_model`), not by a grid.

It starts from DALI's defaults (or the setting asked for), measures the setting the model
predicts fastest, and goes on while one is predicted faster than the best measured beyond that
point's error, up to MAX_POINTS, within the budget. The answer is the fastest setting measured,
with what holds DALI there (its verdict: its CPU threads, the hardware decoder, the SMs, or
nothing) and every point beside what was predicted for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from probe.judge.changes import Change, DaliPipeline, Knob
from probe.judge.dali_model import (
    CLOSE,
    DEFAULT_LOAD,
    DaliPoint,
    Host,
    Prediction,
    best_predicted,
    cpu_decoder_rate,
)
from probe.judge.dali_run import (
    HELD_BY_DECODER,
    HELD_BY_NOTHING,
    HELD_BY_SMS,
    HELD_BY_THREADS,
    DaliRun,
    DaliTried,
)
from probe.judge.diagnosis import diagnose_run
from probe.judge.evidence import slower_step
from probe.judge.facts import run_facts
from probe.judge.session import WarmSession, budget_short, few_blocks, point_of, with_change
from probe.judge.verdicts import VerdictKind
from probe.measure.config import ProbeConfig
from probe.metrics import IMAGES_PER_S
from probe.records import RunStatus

MAX_POINTS = 4  # DALI settings a doctor measures, its first included
MIN_GAIN = 0.03  # a setting predicted to gain less than this on the best measured is not run
# What held a DALI setting, by its run's verdict (anything else: the verdict's own title).
HOLDS = {
    VerdictKind.DALI_THREADS_SATURATED: HELD_BY_THREADS,
    VerdictKind.STARVED_CPU_SATURATED: HELD_BY_THREADS,
    VerdictKind.DALI_DECODER_SATURATED: HELD_BY_DECODER,
    VerdictKind.GPU_SHARED: HELD_BY_SMS,
    VerdictKind.FED: HELD_BY_NOTHING,
    VerdictKind.FED_WITHIN_ERROR: HELD_BY_NOTHING,
}


Measure = Callable[[DaliPipeline, str, "float | None", int], DaliTried]


def dali_search(
    session: WarmSession, base: ProbeConfig, threads: int, reason: str | None, later: int = 1
) -> DaliRun:
    """DALI on the session's lanes at its best setting found (decoder: the one asked for, else
    mixed on a GPU and cpu without), with `later` points planned after the search."""
    decoder = base.lane_spec(base.lanes[0]).dali_decoder.value
    load = base.spec.dali.hw_decoder_load if decoder == "mixed" else None
    start = DaliPipeline(decoder, threads, load)
    empty = DaliRun(decoder, threads, hw_decoder_load=load)
    if reason is not None:
        return replace(empty, reason=reason)
    if not session.budget.fits():
        return replace(empty, reason=budget_short(session.budget))

    def measure(pipeline: DaliPipeline, why: str, predicted: float | None, left: int) -> DaliTried:
        return _measure(session, base, pipeline, why, predicted, left)

    first = measure(start, _first_why(start), None, later)
    if first.lane_images_per_s is None:
        return replace(empty, tried=(first,), run_id=first.run_id, reason=first.reason)
    alone = (session.consumer_alone() or {}).get("images_per_s")
    read = decoder == "mixed" and first.nvjpg_pct is not None
    host = Host(_cores_per_lane(session, first), alone, read, first.pipeline.hw_decoder_load or 0.0)

    def fits(left: int) -> str | None:
        if session.stop.is_set():
            return "interrupted"
        return None if session.budget.fits(left) else budget_short(session.budget, left)

    tried, stopped = search(first, host, session.lane_count, measure, fits, later)
    return finish(empty, tried, host, stopped)


def search(
    first: DaliTried,
    host: Host,
    lanes: int,
    measure: Measure,
    fits: Callable[[int], str | None],
    later: int,
) -> tuple[list[DaliTried], str | None]:
    """From the `first` point measured: the setting not yet measured that the model predicts
    fastest, measured while it is predicted faster than the best measured beyond that point's
    error, up to MAX_POINTS in all, as long as `fits` (the budget, with `later` points after)
    lets it; where the SMs hold `mixed` at its best and the model predicts the cpu decoder
    faster, that within the same count. Returns the points in the order measured, and why the
    search ended before it converged (None: it converged)."""
    tried = [first]
    run = _Search(host, lanes, measure, fits, later)
    stopped = run.settings(tried)
    if stopped is None and first.pipeline.decoder == "mixed":
        stopped = run.cpu_decoder(tried)
    return tried, stopped


@dataclass(frozen=True)
class _Search:
    """What every step of one search shares: the lane's bounds, its lanes, how a setting is
    measured, whether the budget fits one, and the points planned after the search."""

    host: Host
    lanes: int
    measure: Measure
    fits: Callable[[int], str | None]
    later: int

    def settings(self, tried: list[DaliTried]) -> str | None:
        """The settings of the first point's decoder, measured into `tried` while one is
        predicted faster; why it ended before it converged (None: it converged)."""
        while True:
            best = _best(tried)
            if best is None:
                return "no DALI setting was measured well enough to predict from"
            wanted = best_predicted(_points(tried), self.host, tried[0].pipeline.decoder)
            if wanted is None or not _faster(wanted.images_per_s * self.lanes, best):
                return None
            refused = self.refused(wanted, tried)
            if refused is not None:
                return refused
            why = f"predicted fastest; {wanted.holds_text} would hold it"
            left = MAX_POINTS - len(tried) - 1 + self.later
            tried.append(self.measure(wanted.pipeline, why, wanted.images_per_s * self.lanes, left))

    def cpu_decoder(self, tried: list[DaliTried]) -> str | None:
        """Where the SMs hold `mixed` at its best: the cpu decoder, which leaves them to the
        model, measured where the model predicts it faster on the lane's cores."""
        best = _best(tried)
        if best is None or best.holds != HELD_BY_SMS:
            return None
        threads = max(1, int(self.host.cores))
        per_lane = cpu_decoder_rate(_points(tried), self.host, threads)
        if per_lane is None or not _faster(per_lane * self.lanes, best):
            return None
        cpu = Prediction(DaliPipeline("cpu", threads), per_lane, "threads")
        refused = self.refused(cpu, tried)
        if refused is None:
            why = "the SMs hold mixed: the cpu decoder frees them"
            tried.append(self.measure(cpu.pipeline, why, per_lane * self.lanes, self.later))
        return refused

    def refused(self, wanted: Prediction, tried: list[DaliTried]) -> str | None:
        """Why `wanted` is not measured (None: it is): MAX_POINTS, or the budget."""
        at_most = len(tried) >= MAX_POINTS
        why = f"the search measures {MAX_POINTS} at most" if at_most else self.fits(self.later)
        if why is None:
            return None
        predicted = IMAGES_PER_S.text(wanted.images_per_s * self.lanes)
        return f"{wanted.pipeline.setting}, predicted {predicted}, was not measured: {why}"


def finish(empty: DaliRun, tried: list[DaliTried], host: Host, stopped: str | None) -> DaliRun:
    """The search's answer: the fastest setting measured (among those within CLOSE of it, the
    fewest threads; a point on a busy host only where no other was judged), with every point,
    what holds it, and what was not searched."""
    notes = (
        [] if empty.decoder == "mixed" and host.hardware_decoder else [_share_note(empty.decoder)]
    )
    if stopped is not None:
        notes.append(stopped)
    point = _best(tried)
    chosen = empty if point is None else replace(empty.chosen(point), holds=point.holds)
    if point is None:
        chosen = replace(chosen, reason=stopped or "no DALI setting was measured well enough")
    return replace(chosen, tried=tuple(tried), not_searched="; ".join(notes) or None)


def _best(tried: list[DaliTried]) -> DaliTried | None:
    judged = [t for t in tried if t.images_per_s]
    trusted = [t for t in judged if not t.host_busy] or judged
    if not trusted:
        return None
    top = max(t.images_per_s or 0.0 for t in trusted)
    close = [t for t in trusted if (t.images_per_s or 0.0) >= top * (1 - CLOSE)]
    return min(close, key=lambda t: (t.pipeline.num_threads, -(t.images_per_s or 0.0)))


def _faster(predicted: float, best: DaliTried) -> bool:
    """Whether `predicted` (images/s for the job) beats the best measured beyond its error and
    MIN_GAIN."""
    assert best.images_per_s is not None
    error = (best.images_per_s_error or 0.0) / best.images_per_s
    return predicted >= best.images_per_s * (1 + max(MIN_GAIN, error))


def _cores_per_lane(session: WarmSession, first: DaliTried) -> float:
    assert first.run_id is not None
    return run_facts(session.store, first.run_id)[0].cores_per_lane


def _first_why(start: DaliPipeline) -> str:
    if start.decoder == "mixed" and start.hw_decoder_load == DEFAULT_LOAD:
        return "DALI's defaults"
    return "the setting asked for"


def _share_note(decoder: str) -> str:
    if decoder != "mixed":
        return (
            "decoder cpu decodes every JPEG on DALI's threads: there is no hardware decoder's "
            "share to search"
        )
    return (
        "NVML did not read the hardware JPEG decoder on this GPU (none, or a driver without the "
        "counter): hw_decoder_load was not searched"
    )


def _measure(
    session: WarmSession,
    base: ProbeConfig,
    pipeline: DaliPipeline,
    why: str,
    predicted: float | None,
    later: int,
) -> DaliTried:
    """One DALI setting measured on the warm lanes, with what its worst lane read."""
    out = DaliTried(pipeline, why, predicted)
    config = with_change(base, Change(Knob.PIPELINE, pipeline))
    assert config is not None
    document = session.measure(config, later=later)
    if document is None:
        return replace(out, reason="interrupted")
    if document.status != RunStatus.COMPLETED.value:
        return replace(out, run_id=document.run_id, reason=document.reason)
    point = point_of(session.store, document, pipeline.num_threads)
    if not point.estimate.judged:
        return replace(out, run_id=document.run_id, reason=few_blocks(point, session.budget))
    facts = min(run_facts(session.store, document.run_id), key=lambda f: f.figures.images_per_s)
    figures = facts.figures
    threads_cpu = None
    if figures.cpu_pct is not None:
        threads_cpu = max(0.0, figures.cpu_pct - (figures.main_thread_cpu_pct or 0.0))
    verdict = diagnose_run(session.store, document.run_id).verdict
    return replace(
        out,
        images_per_s=point.images_per_s,
        images_per_s_error=point.images_per_s_error,
        run_id=document.run_id,
        nvjpg_pct=figures.nvjpg_pct,
        threads_cpu_pct=threads_cpu,
        step_slowed=slower_step(facts),
        data_wait_frac=point.data_wait_frac,
        holds=HOLDS.get(verdict.kind, verdict.title),
        lane_images_per_s=figures.images_per_s,
        main_cpu_pct=figures.main_thread_cpu_pct,
        cpu_pct=point.cpu_pct,
        host_busy=point.host_busy,
    )


def _points(tried: list[DaliTried]) -> list[DaliPoint]:
    """The judged points as the model reads them."""
    return [t.point for t in tried if t.point is not None]
