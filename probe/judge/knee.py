"""A sweep of one knob read for its decisions: the best setting, the knee (the smallest setting
not significantly below 95% of the best), the settings past the best that made things slower,
and what to sweep. Every decision uses the points' errors (`probe.steady`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.judge.thresholds import KNEE_WITHIN, PAST_PEAK
from probe.steady import MIN_BLOCKS, Estimate, at_least


@dataclass(frozen=True)
class SweepPoint:
    """One measured setting of a sweep: a run's images/s over all its lanes, its worst lane's
    data-wait, its lanes' CPU."""

    setting: int  # num_workers or num_threads
    images_per_s: float
    data_wait_frac: float | None = None
    cpu_pct: float | None = None
    run_id: str | None = None
    images_per_s_error: float | None = None  # 95% interval half-width
    blocks: int = MIN_BLOCKS  # the blocks its error rests on
    data_wait_frac_error: float | None = None
    host_busy: bool = False  # other processes took enough CPU to move it

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.images_per_s, self.images_per_s_error, self.blocks)

    def to_json(self, knob: str) -> dict[str, Any]:
        """The point in a session's document, its setting under the knob's name."""
        return {
            knob: self.setting,
            "images_per_s": self.images_per_s,
            "images_per_s_error": self.images_per_s_error,
            "data_wait_frac": self.data_wait_frac,
            "data_wait_frac_error": self.data_wait_frac_error,
            "cpu_pct": self.cpu_pct,
            "host_busy": self.host_busy,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], knob: str) -> SweepPoint:
        """A point of a session's document (a document keeps judged points only)."""
        return cls(
            setting=data[knob],
            images_per_s=data["images_per_s"],
            data_wait_frac=data.get("data_wait_frac"),
            cpu_pct=data.get("cpu_pct"),
            run_id=data.get("run_id"),
            images_per_s_error=data.get("images_per_s_error"),
            data_wait_frac_error=data.get("data_wait_frac_error"),
            host_busy=bool(data.get("host_busy", False)),
        )


@dataclass(frozen=True)
class SweepAnalysis:
    knob: str  # "num_workers" or "num_threads"
    points: tuple[SweepPoint, ...]  # by setting
    best: SweepPoint
    knee: SweepPoint  # the smallest setting not significantly below (1 - KNEE_WITHIN) x best
    oversubscribed: tuple[SweepPoint, ...]  # past the best, significantly below (1 - PAST_PEAK)

    def gives(self, point: SweepPoint, rate: Estimate) -> bool:
        """Whether `point` is not significantly below (1 - KNEE_WITHIN) x `rate`, or x the
        best where that is less: whether it was measured to give `rate` (a consumer's)."""
        target = min(rate, self.best.estimate, key=lambda e: e.value)
        return at_least(point.estimate, 1 - KNEE_WITHIN, target)

    def reaching(self, rate: Estimate, above: int) -> SweepPoint | None:
        """The smallest setting past `above`, and not past the best, that gives `rate`, or else
        the knee (`gives`). None where the best is not past `above`: more were not measured to
        help."""
        return next(
            (
                p
                for p in self.points
                if above < p.setting <= self.best.setting and self.gives(p, rate)
            ),
            None,
        )


def analyze_sweep(points: Sequence[SweepPoint], knob: str = "num_workers") -> SweepAnalysis:
    """The knee and the oversubscribed settings of a sweep, judged with each point's error:
    the knee is the smallest setting whose images/s is not significantly below 95% of the
    best's; a setting past the best that is significantly below that is oversubscribed.

    Raises:
        ValueError: no point measured anything.
    """
    measured = sorted((p for p in points if p.images_per_s > 0), key=lambda p: p.setting)
    if not measured:
        raise ValueError("no sweep point measured any throughput")
    best = max(measured, key=lambda p: p.images_per_s)
    knee = next(p for p in measured if at_least(p.estimate, 1 - KNEE_WITHIN, best.estimate))
    over = tuple(
        p
        for p in measured
        if p.setting > best.setting and not at_least(p.estimate, 1 - PAST_PEAK, best.estimate)
    )
    return SweepAnalysis(knob, tuple(measured), best, knee, over)


def past_the_peak(points: Sequence[SweepPoint]) -> bool:
    """Whether a sweep has clearly fallen past its peak: its last point, at a larger setting
    than the best, is significantly below 95% of the best."""
    if len(points) < 2:
        return False
    best = max(points, key=lambda p: p.images_per_s)
    last = points[-1]
    return last.setting > best.setting and not at_least(last.estimate, 1 - PAST_PEAK, best.estimate)


def ladder(cores_per_lane: int) -> list[int]:
    """Settings to sweep: powers of two up to the cores per GPU, the core count itself, and one
    step past it, to see oversubscription."""
    cores = max(1, cores_per_lane)
    steps = [2**i for i in range(int(math.log2(cores)) + 1)]
    steps.append(cores)
    steps.append(2 ** math.ceil(math.log2(cores + 1)))
    return sorted(set(steps))
