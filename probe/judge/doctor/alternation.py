"""A close call decided by measuring: two settings measured in alternation on the same warm lanes
(A, B, A, B: what the host drifts by between pairs falls on both alike) until the interval of
B's rate over A's clears a bar one way, or the budget ends: then either may be the answer, and
A, the one that changes less, stays first. Every session that meets the same call answers it the
same way: decided where its pairs decide it, "either" where they do not.

`pair_ratio` and `decided` are pure (tested on recorded pairs); `alternate` measures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from probe.judge.changes import Change
from probe.judge.results import InTurn, pooled_in_turn
from probe.judge.session import WarmSession, point_of, with_change
from probe.measure.config import ProbeConfig
from probe.records import RunStatus
from probe.steady import DRIFT, Estimate, margin, t95

# DALI against the DataLoader, measured in alternation, moved from session to session by more
# than each session's interval: six doctor sessions in a row on the idle 2-core machine read
# DALI +13% to +32% on num_workers=2 (pairs' ratios 1.13-1.32, sd 0.07, of which each session's
# own error holds about half). A call between the two pipelines allows this much more (95%).
PIPELINES_SPREAD = 0.10
MAX_PAIRS = 5  # pairs measured at most: past that, a call this close is "either"
MIN_PAIRS = 2  # a call is decided on this many pairs (or on those the budget fits)
MAX_MORE_PAIRS = 20  # past this many more pairs, the call is said to need longer than a session
# The first measurements of the two, minutes apart and the better of DALI's search among them,
# decide a call alone where they clear its bar by this many times their interval: a call that
# clear needs no alternation (seen on one H200: DALI 3.4x the DataLoader's 846 images/s).
CLEAR_MARGIN = 2.0


@dataclass(frozen=True)
class Alternation:
    """Two settings measured in alternation: their runs in order, B's rate over A's, the bar it
    was held to, and which one it decided (None: either)."""

    a: Change
    b: Change
    runs: tuple[InTurn, ...]
    ratio: Estimate | None  # B over A, from adjacent pairs (None: no pair completed)
    bar: float
    decided: Change | None
    spread: float = 0.0  # what sessions differ by, allowed for (`pair_ratio`)
    clear: bool = False  # decided on the first measurements (`clear_call`), `runs` the first's

    def of(self, change: Change) -> Estimate | None:
        """A setting's runs pooled (None: none measured)."""
        return pooled_in_turn(self.runs, change.setting)

    @property
    def pairs(self) -> int:
        return len(self.runs) // 2

    def gain_text(self) -> str:
        """B against A, with its interval: '+22% ± 5% over 3 pairs'."""
        if self.ratio is None:
            return "no pair measured"
        pairs = f"over {self.pairs} pair{'s' if self.pairs != 1 else ''}"
        error = f" ± {self.ratio.error:.0%}" if self.ratio.error is not None else ""
        return f"{self.ratio.value - 1:+.0%}{error} {'as first measured' if self.clear else pairs}"

    @property
    def how(self) -> str:
        """How the call was measured, for people."""
        if self.clear:
            return f"clear on their first measurements (by {CLEAR_MARGIN:g} times their interval)"
        return "measured in alternation"


def pair_ratio(pairs: Sequence[tuple[Estimate, Estimate]], spread: float = 0.0) -> Estimate | None:
    """B over A from pairs of adjacent runs (a, b): their mean weighted by each pair's error, and
    the 95% half-width of that mean: from the pairs' own errors (each holds both runs' own and
    DRIFT each: two runs of one setting differ by more than their errors), or where the pairs
    scatter more than that, from their scatter, as Student's t reads a few samples (on a shared
    host, pairs differ by more than their runs' errors: seen, a tenth on the 2-core machine);
    and `spread` of the ratio besides, what sessions differ by (PIPELINES_SPREAD). None: no pair
    with errors."""
    ratios, errors = [], []
    for a, b in pairs:
        if a.value <= 0 or a.error is None or b.error is None:
            continue
        ratio = b.value / a.value
        ratios.append(ratio)
        errors.append(ratio * math.hypot(a.error / a.value, b.error / b.value, DRIFT, DRIFT))
    if not ratios:
        return None
    weights = [1 / e**2 for e in errors]
    mean = sum(w * r for w, r in zip(weights, ratios, strict=True)) / sum(weights)
    error = 1 / math.sqrt(sum(weights))
    if len(ratios) > 1:
        error = max(error, t95(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios)))
    return Estimate(mean, math.hypot(error, spread * mean), len(ratios))


def decided(ratio: Estimate | None, bar: float) -> bool | None:
    """Whether B clears `bar` times A (True), falls short of it (False), or the interval holds the
    bar (None: either)."""
    if ratio is None or ratio.error is None:
        return None
    if ratio.value - ratio.error > bar:
        return True
    if ratio.value + ratio.error < bar:
        return False
    return None


