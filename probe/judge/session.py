"""Measuring several settings on lanes kept warm, under one time budget: what sweeps and the
doctor share.

A session starts its lanes once (`probe.measure.runner.Lanes`): each consumer is built, tuned and
timed alone once, and each point after that rebuilds only the pipeline. A point is a stored run,
measured until its images/s is known within the precision asked, or until it rests on enough
blocks after ENOUGH_POINT_S, or until its share of the budget is spent: the budget left, split
between it and the points still planned after it, so that a slow pipeline gets longer points
(and fewer of them), never a refusal. A point the budget cannot fit at all is dropped, and the
budget that would fit it is said.
"""

from __future__ import annotations

import math
import secrets
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipelines import Backend, Decoder, InputError
from probe.judge.changes import Change, DaliPipeline, Knob
from probe.judge.facts import run_facts
from probe.judge.knee import SweepPoint
from probe.judge.results import Session, Skipped
from probe.measure.config import Checked, ProbeConfig
from probe.measure.consumers import ConsumerKind
from probe.measure.runner import Lanes
from probe.metrics import counted
from probe.records import RunStatus, SessionRecord
from probe.steady import MIN_BLOCK_BATCHES, MIN_BLOCKS, MIN_MEASURE_S
from probe.store.db import Store
from probe.store.documents import RunDocument, read_run

# A point measured until precise stops after this long once it rests on MIN_BLOCKS blocks of a
# batch per worker, precise or not: the rest of the budget goes to other points.
ENOUGH_POINT_S = 20.0
POINT_GUESS_S = 5.0  # a point's overhead (pipeline start, warm-up, its end), until one is timed
# the fewest batches a point is given: MIN_BLOCKS / 2 blocks of the smallest size (a point is
# judged on fewer, MIN_JUDGED_BLOCKS, with its wide error, where the budget ran short)
MIN_POINT_BATCHES = MIN_BLOCKS // 2 * MIN_BLOCK_BATCHES

# What a session tells as it goes: ("start", {"label", "max_s"}) before a run, ("run",
# RunDocument) after it, ("point", {"knob", and the SweepPoint's fields}) once it is judged.
OnEvent = Callable[[str, Any], None]


def startup_guess(config: ProbeConfig) -> float:
    """Seconds to start a session's lanes, before they have been timed: the process and torch,
    CUDA on a GPU, a model built and tuned, the consumer timed alone."""
    on_gpu = any(plan.device is not None for plan in config.lanes)
    model = config.consumer.kind is ConsumerKind.MODEL
    return 6.0 + (6.0 if on_gpu else 0.0) + (15.0 if model else 0.0)


def check_budget(budget_s: float, points: int, config: ProbeConfig, what: str) -> None:
    """Raises InputError if `budget_s` cannot fit `points` trustworthy points, with the least
    that would."""
    startup = startup_guess(config)
    least = startup + points * (POINT_GUESS_S + MIN_MEASURE_S)
    if not budget_s >= least:
        count = "one trustworthy point" if points == 1 else f"{points} trustworthy points"
        raise InputError(
            f"--budget {budget_s:g} s cannot fit {count} for {what}: starting the lanes takes "
            f"about {startup:.0f} s, and a point at least about "
            f"{POINT_GUESS_S + MIN_MEASURE_S:.0f} s (its pipeline's start, its warm-up and "
            f"{MIN_MEASURE_S:g} s measured); give --budget {math.ceil(least)} or more"
        )


