"""Steady state and its error (`probe.steady`), on batch events whose answers are known."""

from __future__ import annotations

import math
import random

import pytest

from probe.records import BatchEvent
from probe.steady import (
    MIN_BLOCKS,
    Estimate,
    Warmup,
    above,
    at_least,
    blocks,
    data_wait,
    epoch_starts,
    images_per_s,
    ratio,
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
    assert not Estimate(100.0, 1.0, MIN_BLOCKS - 1).judged
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
