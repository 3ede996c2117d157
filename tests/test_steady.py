"""Steady state and its error (`probe.steady`), on batch events whose answers are known."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from probe.measure.lane import Measure, Window
from probe.records import BatchEvent
from probe.steady import (
    FEW_BLOCKS,
    MIN_BLOCKS,
    MIN_JUDGED_BLOCKS,
    EpochStartTally,
    Estimate,
    Warmup,
    above,
    at_least,
    block_batches,
    blocks,
    data_wait,
    epoch_starts,
    images_per_s,
    pooled,
    ratio,
    transient,
)


def events(
    waits: list[float], step: float = 0.03, size: int = 16, per_epoch: int | None = None
) -> list[BatchEvent]:
    """Back-to-back batches with the given waits, a fixed step, epochs of `per_epoch`."""
    out, t = [], 0.0
    for index, wait in enumerate(waits):
        epoch = 0 if per_epoch is None else index // per_epoch
        out.append(BatchEvent(0, index, int(t * 1e9), wait, step, size, False, epoch))
        t += wait + step
    return out


def test_a_steady_rate_is_known_exactly_and_its_error_shrinks_with_noise_gone() -> None:
    steady = events([0.01] * 200)
    rate = images_per_s(steady)
    assert rate.value == pytest.approx(16 / 0.04)
    assert rate.error == pytest.approx(0.0, abs=1e-9)
    assert rate.blocks == 30  # 200 batches: at most 30 blocks
    assert data_wait(steady).value == pytest.approx(0.25)


def test_the_error_covers_the_truth_about_95_times_in_100() -> None:
    rng = random.Random(1)
    covered = 0
    for _ in range(400):
        noisy = events([rng.expovariate(1 / 0.01) for _ in range(120)])
        rate = images_per_s(noisy)
        assert rate.error is not None
        truth = 16 / (0.01 + 0.03)
        covered += abs(rate.value - truth) <= rate.error
    assert 0.90 <= covered / 400 <= 0.99


def test_the_ratio_estimator_matches_its_formula() -> None:
    pairs = [(10.0, 1.0), (12.0, 1.0), (8.0, 1.0), (10.0, 1.0)]
    estimate = ratio(pairs)
    assert estimate.value == 10.0
    spread = sum((y - 10.0 * x) ** 2 for y, x in pairs) / 3
    assert estimate.error == pytest.approx(3.182 * math.sqrt(spread / 4))
    assert ratio([(5.0, 1.0)]).error is None  # one block: no error to tell


def test_blocks_hold_a_batch_per_worker_and_whole_epochs_when_there_are_enough() -> None:
    assert [len(b) for b in blocks(events([0.0] * 23), 4)] == [4, 4, 4, 4, 7]
    many = events([0.0] * 120, per_epoch=6)  # 20 epochs of 6
    parts = blocks(many, 4)
    assert [len(part) for part in parts] == [6] * 20, "whole epochs, one or more a block"
    assert all(part[0].index % 6 == 0 for part in parts)
    few = events([0.0] * 30, per_epoch=10)  # 3 epochs: too few to cut by
    assert [len(b) for b in blocks(few, 4)] == [4] * 6 + [6]


def test_judging_needs_enough_blocks_and_comparisons_use_the_errors() -> None:
    assert not Estimate(100.0, 1.0, MIN_JUDGED_BLOCKS - 1).judged
    assert Estimate(100.0, 1.0, MIN_JUDGED_BLOCKS).judged  # judged, with its wide error ...
    assert not Estimate(100.0, 1.0, MIN_BLOCKS - 1).within(0.01)  # ... but not precise
    assert not Estimate(100.0, None, MIN_BLOCKS).judged
    assert Estimate(100.0, 1.0, MIN_BLOCKS).within(0.01)
    assert not Estimate(100.0, 2.0, MIN_BLOCKS).within(0.01)
    best = Estimate(100.0, 2.0, 20)
    assert at_least(Estimate(94.0, 2.0, 20), 0.95, best)  # 1 below 95, within the errors
    assert not at_least(Estimate(90.0, 1.0, 20), 0.95, best)
    # a change rests on runs compared: their errors, and the drift between runs
    assert above(Estimate(125.0, 2.0, 20), 1.15, best)
    assert not above(Estimate(118.0, 2.0, 20), 1.15, best)  # 18%: within errors and drift


def test_warmup_ends_once_the_rate_settles_not_after_a_fixed_count() -> None:
    # a slow start (workers starting, a cache filling), then a steady rate
    waits = [0.5, 0.3, 0.2, 0.1] + [0.05] * 20 + [0.0] * 200
    warmup = Warmup(None, loaders=2, by_epoch=False)
    flags = [warmup.warming(e) for e in events(waits)]
    first = flags.index(False)
    assert first >= 24, "not before the rate stopped rising"
    assert not any(flags[first:])
    assert warmup.settled is True
    fixed = Warmup(3, None, by_epoch=False)
    assert [fixed.warming(e) for e in events([0.0] * 6)] == [True] * 3 + [False] * 3


def test_warmup_by_epoch_ends_where_an_epoch_starts() -> None:
    waits = ([0.4] + [0.0] * 7) * 30  # a stall opening every epoch of 8
    warmup = Warmup(None, loaders=2, by_epoch=True)
    stream = events(waits, per_epoch=8)
    flags = [warmup.warming(e) for e in stream]
    first = flags.index(False)
    assert first % 8 == 0


def test_epoch_starts_cost_their_opening_batches_wait_beyond_the_steady_wait() -> None:
    per_epoch, stall = 8, 0.2
    waits = ([0.01 + stall] + [0.01] * (per_epoch - 1)) * 12
    stream = events(waits, per_epoch=per_epoch)
    stream = [BatchEvent(**{**vars(e), "warmup": e.index < per_epoch}) for e in stream]
    found = epoch_starts(stream, opening=2)
    assert found is not None
    assert found.starts == 11  # the first epoch was warm-up; the 11 after it open measured
    assert found.stall_s == pytest.approx(stall)
    seconds = sum(e.wait_s + e.step_s for e in stream if not e.warmup)
    assert found.share == pytest.approx(11 * stall / seconds)
    assert found.steady_images_per_s == pytest.approx(16 / 0.04)
    assert epoch_starts(events([0.01] * 50), opening=2) is None  # one stream: no epoch starts


def test_a_slow_pipeline_measured_briefly_gets_smaller_blocks_and_a_wider_error() -> None:
    """16 workers: whole rounds of them as blocks while there are FEW_BLOCKS of them (112
    batches: 7 blocks of 16); with 24 batches, blocks of 4 (6 of them), not one block of 16;
    the figure is judged, with an error as wide as its blocks spread."""
    assert block_batches(16) == 16
    assert block_batches(16, 112) == 16
    assert block_batches(16, 24) == 24 // FEW_BLOCKS
    assert block_batches(0, 3) == 2  # never fewer than MIN_BLOCK_BATCHES
    rng = random.Random(3)
    slow = events([rng.uniform(0.5, 0.9) for _ in range(24)], step=0.1)
    rate = images_per_s(slow, loaders=16)
    assert rate.blocks == 6 and rate.judged
    assert rate.error is not None and rate.error > 0.02 * rate.value
    truth = 16 / (0.7 + 0.1)
    assert abs(rate.value - truth) <= rate.error


def test_a_bursty_slow_pipeline_is_known_better_on_whole_rounds() -> None:
    """16 workers that deliver their batches together, a round every 3.4 s: blocks of whole
    rounds spread little; blocks of 11 batches, some holding the gap and some not, would spread
    several times more."""
    waits = ([3.2] + [0.0005] * 15) * 7  # 112 batches: 7 rounds
    bursty = events(waits, step=0.0125)
    rate = images_per_s(bursty, loaders=16)
    parts = blocks(bursty, 11)
    split = ratio([(sum(e.size for e in b), sum(e.wait_s + e.step_s for e in b)) for b in parts])
    assert rate.error is not None and split.error is not None
    assert rate.error < split.error / 5
    assert rate.value == pytest.approx(16 * 16 / (3.2 + 15 * 0.0005 + 16 * 0.0125), rel=0.01)


class Producer:
    """A producer that makes a batch every `producer_s`, at most `capacity` ahead of the
    consumer (a DataLoader's workers x prefetch_factor: a slot frees when a batch is taken)."""

    def __init__(self, producer_s: float, capacity: int) -> None:
        self.producer_s, self.capacity = producer_s, capacity
        self.made: list[float] = []
        self.taken: list[float] = []

    def take(self, now: float) -> float:
        """Takes the next batch at `now`: how long the consumer waits for it."""
        k = len(self.made)
        start = self.made[-1] if self.made else 0.0
        if k >= self.capacity:
            start = max(start, self.taken[k - self.capacity])
        self.made.append(start + self.producer_s)
        wait = max(0.0, self.made[-1] - now) + 0.0005  # the hand-over itself
        self.taken.append(now + wait)
        return wait


def consume(
    producer: Producer, steps: list[float], warmup: Warmup, window: Window | None = None
) -> list[BatchEvent]:
    """A consumer stepping `steps[k]` on its k-th stepped batch, under `warmup`'s rules (what
    it flushes it takes and does not step); with `window`, until the lane's rules say it is
    precise (checked every 10 batches). Its events, warm-up ones flagged."""
    out: list[BatchEvent] = []
    t, stepped = 0.0, 0
    while stepped < len(steps):
        flushing = warmup.flushing
        wait = producer.take(t)
        step = 0.0 if flushing else steps[stepped]
        stepped += 0 if flushing else 1
        event = BatchEvent(0, len(out), int(t * 1e9), wait, step, 16, False, 0)
        t += wait + step
        warm = warmup.warming(event)
        out.append(replace(event, warmup=warm))
        if window is not None and not warm:
            window.add(event)
            if len(window.events) % 10 == 0:
                said = [kind for kind, _ in window.check()]
                if "rewarm" in said:
                    warmup.flush()
                if "precise" in said:
                    return out
    return out


def old_point(stream: list[BatchEvent], loaders: int) -> Estimate:
    """What a point read before: from where the rate settled, until its blocks (of at least 4
    batches and a batch per worker) gave images/s within 3% on 10 of them, after 3 s, with no
    test for a trend and nothing flushed."""
    measured, spent = [], 0.0
    for event in (e for e in stream if not e.warmup):
        measured.append(event)
        spent += event.wait_s + event.step_s
        size = max(4, loaders)
        if len(measured) % 10 or len(measured) < 10 * size or spent < 3.0:
            continue
        parts = blocks(measured, size)
        rate = ratio([(sum(e.size for e in b), sum(e.wait_s + e.step_s for e in b)) for b in parts])
        if rate.error is not None and rate.error <= 0.03 * rate.value:
            return rate
    raise AssertionError("never precise")


@pytest.mark.parametrize(("slow", "producer_s"), [(33, 0.044), (33, 0.042), (60, 0.044)])
def test_a_prefilled_queue_is_not_read_as_throughput(slow: int, producer_s: float) -> None:
    """A producer (23-24 batches/s) slower than its consumer (27/s), 8 workers x 2 batches
    ahead, the consumer's first steps slower (60 ms) than the producer, so that the queue fills
    and the rate settles there (on a GPU: a new pipeline's first steps, the last one's workers
    ending). A point then read the queue's drain, at the consumer's pace, as throughput: +17%,
    "precise" after 3 s. The lane's rules (the batches in flight taken, not stepped, once the
    rate settled; a start still trending moved into the warm-up, and the queue taken again)
    measure the producer's pace."""
    capacity, steps = 16, [0.06] * slow + [0.037] * 4000
    truth = 16 / producer_s
    before = old_point(consume(Producer(producer_s, capacity), steps, Warmup(None, 8, False)), 8)
    if slow == 33:  # the consumer sped up as the rate settled: the whole point was the drain
        assert before.error is not None and before.value - before.error > 1.1 * truth
    job = Measure(0, None, None, None, None, None, None, 0.03, 60.0, None, ())  # type: ignore[arg-type]
    window = Window(job, 8)
    warmup = Warmup(None, 8, by_epoch=False, in_flight=capacity)
    consume(Producer(producer_s, capacity), steps, warmup, window)
    rate = images_per_s(window.events, 8)
    assert rate.error is not None and rate.within(0.03)
    assert abs(rate.value - truth) <= rate.error + 0.005 * truth


def test_a_window_whose_halves_differ_far_beyond_their_errors_loses_its_first_half() -> None:
    rng = random.Random(5)
    steady = events([0.01 + rng.uniform(0, 0.004) for _ in range(120)])
    assert transient(steady, 2) == 0
    drained = events([0.0] * 30 + [0.05 + rng.uniform(0, 0.004) for _ in range(90)])
    assert transient(drained, 2) == 60  # the first half, where the 30 batches of drain are
    trending = images_per_s(drained, 2)
    assert trending.trend is not None and trending.trend < -0.2  # its second half is slower
    assert trending.error is not None
    second = images_per_s(drained[60:], 2).value
    assert abs(trending.value - second) <= trending.error  # the error covers the steady pace


def test_runs_of_one_setting_pool_to_their_mean() -> None:
    both = pooled([Estimate(100.0, 4.0, 10), Estimate(110.0, 3.0, 12)])
    assert both.value == 105.0
    assert both.error == pytest.approx(math.hypot(4.0, 3.0) / 2)
    assert both.blocks == 22
    assert pooled([Estimate(100.0, None, 1), Estimate(90.0, 1.0, 10)]).error is None


@pytest.mark.parametrize("per_epoch, opening", [(10, 2), (10, 8), (3, 4)])
def test_the_running_tally_of_epoch_starts_matches_the_rule(per_epoch: int, opening: int) -> None:
    """The Prometheus and TensorBoard figure (`EpochStartTally`) is `epoch_starts`' rule kept as
    a running total: on a loop whose steady batches wait alike, the two agree exactly."""
    events: list[BatchEvent] = []
    window = max(1, min(opening, per_epoch // 2))  # the batches that open an epoch
    for epoch in range(4):
        for n in range(per_epoch):
            wait = 0.3 / (n + 1) if n < window else 0.01
            index = len(events)
            warmup = epoch == 0 and n < window  # the job's start, warm-up
            events.append(BatchEvent(0, index, index * 10**8, wait, 0.05, 8, warmup, epoch))
    found = epoch_starts(events, opening)
    assert found is not None
    tally = EpochStartTally(opening)
    for event in events:
        tally.add(event)
    tally.add(BatchEvent(0, len(events), 0, 0.01, 0.05, 8, False, 4))  # closes the last opening
    assert tally.starts == found.starts + 1
    assert tally.stall_s == pytest.approx(found.stall_s * found.starts, rel=1e-9)