class Budget:
    """A session's seconds: the lanes' start-up, then points, each costing its overhead (its
    pipeline's start, its warm-up, its end) and its measuring. A point gets its share of what is
    left; one that cannot get the least a point is given is dropped."""

    def __init__(self, total_s: float, started: float | None = None, startup_s: float = 0.0):
        self.total_s = total_s
        self.started = time.monotonic() if started is None else started
        self.startup_left = startup_s  # the lanes' start, until the first point has paid it
        self.overheads: list[float] = []
        self.measured: list[float] = []  # each point's measuring, in seconds
        self.batch_s: list[float] = []  # each point's seconds per batch

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        """What is left for points: the budget less what was spent and the lanes' start."""
        return self.total_s - self.elapsed() - self.startup_left

    def overhead(self) -> float:
        """A point's cost besides its measuring: the median of those timed, or a guess."""
        return statistics.median(self.overheads) if self.overheads else POINT_GUESS_S

    def least_measure(self) -> float:
        """The least measuring a point is given: MIN_POINT_BATCHES batches at the points' median
        pace so far, and MIN_MEASURE_S."""
        pace = statistics.median(self.batch_s) if self.batch_s else 0.0
        return max(MIN_MEASURE_S, MIN_POINT_BATCHES * pace)

    def point_cost(self) -> float:
        """The least a point costs."""
        return self.overhead() + self.least_measure()

    def typical_cost(self) -> float:
        """What a point has cost: its overhead and the median measuring so far (at least the
        least a point costs)."""
        return self.run_cost(math.inf)

    def run_cost(self, max_s: float) -> float:
        """What a point measuring at most `max_s` costs: its overhead and the median measuring
        so far, up to `max_s` (at least the least a point is given)."""
        measured = statistics.median(self.measured) if self.measured else 0.0
        return self.overhead() + max(self.least_measure(), min(max_s, measured))

    def fits(self, reserve: int = 0) -> bool:
        """Whether a point fits, with `reserve` more points of the typical cost left over."""
        return self.remaining() >= self.point_cost() + reserve * self.typical_cost()

    def share(self, later: int = 0) -> float:
        """The measuring seconds a point may take: what is left, split evenly between it and
        `later` more points, less its overhead (the last point's, the longest timed: nothing
        after it absorbs a longer warm-up); at least the least a point is given."""
        overhead = max(self.overheads, default=POINT_GUESS_S) if not later else self.overhead()
        return max(self.least_measure(), self.remaining() / (1 + later) - overhead)

    def needed(self, reserve: int = 0) -> int:
        """The budget that would have fitted this point and `reserve` more: what was spent,
        and what each costs (rounded up to 10 s)."""
        return self.needed_for(self.point_cost() + reserve * self.typical_cost())

    def needed_for(self, more_s: float) -> int:
        """The budget that would have fitted `more_s` seconds more: what was spent and those
        (rounded up to 10 s)."""
        spent = self.total_s - self.remaining()
        return int(math.ceil((spent + more_s) / 10) * 10)

    def ran(self, wall_s: float, measured_s: float, batches: int) -> None:
        """Notes a point: its wall time (the lanes' start taken out) and what it measured."""
        self.startup_left = 0.0
        self.overheads.append(max(0.0, wall_s - measured_s))
        self.measured.append(measured_s)
        if batches:
            self.batch_s.append(measured_s / batches)


SHARE_PCT = "hw_decoder_load_pct"  # DALI's hw_decoder_load as a whole percent (a sweep's knob)


def with_setting(config: ProbeConfig, knob: str, value: float) -> ProbeConfig:
    """The same probe with `num_workers` (DataLoader), `num_threads` or `hw_decoder_load_pct`
    (DALI's hw_decoder_load in whole percent) set to `value`."""
    spec = config.spec
    if knob == Knob.NUM_WORKERS.value:
        spec = replace(spec, dataloader=replace(spec.dataloader, num_workers=int(value)))
        return replace(config, backend=Backend.TORCH, spec=spec, label=f"num_workers={value}")
    if knob == SHARE_PCT:
        share = value / 100
        spec = replace(spec, dali=replace(spec.dali, hw_decoder_load=share))
        label = f"DALI hw_decoder_load={share:g}"
        return replace(config, backend=Backend.DALI, spec=spec, label=label)
    spec = replace(spec, dali=replace(spec.dali, num_threads=int(value)))
    return replace(config, backend=Backend.DALI, spec=spec, label=f"DALI num_threads={value}")


