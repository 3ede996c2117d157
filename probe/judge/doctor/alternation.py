"""A close call decided by measuring: two settings measured in alternation on the same warm lanes
(A, B, A, B: what the host drifts by between pairs falls on both alike) until the interval of
B's rate over A's clears a bar one way, or the pairs the budget left fits could not make it:
then either may be the answer, and A, the one that changes less, stays first. Every session that
meets the same call answers it the same way: decided where its pairs decide it, "either" where
they do not, with what would decide it.

`pair_ratio`, `decided`, `more_pairs` and `pairs_fit` are pure (tested on recorded pairs);
`alternate` measures.
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
from probe.metrics import counted, signed
from probe.records import RunStatus
from probe.steady import DRIFT, Estimate, margin, t95

# DALI against the DataLoader, measured in alternation, moved from session to session by more
# than each session's interval: six doctor sessions in a row on the idle 2-core machine read
# DALI +13% to +32% on num_workers=2 (pairs' ratios 1.13-1.32, sd 0.07, of which each session's
# own error holds about half). A call between the two pipelines allows this much more (95%).
PIPELINES_SPREAD = 0.10
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
    # where it ended undecided: the pairs more that would decide it (`more_pairs`; None: none
    # a session holds), those the budget left fitted, a pair's seconds, and the budget that
    # would fit them
    more: int | None = None
    fit: int = 0
    pair_s: float = 0.0
    budget_s: int | None = None

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
        how = "as first measured" if self.clear else pairs
        return f"{signed(self.ratio.value - 1)}{error} {how}"

    @property
    def how(self) -> str:
        """How the call was measured, for people."""
        if self.clear:
            return f"clear on their first measurements (by {CLEAR_MARGIN:g} times their interval)"
        return "measured in alternation"

    def undecided(self) -> str:
        """Why the pairs stopped short of deciding the call, and what would decide it."""
        if self.more is not None:
            fits = counted(self.fit, "pair") if self.fit else "none"
            return (
                f"left undecided: deciding it needs about {counted(self.more, 'more pair')}, "
                f"should the gain hold, and the budget left fit {fits} (about "
                f"{self.pair_s:.0f} s a pair): --budget {self.budget_s} would decide it"
            )
        ratio = self.ratio
        if ratio is not None and abs(ratio.value - self.bar) <= self.spread * ratio.value:
            return (
                "its gain is nearer that bar than sessions on one host differ by: no longer "
                "session would decide it, and either is as good as this host can tell"
            )
        return (
            f"deciding it needs more than {MAX_MORE_PAIRS} more pairs: no session would decide "
            "it, and either is as good as this host can tell"
        )


def pair_ratio(
    pairs: Sequence[tuple[Estimate, Estimate]], spread: float = 0.0, count: int | None = None
) -> Estimate | None:
    """B over A from pairs of adjacent runs (a, b): their mean weighted by each pair's error, and
    the 95% half-width of that mean: from the pairs' own errors (each holds both runs' own and
    DRIFT each: two runs of one setting differ by more than their errors), or where the pairs
    scatter more than that, from their scatter, as Student's t reads a few samples (on a shared
    host, pairs differ by more than their runs' errors: seen, a tenth on the 2-core machine);
    and `spread` of the ratio besides, what sessions differ by (PIPELINES_SPREAD). With `count`,
    the interval `count` such pairs would give, should they weigh and scatter as these do (their
    own error shrinking as one over the root of their count, `spread` not at all). None: no pair
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
    pairs_in = len(ratios) if count is None else count
    weights = [1 / e**2 for e in errors]
    mean = sum(w * r for w, r in zip(weights, ratios, strict=True)) / sum(weights)
    error = math.sqrt(len(ratios) / pairs_in / sum(weights))
    if len(ratios) > 1:
        scatter = statistics.stdev(ratios)
        error = max(error, t95(pairs_in - 1) * scatter / math.sqrt(pairs_in))
    return Estimate(mean, math.hypot(error, spread * mean), pairs_in)


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


def more_pairs(
    pairs: Sequence[tuple[Estimate, Estimate]], bar: float, spread: float = 0.0
) -> int | None:
    """The fewest pairs more than `pairs` that would decide the call, should B's gain hold where
    they measured it and the pairs to come weigh and scatter as they did (`pair_ratio` with
    their count); None where no session of up to MAX_MORE_PAIRS more would (the gain lies
    within what sessions differ by of the bar, `spread`, or that near it)."""
    ratio = pair_ratio(pairs, spread)
    if ratio is None:
        return None
    for more in range(1, MAX_MORE_PAIRS + 1):
        if decided(pair_ratio(pairs, spread, ratio.blocks + more), bar) is not None:
            return more
    return None


