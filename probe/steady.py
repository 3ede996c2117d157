"""Steady state and its error: when warm-up ends, a figure from batch events with its
uncertainty, and what epoch starts and ends cost. Pure functions of batch events; no hardware.

A batch's time is its wait plus its step: the probe's own bookkeeping between batches, and a
training loop's time outside the loader's `for` (between epochs), are in no figure. Images/s is
images over that time, data-wait the share of it spent waiting.

Errors come from batch means: the measured batches are cut into consecutive blocks (a batch per
DataLoader worker each, at least `MIN_BLOCK_BATCHES`, whole epochs when the loader restarts at
each epoch; fewer batches a block where a slow pipeline measured too few for `FEW_BLOCKS` such
blocks), and the spread of the blocks gives a 95% interval (Student's t) for the ratio. A figure
is precise on `MIN_BLOCKS` full blocks or more; on fewer (down to `MIN_JUDGED_BLOCKS`) it is
judged with its wider error, never dropped.

A window is steady only when nothing left from its start is still being consumed: once the
rate has settled, the batches the pipeline holds in flight are taken and not stepped (`Warmup`),
so that the window opens on an empty prefetch queue; a lane measuring until precise moves the
first half of a window whose halves differ far beyond their errors into its warm-up
(`transient`); and a window whose halves still differ beyond their errors trends: its error
covers the difference, so that it is measured on (extended) until the halves agree.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from probe.records import BatchEvent

MIN_BLOCKS = 10  # a figure is precise on at least this many blocks
MIN_JUDGED_BLOCKS = 3  # ... and judged, with its wider error (t: 4.3), on at least this many
FEW_BLOCKS = 5  # blocks shrink below a batch per worker only where they would be fewer
MAX_BLOCKS = 30  # more, longer blocks once there are enough batches: less correlated
MIN_BLOCK_BATCHES = 2
MIN_HALF_BLOCKS = 3  # a window is tested for a trend once each half holds this many blocks
# Halves this many times their 95% margin apart: the first half still belongs to the start (a
# lane tests a window at a few growing lengths, so that chance alone rarely cuts one).
TREND_CUT = 2.0
PRECISION = 0.03  # by default a point is measured until images/s is known within +-3% (95%)
MAX_MEASURE_S = 60.0  # ... or for this long, whichever comes first
MIN_MEASURE_S = 3.0  # and never on less than this: a few lucky blocks are not precision
# A lane with no batch for this many times its slowest wait between batches so far, and at least
# this long, is stopped as stalled (a dead mount, a worker stuck in a C library): `--stall-s`.
STALL_TIMES = 10
STALL_FLOOR_S = 60.0
# Two runs of one setting in one session differ by more than their errors: the machine drifts
# (seen: 2-7% on the 2-core machine; on an H100, 4% for 16 DataLoader workers between a doctor's
# point and its verification, 12% against a sweep's point, with errors of 1-3%). Each run is
# allowed this much more, at 95%, where runs are compared to recommend a change.
DRIFT = 0.03
SETTLED_WITHIN = 0.10  # warm-up ends once two windows' rates agree within 10%
MIN_WINDOW_S = 1.0  # a warm-up window holds at least this much time ...
WINDOW_BLOCKS = 2  # ... and this many blocks of batches
MAX_WARMUP_S = 20.0  # then measuring starts anyway, and the run says it did not settle
# A consumer that waited less than this share of the last warm-up window may have a full
# prefetch queue ahead of it: what it holds is taken, not stepped, before measuring.
FED_WAIT = 0.05

# Student's t, two-sided 95%, for 1 .. 30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """A measured figure and the half-width of its 95% interval (None: too few blocks)."""

    value: float
    error: float | None
    blocks: int
    trend: float | None = None  # the second half against the first, where they differ beyond
    # their errors (-0.2: 20% lower); the error then covers the difference

    @property
    def relative_error(self) -> float | None:
        if self.error is None or self.value == 0:
            return None
        return self.error / abs(self.value)

    @property
    def judged(self) -> bool:
        """Whether it rests on enough blocks to judge or compare on, with its error."""
        return self.error is not None and self.blocks >= MIN_JUDGED_BLOCKS

    def within(self, precision: float) -> bool:
        """Whether it rests on MIN_BLOCKS blocks and is known within `precision` (a share of its
        value)."""
        relative = self.relative_error
        return self.blocks >= MIN_BLOCKS and relative is not None and relative <= precision


def block_batches(loaders: int | None, batches: int | None = None) -> int:
    """Batches per block: one per DataLoader worker, which make them in turn, and at least
    MIN_BLOCK_BATCHES; where only `batches` were measured, fewer, so that they make
    FEW_BLOCKS blocks. Whole rounds of the workers are kept while they make FEW_BLOCKS: a
    block shorter than a round holds a burst or a gap, its blocks spread far more, and the
    error is wider (not narrower) than on fewer whole rounds."""
    full = max(MIN_BLOCK_BATCHES, loaders or 0)
    if batches is None:
        return full
    return max(MIN_BLOCK_BATCHES, min(full, batches // FEW_BLOCKS))


def batch_seconds(event: BatchEvent) -> float:
    return event.wait_s + event.step_s


def blocks(events: Sequence[BatchEvent], size: int) -> list[list[BatchEvent]]:
    """Consecutive blocks of at least `size` events, at most MAX_BLOCKS of them; a last short
    block is joined to the one before it. Where the events span MIN_BLOCKS epochs or more, the
    blocks hold whole epochs: an epoch start's cost then falls into every block alike."""
    by_epoch = len({e.epoch for e in events}) >= MIN_BLOCKS
    out: list[list[BatchEvent]] = []
    current: list[BatchEvent] = []
    for event in events:
        boundary = not by_epoch or (current and event.epoch != current[-1].epoch)
        if len(current) >= size and boundary:
            out.append(current)
            current = []
        current.append(event)
    if current:
        if out and len(current) < size:
            out[-1] = out[-1] + current
        else:
            out.append(current)
    if len(out) > MAX_BLOCKS:  # join neighbours evenly into MAX_BLOCKS blocks
        edges = [round(i * len(out) / MAX_BLOCKS) for i in range(MAX_BLOCKS + 1)]
        out = [[e for part in out[a:b] for e in part] for a, b in itertools.pairwise(edges)]
    return out