def with_change(config: ProbeConfig, change: Change) -> ProbeConfig | None:
    """The same probe with `change` made (None: not a change of the worker count nor a move to
    DALI, which a session cannot run)."""
    if change.knob is Knob.NUM_WORKERS and isinstance(change.value, int):
        return with_setting(config, Knob.NUM_WORKERS.value, change.value)
    if change.knob is Knob.PIPELINE and isinstance(change.value, DaliPipeline):
        target = change.value
        config = with_setting(config, Knob.NUM_THREADS.value, target.num_threads)
        dali = config.spec.dali
        if config.lane_spec(config.lanes[0]).dali_decoder.value != target.decoder:
            dali = replace(dali, decoder=Decoder(target.decoder))
        if target.hw_decoder_load is not None:
            dali = replace(dali, hw_decoder_load=target.hw_decoder_load)
        return replace(config, spec=replace(config.spec, dali=dali), label=target.setting)
    return None


def point_of(store: Store, document: RunDocument, setting: int) -> SweepPoint:
    """A run as a sweep point: images/s over all lanes (errors added in quadrature), the worst
    lane's data-wait, the lanes' CPU, and whether the host's other load could have moved it."""
    worst = document.worst_lane
    completed = document.status == RunStatus.COMPLETED.value
    return SweepPoint(
        setting=setting,
        images_per_s=document.images_per_s if completed else 0.0,
        data_wait_frac=document.data_wait_frac,
        cpu_pct=document.cpu_pct,
        run_id=document.run_id,
        images_per_s_error=document.images_per_s_error,
        blocks=min((lane.figures.blocks for lane in document.lanes), default=0),
        data_wait_frac_error=None if worst is None else worst.figures.data_wait_frac_error,
        host_busy=any(f.host_busy for f in run_facts(store, document.run_id)),
    )


