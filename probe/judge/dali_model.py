"""What a DALI setting would give, read off the settings measured: the model the doctor's DALI
search steers by (pure: recorded points in, a prediction and the next setting out).

A lane's DALI is held by the least of three rates:

- its CPU threads: each image costs them `fixed + hybrid x (1 - share)` core-seconds (nvJPEG's
  CPU + CUDA path decodes the share not sent to the hardware decoder, and its Huffman decoding
  is on the threads), on at most `num_threads` cores (and, for `mixed`, the thread that feeds
  its GPU stage) and what the lane's cores leave after its training loop's thread;
- the hardware JPEG decoder (NVJPG): `share` of the images, at most the images/s it measured
  per busy share;
- the SMs: the consumer alone's rate, slowed by DALI's kernels on its GPU, a part for every
  image (resize, normalize) and a part for the images nvJPEG decodes on the SMs.

One measured point fixes each term with a prior split; two at different shares fit it. A
prediction is scaled by the ratio measured/modelled at the nearest point measured where the same
term holds both (within CALIBRATION), never above the consumer alone; the search shows each
prediction beside what its point then measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from probe.judge.changes import DaliPipeline
from probe.judge.thresholds import THREADS_SATURATED

DEFAULT_LOAD = 0.65  # DALI's own hw_decoder_load
SHARES = (0.65, 0.8, 0.9, 0.95, 1.0)  # hw_decoder_load settings the search weighs
# The share of a point's thread CPU per image that no share moves (reading files, parsing, the
# GPU stage's feeding), until two shares fit it: on an H200 with camera-sized JPEGs, 4 cores,
# the threads' CPU per image at hw_decoder_load 1 was 23% of that at 0.65.
FIXED_CPU_PRIOR = 0.25
FIXED_SM_PRIOR = 0.25  # a point's step slowdown that a share does not move (resize, normalize)
NVJPG_MIN_PCT = 3.0  # below this the decoder's rate per busy share is not read
CPU_DECODE_PRIOR = 2.0  # the cpu decoder's CPU per image against nvJPEG's CPU part of it
# The thread that feeds `mixed`'s GPU stage, beside `num_threads`: on an H200 with ResNet-50 on
# camera-sized JPEGs, 1 and 2 threads at hw_decoder_load 1 read 131% and 190% of a core while
# one thread held the first (data-wait 41%): about half a core more than the threads.
FEEDER_CORES = 0.5
DECODER_FULL = 0.97  # the hardware decoder's busy share taken as full
CALIBRATION = (0.7, 1.4)  # the measured/modelled ratio a prediction is scaled by, bounded
CLOSE = 0.02  # settings predicted within this share of the best: the fewest threads is chosen


@dataclass(frozen=True)
class DaliPoint:
    """What one measured DALI setting tells the model, per lane (its worst lane)."""

    pipeline: DaliPipeline
    images_per_s: float  # per lane
    threads_cpu_pct: float | None  # DALI's threads, % of one core
    main_cpu_pct: float | None  # the training loop's thread, % of one core
    nvjpg_pct: float | None  # the hardware decoder's busy share
    step_slowed: float | None  # the step against the consumer alone (None: not slower)

    @property
    def share(self) -> float:
        """The share of JPEGs sent to the hardware decoder (0 for the cpu decoder)."""
        if self.pipeline.decoder != "mixed":
            return 0.0
        load = self.pipeline.hw_decoder_load
        return DEFAULT_LOAD if load is None else load


@dataclass(frozen=True)
class Host:
    """What bounds every setting of one lane: its cores and its consumer."""

    cores: float  # the cores per lane
    consumer_images_per_s: float | None  # the consumer alone, per lane (None: no consumer)
    hardware_decoder: bool  # NVJPG read: the share can be searched
    share: float = DEFAULT_LOAD  # mixed's share where it is not searched: the one it started at


TERMS = {
    "threads": "DALI's threads",
    "decoder": "the hardware decoder",
    "sms": "the SMs",
    "consumer": "the consumer",
}


@dataclass(frozen=True)
class Prediction:
    pipeline: DaliPipeline
    images_per_s: float
    holds: str  # which term bounds it: a key of TERMS

    @property
    def holds_text(self) -> str:
        return TERMS[self.holds]


def _cpu_terms(points: Sequence[DaliPoint]) -> tuple[float, float] | None:
    """The threads' core-seconds per image: (fixed, hybrid) with `fixed + hybrid x (1 -
    share)`, fitted on two shares of `mixed` where measured, else split by the prior."""
    mixed = [
        (p.share, p.threads_cpu_pct / 100 / p.images_per_s)
        for p in points
        if p.pipeline.decoder == "mixed" and p.threads_cpu_pct and p.images_per_s > 0
    ]
    if not mixed:
        return None
    low, high = min(mixed), max(mixed)
    if high[0] - low[0] >= 0.1 and low[1] > high[1]:
        hybrid = (low[1] - high[1]) / (high[0] - low[0])
        fixed = max(0.0, high[1] - hybrid * (1 - high[0]))
        return fixed, hybrid
    share, per_image = low
    fixed = per_image * FIXED_CPU_PRIOR
    return fixed, (per_image - fixed) / max(1 - share, 0.05)


def _decoder_rate(points: Sequence[DaliPoint]) -> float | None:
    """The images/s the hardware decoder takes when fully busy: measured images/s to it per
    busy share, the lowest of the points (its rate falls as it fills)."""
    rates = [
        p.images_per_s * p.share / (p.nvjpg_pct / 100)
        for p in points
        if p.share > 0 and p.nvjpg_pct is not None and p.nvjpg_pct >= NVJPG_MIN_PCT
    ]
    return min(rates) if rates else None


def _sm_terms(points: Sequence[DaliPoint]) -> tuple[float, float]:
    """The step's slowdown (a share of the consumer's step): (fixed, per share decoded on the
    SMs), fitted on two shares of `mixed` where measured, else split by the prior."""
    mixed = sorted((p.share, p.step_slowed or 0.0) for p in points if p.pipeline.decoder == "mixed")
    if not mixed:
        return 0.0, 0.0
    low, high = mixed[0], mixed[-1]
    if high[0] - low[0] >= 0.1 and low[1] > high[1]:
        per_share = (low[1] - high[1]) / (high[0] - low[0])
        return max(0.0, high[1] - per_share * (1 - high[0])), per_share
    share, slowed = low
    fixed = slowed * FIXED_SM_PRIOR
    return fixed, (slowed - fixed) / max(1 - share, 0.05)


def _model(points: Sequence[DaliPoint], host: Host, pipeline: DaliPipeline) -> Prediction | None:
    """The rate the three terms allow, before calibration."""
    share = DaliPoint(pipeline, 0.0, None, None, None, None).share
    main = [
        p.main_cpu_pct / 100 / p.images_per_s for p in points if p.main_cpu_pct and p.images_per_s
    ]
    main_per_image = min(main) if main else 0.0
    bounds: dict[str, float] = {}
    if pipeline.decoder == "mixed":
        terms = _cpu_terms(points)
        if terms is None:
            return None
        per_image = terms[0] + terms[1] * (1 - share)
    else:
        same = [p for p in points if p.pipeline.decoder == pipeline.decoder and p.threads_cpu_pct]
        if not same:
            return None
        per_image = min(p.threads_cpu_pct / 100 / p.images_per_s for p in same if p.threads_cpu_pct)
    if per_image > 0:
        # r x per_image <= threads' cores, and r x (per_image + main) <= the lane's cores; the
        # threads' CPU read counts, for `mixed`, the thread that feeds DALI's GPU stage too
        extra = FEEDER_CORES if pipeline.decoder == "mixed" else 0.0
        threads = THREADS_SATURATED * (pipeline.num_threads + extra)
        bounds["threads"] = min(threads / per_image, host.cores / (per_image + main_per_image))
    if pipeline.decoder == "mixed" and share > 0:
        decoder = _decoder_rate(points)
        if decoder is not None:
            bounds["decoder"] = decoder * DECODER_FULL / share
    if host.consumer_images_per_s:
        fixed, per_share = _sm_terms(points) if pipeline.decoder == "mixed" else (0.0, 0.0)
        slowed = fixed + per_share * (1 - share)
        bounds["sms" if slowed > 0 else "consumer"] = host.consumer_images_per_s / (1 + slowed)
    if not bounds:
        return None
    holds = min(bounds, key=lambda k: bounds[k])
    return Prediction(pipeline, bounds[holds], holds)


def predict(points: Sequence[DaliPoint], host: Host, pipeline: DaliPipeline) -> Prediction | None:
    """The images/s per lane `pipeline` would give: the model, scaled by measured/modelled at
    the nearest point measured of its decoder where the same term holds both (a term the model
    misjudges there, it misjudges alike here), never above the consumer alone (None: nothing
    measured to read it from)."""
    modelled = _model(points, host, pipeline)
    if modelled is None:
        return None
    same = [p for p in points if p.pipeline.decoder == pipeline.decoder and p.images_per_s > 0]
    target = DaliPoint(pipeline, 0.0, None, None, None, None)
    nearest = min(
        same,
        key=lambda p: (
            abs(p.share - target.share),
            abs(p.pipeline.num_threads - pipeline.num_threads),
        ),
        default=None,
    )
    at_nearest = None if nearest is None else _model(points, host, nearest.pipeline)
    rate = modelled.images_per_s
    if nearest is not None and at_nearest is not None and at_nearest.holds == modelled.holds:
        low, high = CALIBRATION
        rate *= min(high, max(low, nearest.images_per_s / at_nearest.images_per_s))
    if host.consumer_images_per_s:
        rate = min(rate, host.consumer_images_per_s)
    return Prediction(pipeline, rate, modelled.holds)


def candidates(host: Host, decoder: str) -> list[DaliPipeline]:
    """The settings the search weighs for `decoder`: 1 thread to the lane's cores, and for
    `mixed` each share of SHARES where the hardware decoder is read (else the one it started
    at)."""
    threads = range(1, max(1, math.floor(host.cores + 1e-9)) + 1)
    if decoder != "mixed":
        return [DaliPipeline(decoder, t) for t in threads]
    shares = SHARES if host.hardware_decoder else (host.share,)
    return [DaliPipeline(decoder, t, s) for t in threads for s in shares]


def best_predicted(points: Sequence[DaliPoint], host: Host, decoder: str) -> Prediction | None:
    """The setting of `decoder` not yet measured that is predicted fastest; among those within
    CLOSE of it, the fewest threads, then the smallest share (a larger one lengthens the
    hardware decoder's tail)."""
    measured = {p.pipeline for p in points}
    weighed = [c for c in candidates(host, decoder) if c not in measured]
    predicted = [p for p in (predict(points, host, c) for c in weighed) if p]
    if not predicted:
        return None
    top = max(p.images_per_s for p in predicted)
    close = [p for p in predicted if p.images_per_s >= top * (1 - CLOSE)]
    return min(close, key=lambda p: (p.pipeline.num_threads, p.pipeline.hw_decoder_load or 0.0))


def cpu_decoder_rate(points: Sequence[DaliPoint], host: Host, threads: int) -> float | None:
    """The images/s per lane the cpu decoder would give on `threads`, from `mixed` points: its
    CPU per image CPU_DECODE_PRIOR times nvJPEG's CPU part of a JPEG (Huffman decoding; the
    rest of a decode, on the SMs there, is on the threads too), at most the consumer alone's."""
    terms = _cpu_terms(points)
    if terms is None:
        return None
    per_image = CPU_DECODE_PRIOR * (terms[0] + terms[1])
    main = [
        p.main_cpu_pct / 100 / p.images_per_s for p in points if p.main_cpu_pct and p.images_per_s
    ]
    rate = min(
        THREADS_SATURATED * threads / per_image, host.cores / (per_image + min(main, default=0.0))
    )
    return rate if host.consumer_images_per_s is None else min(rate, host.consumer_images_per_s)