def ratio(pairs: Sequence[tuple[float, float]]) -> Estimate:
    """Sum of numerators over sum of denominators, with the ratio estimator's 95% error over
    the (numerator, denominator) pairs of the blocks."""
    total_x = sum(x for _, x in pairs)
    if total_x <= 0:
        return Estimate(0.0, None, len(pairs))
    value = sum(y for y, _ in pairs) / total_x
    count = len(pairs)
    if count < 2:
        return Estimate(value, None, count)
    mean_x = total_x / count
    spread = sum((y - value * x) ** 2 for y, x in pairs) / (count - 1)
    error = t95(count - 1) * math.sqrt(spread / count) / mean_x
    return Estimate(value, error, count)


def t95(degrees: int) -> float:
    """Student's t quantile for a two-sided 95% interval."""
    if degrees < 1:
        return math.inf
    if degrees <= len(_T95):
        return _T95[degrees - 1]
    return 1.96 + 2.4 / degrees  # within 0.1% of the exact value from 30 on


def steady_ratio(pairs: Sequence[tuple[float, float]]) -> Estimate:
    """`ratio` over consecutive blocks, tested for a trend: where the first half's ratio differs
    from the second half's beyond what the second half's spread allows (`halves`), the window is
    not steady yet, and its error covers the distance from the whole to the second half
    (`Estimate.trend` says how much the halves differ)."""
    whole = ratio(pairs)
    found = halves(pairs)
    if whole.error is None or found is None:
        return whole
    first, second, allowed = found
    if abs(first.value - second.value) <= allowed:
        return whole
    error = math.hypot(whole.error, whole.value - second.value)
    return Estimate(whole.value, error, whole.blocks, second.value / first.value - 1)


def halves(pairs: Sequence[tuple[float, float]]) -> tuple[Estimate, Estimate, float] | None:
    """The ratios of a window's first and second halves of blocks, and the 95% margin by which
    the first may differ from the second if the window is steady: the second half's spread, for
    both halves' blocks (a first half that holds a transient spreads more, and would hide it).
    None where a half holds fewer than MIN_HALF_BLOCKS blocks."""
    half = len(pairs) // 2
    if half < MIN_HALF_BLOCKS:
        return None
    first, second = ratio(pairs[:half]), ratio(pairs[half:])
    if second.error is None or first.value <= 0:
        return None
    return first, second, second.error * math.sqrt(1 + (len(pairs) - half) / half)