@dataclass
class WarmSession:
    """A session's lanes kept warm, its store and its budget: measures one point at a time."""

    store: Store
    kind: str  # "sweep" or "doctor"
    stop: threading.Event
    on_event: OnEvent
    lanes: Lanes
    checked: Checked
    budget: Budget
    run_ids: list[str] = field(default_factory=list)
    startup_s: float | None = None  # the lanes' start and the consumer timed alone

    def __post_init__(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.session_id = f"{self.kind}-{stamp}-{secrets.token_hex(2)}"
        self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def save(self, session: Session) -> None:
        self.store.save_session(
            SessionRecord(
                session_id=self.session_id,
                kind=self.kind,
                created=self.created,
                status=session.status,
                reason=session.reason,
                hostname=socket.gethostname(),
                pid=None,
                document=session.to_json(),
            )
        )

    def measure(
        self, config: ProbeConfig, later: int = 0, max_s: float | None = None
    ) -> RunDocument | None:
        """Measures one point on the warm lanes, for its share of the budget with `later` more
        points planned (and at most `max_s`, where given, and the least a point is given); its
        run (None: stopped before)."""
        if self.stop.is_set():
            return None
        cap = self.budget.share(later)
        if max_s is not None:
            cap = min(cap, max(max_s, self.budget.least_measure()))
        config = replace(config, batches=None, duration_s=None, max_s=cap, enough_s=ENOUGH_POINT_S)
        self.on_event("start", {"label": config.label, "max_s": cap})
        started = time.monotonic()
        run_id = self.lanes.measure(config, self.store, self.checked, session_id=self.session_id)
        self.run_ids.append(run_id)
        document = read_run(self.store, run_id)
        wall = time.monotonic() - started
        if self.startup_s is None:  # the first point also started the lanes
            self.startup_s = max(
                (lane.figures.startup_s or 0.0)
                + ((lane.figures.consumer_alone or {}).get("seconds") or 0.0)
                for lane in document.lanes
            )
            wall = max(0.0, wall - self.startup_s)
        slowest = max(document.lanes, key=lambda lane: lane.figures.seconds, default=None)
        figures = None if slowest is None else slowest.figures
        self.budget.ran(
            wall, figures.seconds if figures else 0.0, figures.batches if figures else 0
        )
        self.on_event("run", document)
        return document

    @property
    def lane_count(self) -> int:
        return len(self.lanes.plans)

    def consumer_alone(self) -> dict[str, Any] | None:
        """The consumer alone (lane 0's), as the lanes measured it once."""
        return self.lanes.consumer_alone.get(min(self.lanes.plans), None)


def budget_short(budget: Budget, later: int = 0, after: bool = True) -> str:
    """Why a point was not measured: the budget, and the budget that would have fitted it with
    `later` points' worth more: the points planned after it (`after`), else its own length."""
    left = max(0.0, budget.remaining())
    takes = budget.point_cost() + later * budget.typical_cost()
    planned = f"it and the {counted(later, 'point')} planned after it take"
    what = planned if later and after else "it takes"
    return (
        f"what was left of the budget, {left:.0f} s, cannot fit it ({what} at least about "
        f"{takes:.0f} s here): --budget {budget.needed(later)} would"
    )


def few_blocks(point: SweepPoint, budget: Budget, later: int = 0) -> str:
    """Why a measured point is not judged on: its figure and the few blocks it rests on."""
    shown = f"{point.images_per_s:,.0f} images/s"
    if point.images_per_s_error is not None:
        shown = f"{point.images_per_s:,.0f} ± {point.images_per_s_error:,.0f} images/s"
    return (
        f"too few batches to judge ({shown} on {counted(point.blocks, 'block')}): --budget "
        f"{budget.needed(later)} would measure it longer"
    )


class Points:
    """The points of one knob measured so far, and those not measured, with why."""

    def __init__(self, session: WarmSession, base: ProbeConfig, knob: str) -> None:
        self.session, self.base, self.knob = session, base, knob
        self.measured: dict[int, SweepPoint] = {}
        self.skipped: list[Skipped] = []

    def skip(self, values: list[int], reason: str) -> None:
        self.skipped += [Skipped(v, reason) for v in values]

    def best(self) -> SweepPoint:
        return max(self.measured.values(), key=lambda p: p.images_per_s)

    def tried(self) -> set[int]:
        """The settings measured or skipped."""
        return {item.setting for item in self.skipped} | set(self.measured)

    def measure(self, value: int, later: int = 0, reserve: int | None = None) -> SweepPoint | None:
        """Measures the setting for its share of the budget with `later` points planned after
        it, if the budget fits it with `reserve` points (default: `later`) left over."""
        session = self.session
        reserve = later if reserve is None else reserve
        if session.stop.is_set():
            self.skip([value], "interrupted")
            return None
        if not session.budget.fits(reserve):
            self.skip([value], budget_short(session.budget, reserve))
            return None
        document = session.measure(with_setting(self.base, self.knob, value), later)
        if document is None or document.status == RunStatus.INTERRUPTED.value:
            self.skip([value], "interrupted")
            return None
        if document.status == RunStatus.FAILED.value:
            self.skip([value], f"the run failed: {document.reason}")
            return None
        point = point_of(session.store, document, value)
        if not point.estimate.judged:
            self.skip([value], few_blocks(point, session.budget, later))
            return None
        self.measured[value] = point
        session.on_event("point", {"knob": self.knob, **vars(point)})
        return point

    def status(self) -> tuple[RunStatus, str | None]:
        """How the session ended: interrupted, failed (no point judged), or completed, partly
        where the budget dropped points or runs failed."""
        if self.session.stop.is_set():
            return RunStatus.INTERRUPTED, "stopped before its end (interrupted)"
        if not self.measured:
            return RunStatus.FAILED, "no setting was measured well enough to judge"
        dropped = sorted(
            {
                s.reason
                for s in self.skipped
                if s.reason.startswith(("the budget", "the run failed"))
            }
        )
        if dropped:
            return RunStatus.COMPLETED, "partial: " + "; ".join(dropped)
        return RunStatus.COMPLETED, None