def pairs_fit(left_s: float, run_s: float, measured: int = 0) -> int:
    """The pairs `left_s` seconds complete at `run_s` seconds a run, `measured` runs in (where
    that is odd, the next pair's first run was measured); runs timed at no cost at all fit as
    many as `more_pairs` looks ahead."""
    if run_s <= 0:
        return MAX_MORE_PAIRS
    runs = math.floor(max(0.0, left_s) / run_s)
    return (runs + measured % 2) // 2


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
    whole pair, until MIN_PAIRS pairs (or those the budget fits) decide B against `bar` times A;
    before each pair after the first, where the pairs the budget left fits (at what the pairs so
    far cost) could not decide it should B's gain hold (`more_pairs`), it stops there, undecided,
    and says so (`Alternation.undecided`). Where no pair fits, `first` alone (its verification,
    no pair); where the first measurements of A and B (`initial`) decide the call alone
    (`clear_call`), `first` alone too (its verification), and the call as they decide it, unless
    that run moved from `first`'s first measurement beyond their errors and the drift: then the
    pairs decide, that run opening them. Each run measures at most `length_s` (it stops sooner
    once precise)."""
    order = (first, b if first == a else a)
    started = session.budget.remaining()  # what the runs in alternation cost is timed from here
    call = Alternation(a, b, (), None, bar, None, spread)
    clear = None if initial is None else clear_call(*initial, bar, spread)
    if clear is not None and initial is not None:
        run = _run(session, base, first, label, length_s) if session.budget.fits() else None
        if run is None:
            return call
        was = initial[1] if first == b else initial[0]
        now = Estimate(run.images_per_s, run.images_per_s_error, 0)
        if abs(now.value - was.value) <= margin(now, 1.0, was, drift=True):
            ratio = pair_ratio([initial], spread)
            return replace(call, runs=(run,), ratio=ratio, decided=b if clear else a, clear=True)
        call = replace(call, runs=(run,))  # it moved since it was first measured: pairs decide
    if not call.runs and _pairs_fit(session, call, started, length_s) < 1:  # `first` alone
        run = _run(session, base, first, label, length_s) if session.budget.fits() else None
        return replace(call, runs=() if run is None else (run,))
    return _in_pairs(session, base, call, order, started, length_s, label)


def _in_pairs(
    session: WarmSession,
    base: ProbeConfig,
    call: Alternation,
    order: tuple[Change, Change],
    started: float,
    length_s: float,
    label: str,
) -> Alternation:
    """`call` measured on, a pair at a time in `order`, while a pair fits and those that fit
    could decide it (`_undecided`), until it is decided (`alternate`)."""
    while not session.stop.is_set():
        if call.pairs:  # undecided so far: could the pairs that fit decide it?
            ended = _undecided(session, call, started)
            if ended.more is None or ended.more > ended.fit:
                return ended
        if _pairs_fit(session, call, started, length_s) < 1:
            break
        pair: list[InTurn] = []
        for change in order[len(call.runs) % 2 :]:
            run = _run(session, base, change, label, length_s)
            if run is None:
                break
            pair.append(run)
        if len(call.runs + tuple(pair)) % 2:  # a run failed: the pair is not whole
            break
        runs = (*call.runs, *pair)
        ratio = pair_ratio(runs_pairs(runs, call.a), call.spread)
        last = _pairs_fit(session, replace(call, runs=runs), started, length_s) < 1
        verdict = decided(ratio, call.bar) if len(runs) >= 2 * MIN_PAIRS or last else None
        winner = None if verdict is None else (call.b if verdict else call.a)
        call = replace(call, runs=runs, ratio=ratio, decided=winner)
        if winner is not None:
            return call
    return _undecided(session, call, started) if call.pairs else call  # stopped, or a run failed


def _run_s(session: WarmSession, call: Alternation, started: float, length_s: float) -> float:
    """What a run in alternation costs: those of `call` so far (the budget's remaining seconds
    were `started` before them), else a point of at most `length_s` as the points so far cost."""
    if not call.runs:
        return session.budget.run_cost(length_s)
    return (started - session.budget.remaining()) / len(call.runs)


def _pairs_fit(session: WarmSession, call: Alternation, started: float, length_s: float) -> int:
    """The pairs of `call` the budget left completes (`pairs_fit`, at `_run_s`)."""
    run_s = _run_s(session, call, started, length_s)
    return pairs_fit(session.budget.remaining(), run_s, len(call.runs))


def _undecided(session: WarmSession, call: Alternation, started: float) -> Alternation:
    """The call as its pairs left it, with what would decide it: the pairs more that would
    (`more_pairs`), those the budget left fits at what its runs cost so far, and the budget
    that would fit them."""
    run_s = _run_s(session, call, started, 0.0)
    more = more_pairs(runs_pairs(call.runs, call.a), call.bar, call.spread)
    budget_s = None if more is None else session.budget.needed_for(2 * run_s * more)
    return replace(
        call,
        more=more,
        fit=pairs_fit(session.budget.remaining(), run_s, len(call.runs)),
        pair_s=2 * run_s,
        budget_s=budget_s,
    )


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