def transient(measured: Sequence[BatchEvent], loaders: int | None = None) -> int:
    """How many batches at the start of a measured window still belong to its start: its first
    half, where the images/s of its two halves (blocks of a batch per worker) differ by more
    than TREND_CUT times the margin a steady window allows (`halves`: a backlog drained, a
    consumer that sped up); else 0."""
    size = block_batches(loaders)
    if len(measured) < 2 * MIN_HALF_BLOCKS * size:
        return 0
    parts = blocks(measured, size)
    found = halves([(sum(e.size for e in b), sum(batch_seconds(e) for e in b)) for b in parts])
    if found is None:
        return 0
    first, second, allowed = found
    if abs(first.value - second.value) <= TREND_CUT * allowed:
        return 0
    return sum(len(b) for b in parts[: len(parts) // 2])


def images_per_s(measured: Sequence[BatchEvent], loaders: int | None = None) -> Estimate:
    """Images per second of batch time, with its error."""
    parts = blocks(measured, block_batches(loaders, len(measured)))
    return steady_ratio([(sum(e.size for e in b), sum(batch_seconds(e) for e in b)) for b in parts])


def data_wait(measured: Sequence[BatchEvent], loaders: int | None = None) -> Estimate:
    """Data-wait (`probe.metrics.wait_share` of all measured batches), with its error from the
    blocks'."""
    parts = blocks(measured, block_batches(loaders, len(measured)))
    return steady_ratio(
        [(sum(e.wait_s for e in b), sum(batch_seconds(e) for e in b)) for b in parts]
    )


def pooled(estimates: Sequence[Estimate]) -> Estimate:
    """Several runs of one setting as one figure: their mean, its error from theirs (what the
    runs differ by beyond that is the drift that comparisons with `drift` allow for)."""
    errors = [e.error for e in estimates if e.error is not None]
    error = math.hypot(*errors) / len(estimates) if len(errors) == len(estimates) else None
    value = sum(e.value for e in estimates) / len(estimates)
    return Estimate(value, error, sum(e.blocks for e in estimates))


def at_least(a: Estimate, fraction: float, b: Estimate) -> bool:
    """Whether `a` is not significantly below `fraction` x `b` (their own errors)."""
    return a.value + margin(a, fraction, b) >= fraction * b.value


def above(a: Estimate, fraction: float, b: Estimate) -> bool:
    """Whether `a`, measured in another run than `b`, is significantly above `fraction` x `b`:
    beyond their errors and the drift between runs. What is recommended as a change rests on
    this."""
    return a.value - margin(a, fraction, b, drift=True) > fraction * b.value


def margin(a: Estimate, fraction: float, b: Estimate, *, drift: bool = False) -> float:
    """The 95% margin of `a` against `fraction` x `b`: their errors, and with `drift`, DRIFT of
    each (two runs of one setting differ by more than their errors)."""
    parts = [a.error or 0.0, fraction * (b.error or 0.0)]
    if drift:
        parts += [DRIFT * a.value, DRIFT * fraction * b.value]
    return math.hypot(*parts)


class Warmup:
    """Tells which batches are warm-up: the first `fixed` ones, or (`fixed` None) those until
    the rate settles (two consecutive windows of batches agree within SETTLED_WITHIN) and then,
    where the consumer hardly waited in the last window (FED_WAIT), `in_flight` more, the
    batches the pipeline holds ahead: taken and not stepped (`flushing`), so that measuring
    starts with nothing made ahead of it. A prefetch queue that filled while the consumer was
    slower (in its first steps, or while the last pipeline's processes ended) would otherwise be
    read as throughput while it drains; a fed pipeline's queue refills at once, and a consumer
    that waits has emptied it. With `by_epoch` windows end at epoch
    starts, measuring starts at one, and nothing is flushed (each epoch starts empty)."""

    def __init__(
        self,
        fixed: int | None,
        loaders: int | None,
        by_epoch: bool,
        min_window_s: float = MIN_WINDOW_S,
        in_flight: int = 0,
    ) -> None:
        self.fixed, self.by_epoch, self.min_window_s = fixed, by_epoch, min_window_s
        self.in_flight = 0 if by_epoch or fixed is not None else in_flight
        self.window_batches = 1 if by_epoch else WINDOW_BLOCKS * block_batches(loaders)
        self.batches = 0
        self.seconds = 0.0
        self.settled: bool | None = None  # None while warming up
        self._flush = 0  # batches still to take and not step once settled
        self._window = [0, 0.0, 0, 0.0]  # batches, seconds, images, wait
        self._waited = 0.0  # the last window's data-wait share
        self._last_epoch: int | None = None
        self._rates: list[float] = []

    def flush(self) -> None:
        """Takes the batches in flight again, not stepped: a window that restarts (its start
        still trended) opens on an empty queue too."""
        self._flush = self.in_flight

    @property
    def flushing(self) -> bool:
        """Whether the next batch is to be taken and not stepped: one of those the pipeline
        held ahead when the rate settled."""
        return self._flush > 0

    def warming(self, event: BatchEvent) -> bool:
        """Whether `event`, the next batch, is still warm-up."""
        if self._flush > 0:
            self._flush -= 1
            self._count(event)
            return True
        if self.settled is not None:
            return False
        if self.fixed is not None:
            if self.batches >= self.fixed:
                self.settled = True
                return False
            self._count(event)
            return True
        new_epoch = self._last_epoch is not None and event.epoch != self._last_epoch
        self._last_epoch = event.epoch
        count, seconds = self._window[0], self._window[1]
        full = count >= self.window_batches and seconds >= self.min_window_s
        # epochs too long to wait for are cut like a stream
        boundary = new_epoch or not self.by_epoch or seconds >= MAX_WARMUP_S / 4
        if full and boundary:
            self._rates.append(self._window[2] / seconds if seconds > 0 else 0.0)
            self._waited = self._window[3] / seconds if seconds > 0 else 0.0
            self._window = [0, 0.0, 0, 0.0]
            if self._agree() or self.seconds >= MAX_WARMUP_S:
                self.settled = self._agree()
                # a consumer that waited emptied the queue: nothing is left ahead of it
                self._flush = self.in_flight if self._waited < FED_WAIT else 0
                if not self._flush:
                    return False
        self._count(event)
        self._window[0] += 1
        self._window[1] += batch_seconds(event)
        self._window[2] += event.size
        self._window[3] += event.wait_s
        return True

    def _count(self, event: BatchEvent) -> None:
        self.batches += 1
        self.seconds += batch_seconds(event)

    def _agree(self) -> bool:
        if len(self._rates) < 2:
            return False
        last, before = self._rates[-1], self._rates[-2]
        return abs(last - before) <= SETTLED_WITHIN * max(last, before)


@dataclass(frozen=True)
class EpochStarts:
    """What epoch starts and ends cost in a measured window."""

    starts: int  # epoch starts within the measured window
    batches_per_epoch: float  # batches an epoch: the median of those not cut by the end
    opening_batches: int  # the batches of each start counted as its opening
    stall_s: float  # per start: its opening batches' wait beyond the steady wait
    share: float  # of the measured time
    steady_images_per_s: float  # with the stalls taken out
    ends: int  # epoch ends within the measured window whose tails were measured
    tail_batches: int  # the batches of each end counted as its tail
    tail_s: float  # per end: its tail batches' wait beyond the steady wait
    tail_share: float  # of the measured time
    steady_wait_s: float = 0.0  # the mean wait of the batches that neither open nor end one
    opening_at: frozenset[int] = frozenset()  # the indices of those that open one, in `events`

    def evened(self, events: Sequence[BatchEvent]) -> list[BatchEvent]:
        """`events` (those this record was found in) with the epoch starts' stalls taken out:
        no batch that opens an epoch waits longer than the steady wait."""
        return [
            replace(e, wait_s=min(e.wait_s, self.steady_wait_s)) if j in self.opening_at else e
            for j, e in enumerate(events)
        ]


def tail_batches(batches_per_epoch: float, opening: int) -> int:
    """The batches that end an epoch with some of a DataLoader's `opening` workers idle: the
    last round of batches, short of one per worker (24 batches for 16 workers: the last 8,
    made by 8 workers while the other 8 have nothing left to make); 0 where one round makes
    the whole epoch (its batches are all its opening) or the rounds come out even."""
    per_epoch = round(batches_per_epoch)
    return per_epoch % opening if per_epoch > opening else 0


def epoch_starts(events: Sequence[BatchEvent], opening: int) -> EpochStarts | None:
    """The cost of the epoch starts among `events` (warm-up ones included: they tell where
    the measured ones' epochs began): for each measured batch that opens an epoch, the wait of
    its first `opening` batches (a DataLoader makes one batch per worker while its prefetch
    refills) beyond the steady wait; and for each measured end of a whole epoch, the wait of
    its tail (`tail_batches`) beyond it. The steady wait is the mean wait of the measured
    batches that neither open nor end an epoch. None without a measured epoch start.
    """
    measured = [e for e in events if not e.warmup]
    if not measured:
        return None
    starts = [
        i for i, e in enumerate(events) if not e.warmup and i > 0 and e.epoch != events[i - 1].epoch
    ]
    if not starts:
        return None
    lengths: dict[int, int] = {}
    for event in events:
        lengths[event.epoch] = lengths.get(event.epoch, 0) + 1
    whole = [n for epoch, n in lengths.items() if epoch != events[-1].epoch]  # the last: cut?
    segments = len({e.epoch for e in measured})
    per_epoch = statistics.median(whole) if whole else len(measured) / segments
    window = max(1, min(opening, int(per_epoch // 2)))
    opening_at = {
        j
        for i in starts
        for j in range(i, min(i + window, len(events)))
        if events[j].epoch == events[i].epoch
    }
    tail = tail_batches(per_epoch, opening)
    ending_at: list[list[int]] = []  # each measured end's tail
    if tail:
        last_at = {e.epoch: j for j, e in enumerate(events)}
        for epoch, j in last_at.items():
            at = list(range(j - tail + 1, j + 1))
            ended = epoch != events[-1].epoch or lengths[epoch] >= per_epoch
            if ended and all(events[k].epoch == epoch and not events[k].warmup for k in at):
                ending_at.append([k for k in at if k not in opening_at])
    in_tails = {k for at in ending_at for k in at}
    steady = [
        e.wait_s
        for j, e in enumerate(events)
        if not e.warmup and j not in opening_at and j not in in_tails
    ]
    steady_wait = sum(steady) / len(steady) if steady else 0.0

    def beyond(at: Iterable[int]) -> float:
        waits = [events[j].wait_s for j in at]
        return max(0.0, sum(waits) - len(waits) * steady_wait)

    stall_total, tail_total = beyond(opening_at), beyond(in_tails)
    seconds = sum(batch_seconds(e) for e in measured)
    images = sum(e.size for e in measured)
    steady_seconds = seconds - stall_total
    return EpochStarts(
        starts=len(starts),
        batches_per_epoch=per_epoch,
        opening_batches=window,
        stall_s=stall_total / len(starts),
        share=stall_total / seconds if seconds > 0 else 0.0,
        steady_images_per_s=images / steady_seconds if steady_seconds > 0 else 0.0,
        ends=len(ending_at),
        tail_batches=tail if ending_at else 0,
        tail_s=tail_total / len(ending_at) if ending_at else 0.0,
        tail_share=tail_total / seconds if seconds > 0 else 0.0,
        steady_wait_s=steady_wait,
        opening_at=frozenset(opening_at),
    )


class EpochStartTally:
    """`epoch_starts`' rule as running totals, for figures read while a loop runs: each measured
    epoch start costs its opening batches' wait beyond the mean wait, so far, of the measured
    batches that neither open nor end an epoch (an epoch's tail leaves that mean once the
    epoch has ended). An opening counts once it is over (its last batch taken)."""

    def __init__(self, opening: int) -> None:
        self.opening = max(1, opening)
        self.starts = 0
        self.stall_s = 0.0
        self._epoch: int | None = None
        self._in_epoch = 0  # batches of the current epoch so far
        self._last_epoch = 0  # the batches of the last whole one
        self._opening_waits: list[float] | None = None  # the measured start under way
        self._rest = [0.0, 0]  # the wait and count of the batches that open no epoch
        # the current epoch's last waits among them (None: a batch not among them)
        self._recent: deque[float | None] = deque(maxlen=self.opening)

    def add(self, event: BatchEvent) -> None:
        if self._epoch is not None and event.epoch != self._epoch:
            self._end_epoch()
            self._close()
            self._last_epoch, self._in_epoch = self._in_epoch, 0
            if not event.warmup:
                self.starts += 1
                self._opening_waits = []
        self._epoch = event.epoch
        window = max(1, min(self.opening, self._last_epoch // 2))
        if self._opening_waits is not None and self._in_epoch < window:
            self._opening_waits.append(event.wait_s)
            self._recent.append(None)
        else:
            self._close()
            self._recent.append(None if event.warmup else event.wait_s)
            if not event.warmup:
                self._rest[0] += event.wait_s
                self._rest[1] += 1
        self._in_epoch += 1

    def _end_epoch(self) -> None:
        """Takes the ended epoch's tail (`tail_batches`) out of the steady batches."""
        tail = tail_batches(self._in_epoch, self.opening)
        ending = list(self._recent)[len(self._recent) - tail :] if tail else []
        if ending and None not in ending:
            self._rest[0] -= sum(w for w in ending if w is not None)
            self._rest[1] -= len(ending)
        self._recent.clear()

    def _close(self) -> None:
        if self._opening_waits:
            steady = self._rest[0] / self._rest[1] if self._rest[1] else 0.0
            waits = self._opening_waits
            self.stall_s += max(0.0, sum(waits) - len(waits) * steady)
        self._opening_waits = None
