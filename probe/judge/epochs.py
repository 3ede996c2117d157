"""What takes epoch starts' stalls away (`epoch_fixes`), each predicted from the rate without
them: an endless sampler, longer epochs, persistent workers, fewer workers than batches per
epoch; and what a change of num_workers does to a loop read epoch by epoch (`read_by_epoch`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from probe.judge.changes import Change, Knob, Recommendation, workers
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import LONGER_EPOCHS
from probe.metrics import IMAGES_PER_S, EpochStartCost

# The share of a lane's stall that a fix takes away (None: it cannot be told).
_Removes = Callable[[EpochStartCost], float | None]


def epoch_fixes(
    facts: Sequence[LaneFacts], stream: Mapping[int, float] | None = None, basis: str = ""
) -> list[Recommendation]:
    """What takes the epoch starts' stalls away, ranked by the images/s each is predicted to
    give. A fix that removes a share of a lane's stall moves its time per image that share of
    the way to its rate without them: measured where `stream` gives it (the same setting read
    as one stream, per lane; `basis` says where), else its rate between epoch starts."""
    stalled = [f for f in facts if _stalls(f)]
    if not stalled:
        return []

    def predicted(removes: _Removes) -> float | None:
        """All lanes' images/s with the share `removes(start)` of each stall taken away (None
        where that share cannot be told)."""
        total = 0.0
        for f in facts:
            start, rate = f.figures.epoch_start, f.figures.images_per_s
            if f not in stalled or start is None or not rate:
                total += rate
                continue
            share = removes(start)
            if share is None:
                return None
            steady = (stream or {}).get(f.lane) or start.steady_images_per_s
            floor = 1 / steady if steady else 0.0
            total += 1 / (floor + (1 / rate - floor) * (1 - share))
        return total

    first = stalled[0]
    start = first.figures.epoch_start
    assert start is not None  # stalled
    split = start.loader_start_ms is not None
    not_split = "not predicted: the loader's start is not measured apart here"
    out = [
        Recommendation(
            "read across epoch ends: one endless sampler over the shard's epochs (the read "
            "order of each epoch kept), so that the prefetch never drains, as feedscope's "
            "stream reading and timm's MultiEpochsDataLoader do",
            Change(Knob.SAMPLER, "endless"),
            predicted(lambda start: 1.0),
            basis or "estimated: the rate measured between epoch starts",
        ),
        Recommendation(
            f"make an epoch {LONGER_EPOCHS}x longer (the shard {LONGER_EPOCHS} times over in "
            "its sampler): the same stall, a quarter as often",
            Change(Knob.EPOCH_LENGTH, LONGER_EPOCHS),
            predicted(lambda start: 1 - 1 / LONGER_EPOCHS),
            "estimated: the measured stalls, a quarter as often",
        ),
    ]
    if first.backend == "torch" and first.persistent_workers is False:
        out.append(
            Recommendation(
                "keep the workers from one epoch to the next (persistent_workers=True): an "
                "epoch start no longer starts them; but dataset state set per epoch in the main "
                "process (set_epoch) then no longer reaches them",
                Change(Knob.PERSISTENT_WORKERS, True),
                predicted(_starting_share),
                "estimated: the stall less the loader's measured start" if split else not_split,
            )
        )
    per_epoch = start.batches_per_epoch
    now = first.num_workers or 0
    if first.backend == "torch" and now > per_epoch > 0:
        fewer = max(1, math.floor(per_epoch))

        def fewer_start(start: EpochStartCost) -> float | None:
            starting = _starting_share(start)
            return None if starting is None else starting * (1 - fewer / now)

        out.append(
            Recommendation(
                f"fewer workers than batches per epoch: {now} workers for {per_epoch:.0f} "
                f"batches, so {now - fewer} of them sit idle at every epoch start, yet each "
                "is started or resumed with it",
                workers(fewer),
                predicted(fewer_start),
                "estimated: the loader's measured start, for fewer workers" if split else not_split,
            )
        )
    return sorted(out, key=lambda r: -(r.predicted_images_per_s or 0.0))


def _stalls(facts: LaneFacts) -> bool:
    start = facts.figures.epoch_start
    return start is not None and start.stall_ms > 0 and facts.figures.batches > 0


def _starting_share(start: EpochStartCost) -> float | None:
    """The share of an epoch start's stall spent starting the loader (None: not measured)."""
    if start.loader_start_ms is None or not start.stall_ms:
        return None
    return min(1.0, start.loader_start_ms / start.stall_ms)