def clear_call(a: Estimate, b: Estimate, bar: float, spread: float = 0.0) -> bool | None:
    """Whether the first measurements of A and B decide the call alone: their ratio's interval
    (`pair_ratio`'s, `spread` included), CLEAR_MARGIN times over, clears `bar` one way (True: B,
    False: A); None: the call is close, for alternation to decide."""
    ratio = pair_ratio([(a, b)], spread)
    if ratio is None or ratio.error is None:
        return None
    return decided(replace(ratio, error=CLEAR_MARGIN * ratio.error), bar)


def more_pairs(ratio: Estimate | None, bar: float, spread: float = 0.0) -> int | None:
    """The pairs more than those measured that would decide the call, should B's gain hold where
    it was measured (the pairs' own error shrinking as one over the root of their count, what
    sessions differ by, `spread`, not at all); None where no session of up to MAX_MORE_PAIRS
    more would (the gain lies within what sessions differ by of the bar)."""
    if ratio is None or ratio.error is None:
        return None
    floor = spread * ratio.value
    room = (ratio.value - bar) ** 2 - floor**2
    if room <= 0:
        return None
    own = max(0.0, ratio.error**2 - floor**2)
    needed = math.ceil(ratio.blocks * own / room) - ratio.blocks
    return max(1, needed) if needed <= MAX_MORE_PAIRS else None


def runs_pairs(runs: Sequence[InTurn], a: Change) -> list[tuple[Estimate, Estimate]]:
    """Adjacent runs, two by two, as (A, B) pairs, whichever of them ran first."""
    pairs = []
    for first, second in zip(runs[::2], runs[1::2], strict=False):
        one = Estimate(first.images_per_s, first.images_per_s_error, 0)
        two = Estimate(second.images_per_s, second.images_per_s_error, 0)
        pairs.append((one, two) if first.setting == a.setting else (two, one))
    return pairs


def alternate(
    session: WarmSession,
    base: ProbeConfig,
    a: Change,
    b: Change,
    bar: float,
    *,
    first: Change,
    length_s: float,
    label: str,
    spread: float = 0.0,
    initial: tuple[Estimate, Estimate] | None = None,
) -> Alternation:
    """Measures `first`, then the other, and so on, a pair at a time while the budget fits a
    whole pair, until MIN_PAIRS pairs (or those the budget fits) decide B against `bar` times A,
    or MAX_PAIRS were measured; where no pair fits, `first` alone (its verification, no pair);
    where the first measurements of A and B (`initial`) decide the call alone (`clear_call`),
    `first` alone too (its verification), and the call as they decide it, unless that run
    moved from `first`'s first measurement beyond their errors and the drift: then the pairs
    decide, that run opening them. Each run measures at most `length_s` (it stops sooner once
    precise)."""
    order = (first, b if first == a else a)
    runs: list[InTurn] = []
    clear = None if initial is None else clear_call(*initial, bar, spread)
    if clear is not None and initial is not None:
        if not session.budget.fits():
            return Alternation(a, b, (), None, bar, None, spread)
        run = _run(session, base, first, label, length_s)
        if run is None:
            return Alternation(a, b, (), None, bar, None, spread)
        was = initial[1] if first == b else initial[0]
        now = Estimate(run.images_per_s, run.images_per_s_error, 0)
        if abs(now.value - was.value) <= margin(now, 1.0, was, drift=True):
            ratio = pair_ratio([initial], spread)
            return Alternation(a, b, (run,), ratio, bar, b if clear else a, spread, clear=True)
        runs.append(run)  # it moved since it was first measured: pairs decide, it opens them
    result = Alternation(a, b, tuple(runs), None, bar, None, spread)
    while len(runs) < 2 * MAX_PAIRS and not session.stop.is_set():
        alone = not runs and not session.budget.fits(1)  # no pair fits: `first` alone
        if alone and not session.budget.fits():
            break
        if not alone and not session.budget.fits(1 - len(runs) % 2):
            break
        todo = order[:1] if alone else order[len(runs) % 2 :]
        pair = []
        for change in todo:
            run = _run(session, base, change, label, length_s)
            if run is None:
                break
            pair.append(run)
        if alone:
            return Alternation(a, b, tuple(pair), None, bar, None, spread)
        if len(pair) < len(todo):
            break
        runs += pair
        ratio = pair_ratio(runs_pairs(runs, a), spread)
        last = len(runs) >= 2 * MAX_PAIRS or not session.budget.fits(1)
        verdict = decided(ratio, bar) if len(runs) >= 2 * MIN_PAIRS or last else None
        winner = None if verdict is None else (b if verdict else a)
        result = Alternation(a, b, tuple(runs), ratio, bar, winner, spread)
        if winner is not None:
            break
    return result


def _run(
    session: WarmSession, base: ProbeConfig, change: Change, label: str, length_s: float
) -> InTurn | None:
    """One run of `change` in alternation (None: stopped, failed or too short to judge)."""
    config = with_change(base, change)
    if config is None or session.stop.is_set():
        return None
    config = replace(config, label=f"{label}: {change.setting}")
    document = session.measure(config, later=1, max_s=length_s)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return None
    point = point_of(session.store, document, 0)
    if not point.estimate.judged:
        return None
    return InTurn(change.setting, point.images_per_s, point.images_per_s_error, document.run_id)