def read_by_epoch(advice: Recommendation, lane: LaneFacts, lanes: int = 1) -> Recommendation:
    """`advice`, a change of `lane`'s num_workers predicted at its steady rate between epoch
    starts, predicted for a loop that reads epoch by epoch, its epoch starts included.

    An epoch of E images (`batches_per_epoch` x batch size, on each of `lanes` lanes) takes
    E / R at the steady rate R that `advice` predicts, plus one epoch start of S seconds: the
    loop gives E / (E / R + S). S at w workers, for a lane measured at n, is the loader's
    measured start x w / n (its workers are started one by one: with persistent workers that
    start is each worker's resume, scaled the same way and small either way) plus the
    prefetch's refill as measured (its first batch is made by one worker, however many there
    are). Where the start was not measured apart from the refill, S is today's stall, and the
    basis says so. Where the start grows and the workers are not persistent, the change is
    paired with persistent_workers=True: S is the refill alone (resuming kept workers is taken
    as free), and the notes give the prediction without it.

    Args:
        advice: a change of num_workers, predicted at the steady rate of the new setting.
        lane: the DataLoader lane it changes, as measured at its own num_workers.
        lanes: the lanes `advice`'s images/s are for (each reads its own epochs in step).

    Returns:
        `advice` with its prediction, basis, action and notes for epoch reading; `advice`
        itself where the lane reads one stream (no epoch start measured).
    """
    start = lane.figures.epoch_start
    steady, target = advice.predicted_images_per_s, advice.change.value
    if (
        start is None
        or not start.starts
        or start.batches_per_epoch <= 0
        or not steady
        or advice.change.knob is not Knob.NUM_WORKERS
        or not isinstance(target, int)
    ):
        return advice
    now = lane.num_workers or 0
    epoch = start.batches_per_epoch * lane.batch_size * lanes  # images, all lanes together
    head = (
        f"read epoch by epoch ({start.batches_per_epoch:,.0f} batches an epoch): "
        f"{IMAGES_PER_S.text(steady)} between epoch starts; epoch start "
        f"{start.stall_ms:,.0f} ms at {now} workers"
    )

    def predicted(start_ms: float) -> float:
        return epoch / (epoch / steady + start_ms / 1000)

    def predicting(start_ms: float, how: str) -> Recommendation:
        rate, error = predicted(start_ms), advice.predicted_error
        # Only the steady part carries the error: d(rate)/d(steady) = (rate / steady)^2.
        error = None if error is None else error * (rate / steady) ** 2
        basis = f"{advice.basis}; {head}, {how}"
        return replace(advice, predicted_images_per_s=rate, predicted_error=error, basis=basis)

    if start.loader_start_ms is None or now <= 0:
        why = (
            "the loader's start was not measured apart from the prefetch's refill"
            if start.loader_start_ms is None
            else "no worker was started to scale from"
        )
        return predicting(start.stall_ms, f"kept at {target}: {why}, so it could not be scaled")
    per_worker = start.loader_start_ms / now
    starting, refill = per_worker * target, start.refill_ms or 0.0
    scaled = (
        f"predicted {starting + refill:,.0f} ms at {target} (the loader's start "
        f"{per_worker:,.0f} ms per worker{' resumed' if lane.persistent_workers else ''}, "
        f"times {target}; the prefetch's refill {refill:,.0f} ms as measured: one batch made "
        "by one worker)"
    )
    if lane.persistent_workers is not False or starting <= start.loader_start_ms:
        return predicting(starting + refill, scaled)
    # More workers to start at every epoch: keeping them is what makes the change pay.
    kept = predicting(
        refill,
        f"{scaled}; with persistent_workers=True an epoch start only refills the prefetch "
        f"({refill:,.0f} ms; resuming the kept workers is taken as free)",
    )
    without = (
        f"without persistent_workers=True: {IMAGES_PER_S.text(predicted(starting + refill))}, "
        f"the epoch start growing from {start.stall_ms:,.0f} ms at {now} workers to "
        f"{starting + refill:,.0f} ms at {target}"
    )
    return replace(
        kept,
        action=f"{advice.action} and keep the workers across epochs (persistent_workers=True)",
        notes=(*advice.notes, without),
    )
