"""What takes epoch starts' stalls away (`epoch_fixes`), each predicted from the rate without
them (and without the epochs' tails, where it reads across epoch ends), at most what the CPU
lets the loader make: an endless sampler, longer epochs, persistent workers, fewer workers
than batches per epoch; and what a change of num_workers does to a loop read epoch by epoch
(`read_by_epoch`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from probe.judge.changes import Change, Knob, Recommendation, workers
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import KNEE_WITHIN, LONGER_EPOCHS
from probe.lane_figures import EpochStartCost
from probe.metrics import CPU_PER_IMAGE, IMAGES_PER_S, counted

# The share of a lane's stall that a fix takes away (None: it cannot be told).
_Removes = Callable[[EpochStartCost], float | None]


def epoch_fixes(
    facts: Sequence[LaneFacts], stream: Mapping[int, float] | None = None, basis: str = ""
) -> list[Recommendation]:
    """What takes the epoch starts' stalls away, ranked by the images/s each is predicted to
    give. A fix that removes a share of a lane's stall, and of its epochs' tails, takes that
    share of their time per image away: their time as measured where `stream` gives the rate
    without both (the same setting read as one stream, per lane; `basis` says where), else the
    stall's from the rate between epoch starts and the tails' as measured. Where a lane's cores
    cannot make what its step could take (`LaneFacts.cpu_short`), no fix gives it more than
    they make (nor less than today's): its notes say what it would give once the CPU is
    answered."""
    stalled = [f for f in facts if _stalls(f)]
    if not stalled:
        return []

    short = next((f for f in stalled if f.cpu_short), None)

    def fix(
        action: str, change: Change, removes: _Removes, tails: float, how: str
    ) -> Recommendation:
        """A fix as `_predicted`, with what it would give once the CPU is answered."""
        rate = _predicted(facts, stream, removes, tails)
        answered = _predicted(facts, stream, removes, tails, capped=False)
        notes: tuple[str, ...] = ()
        if short is not None and rate is not None and answered is not None and answered > rate:
            notes = (f"{_cpu_cap_text(short)}, at most {IMAGES_PER_S.text(answered)}",)
        return Recommendation(action, change, rate, how, notes=notes)

    first = stalled[0]
    start = first.figures.epoch_start
    assert start is not None  # stalled
    split = start.loader_start_ms is not None
    not_split = "not predicted: the loader's start is not measured apart here"
    ends = any(cost.ends for f in stalled if (cost := f.figures.epoch_start))
    and_tails = " and tails" if ends else ""
    out = [
        fix(
            "read across epoch ends: one endless sampler over the shard's epochs (the read "
            "order of each epoch kept), so that the prefetch never drains, as feedscope's "
            "stream reading and timm's MultiEpochsDataLoader do",
            Change(Knob.SAMPLER, "endless"),
            lambda start: 1.0,
            1.0,
            basis or f"estimated: the rate measured between epoch starts{and_tails}",
        ),
        fix(
            f"make an epoch {LONGER_EPOCHS}x longer (the shard {LONGER_EPOCHS} times over in "
            "its sampler): the same stall, a quarter as often",
            Change(Knob.EPOCH_LENGTH, LONGER_EPOCHS),
            lambda start: 1 - 1 / LONGER_EPOCHS,
            1 - 1 / LONGER_EPOCHS,
            f"estimated: the measured stalls{and_tails}, a quarter as often",
        ),
    ]
    if first.backend == "torch" and first.persistent_workers is False:
        out.append(
            fix(
                "keep the workers from one epoch to the next (persistent_workers=True): an "
                "epoch start no longer starts them; but dataset state set per epoch in the main "
                "process (set_epoch) then no longer reaches them",
                Change(Knob.PERSISTENT_WORKERS, True),
                _starting_share,
                0.0,
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
            fix(
                f"fewer workers than batches per epoch: {counted(now, 'worker')} for "
                f"{per_epoch:.0f} batches, so {now - fewer} of them "
                f"{'sits' if now - fewer == 1 else 'sit'} idle at every epoch start, yet each is "
                "started or resumed with it",
                workers(fewer),
                fewer_start,
                0.0,
                "estimated: the loader's measured start, for fewer workers" if split else not_split,
            )
        )
    return sorted(out, key=lambda r: -(r.predicted_images_per_s or 0.0))


def _predicted(
    facts: Sequence[LaneFacts],
    stream: Mapping[int, float] | None,
    removes: _Removes,
    tails: float,
    capped: bool = True,
) -> float | None:
    """All lanes' images/s with the share `removes(start)` of each stall and `tails` of its
    tails taken away (`epoch_fixes`; None where that share cannot be told); `capped`: at most
    what each lane's CPU can make, else at most the rate its step could take."""
    total = 0.0
    for f in facts:
        start, rate = f.figures.epoch_start, f.figures.images_per_s
        if not _stalls(f) or start is None or not rate:
            total += rate
            continue
        share = removes(start)
        if share is None:
            return None
        tail_cost = start.tail_share / rate  # seconds per image
        measured = (stream or {}).get(f.lane)
        if measured:
            start_cost = max(0.0, 1 / rate - 1 / measured - tail_cost)
        else:
            steady = start.steady_images_per_s
            start_cost = 1 / rate - 1 / steady if steady else 1 / rate
        left = 1 / rate - share * start_cost - tails * tail_cost  # seconds per image
        if left <= 0:
            return None
        cap = f.cpu_cap_images_per_s if f.cpu_short else None
        if not capped:
            cap = f.consumer_images_per_s
        total += 1 / left if cap is None else min(1 / left, max(cap, rate, measured or 0.0))
    return total


def _cpu_cap_text(lane: LaneFacts) -> str:
    """What the cores of a lane short of CPU (`LaneFacts.cpu_short`) make, and what answers it."""
    cap, cpu_ms = lane.cpu_cap_images_per_s, lane.figures.cpu_ms_per_image
    gpu_decodes = lane.backend == "torch" or lane.decoder == "cpu"  # what a GPU could take
    answer = "DALI, decoding on the GPU" if lane.on_gpu and gpu_decodes else "more cores"
    if lane.on_gpu and lane.backend == "dali" and lane.decoder == "cpu":
        answer = "DALI's mixed decoder, decoding on the GPU"
    return (
        f"the lane's cores make at most {IMAGES_PER_S.text(cap)}{lane.per_lane(cap)} "
        f"({CPU_PER_IMAGE.text(cpu_ms)} of CPU an image, {lane.cores_per_lane_text}): with the "
        f"CPU answered ({answer})"
    )


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
        f"{start.stall_ms:,.0f} ms at {counted(now, 'worker')}"
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
        f"the epoch start growing from {start.stall_ms:,.0f} ms at {counted(now, 'worker')} to "
        f"{starting + refill:,.0f} ms at {target}"
    )
    return replace(
        kept,
        action=f"{advice.action} and keep the workers across epochs (persistent_workers=True)",
        notes=(*advice.notes, without),
    )


def _measures_rounds(lane: LaneFacts, target: int) -> str:
    """What measures a loader at `target` workers read epoch by epoch: a watched job's own
    loader runs only in the job (`probe tune` runs it there; `probe doctor --like` measures
    feedscope's DataLoader, not this one); feedscope's, `probe run`."""
    if lane.watched_run:
        return "the job's own loader: `probe tune` measures it on the job itself"
    return f"`probe run --read epochs --workers {target}` measures it"


def in_rounds(lane: LaneFacts, lanes: int = 1) -> Recommendation | None:
    """More workers for a DataLoader read epoch by epoch, predicted in rounds
    (`rounds_images_per_s`): the fewest workers within KNEE_WITHIN of the best up to the cores,
    its images/s for `lanes` lanes. Where the workers are started anew at every epoch, the
    change is paired with persistent_workers=True (resuming kept workers is taken as free), and
    the notes give the prediction without it. None where the lane reads one stream, its epoch
    was not measured, or no more workers gain.

    Where an epoch holds many rounds, this is images/s per worker times workers, bounded by the
    cores; where it holds few, it sees what that does not: a last round half empty, and workers
    past B / rounds that only wait (seen on one H200: 8 workers predicted 340 images/s at 16
    against 363 ± 97 measured there; per worker times workers said 456). A worker's batch is
    taken to take as long with more workers, unless the CPU each image costs says the cores run
    out; where that cost was not measured, no more than twice the workers are predicted (a traced
    H200 ResNet-50 job gave 1,460 images/s with 4 workers and 2,592 with 16, not four times).
    """
    now = lane.num_workers or 0
    if rounds_images_per_s(lane, now) is None:
        return None
    # Up to the cores where the CPU each image costs bounds them; else up to twice as many
    # (workers stop adding long before the cores run out on many hosts).
    most = int(lane.cores_per_lane) if lane.figures.cpu_ms_per_image else 2 * now
    settings = range(now + 1, max(now + 1, min(most, int(lane.cores_per_lane))) + 1)
    rates = {w: rounds_images_per_s(lane, w) or 0.0 for w in [now, *settings]}
    best = max(rates[w] for w in settings)
    if best <= rates[now] * (1 + KNEE_WITHIN):
        return None
    target = next(w for w in settings if rates[w] >= (1 - KNEE_WITHIN) * best)
    start = lane.figures.epoch_start
    assert start is not None  # measured in rounds
    batches = round(start.batches_per_epoch)
    rounds_now, rounds = math.ceil(batches / now), math.ceil(batches / target)
    fewest = math.ceil(batches / settings[-1])
    epoch_s = batches * lane.batch_size / lane.figures.images_per_s
    per_worker = (start.loader_start_ms or 0.0) / now
    cpu_ms = lane.figures.cpu_ms_per_image
    cpu = "" if not cpu_ms else (
        f"; each image {CPU_PER_IMAGE.text(cpu_ms)} of CPU on {lane.loader_cores:.1f} cores"
    )  # fmt: skip
    resumed = " resumed" if lane.persistent_workers else ""
    starting = (
        f"the loader's start ({per_worker:,.0f} ms per worker{resumed}, "
        f"{per_worker * target:,.0f} ms at {target})"
        if start.loader_start_ms is not None
        else f"its epoch start ({start.stall_ms:,.0f} ms; the loader's start was not measured "
        "apart, so it is kept as it is)"
    )
    basis = (
        f"estimated, not measured: read epoch by epoch, {batches} batches an epoch made in "
        f"rounds of a batch per worker: {epoch_s:,.1f} s an epoch at {counted(now, 'worker')}, "
        f"{counted(rounds_now, 'round')} after {starting}{cpu}; {counted(rounds, 'round')} at "
        f"{counted(target, 'worker')} ({fewest} at {settings[-1]}); at most the consumer's "
        f"rate; {_measures_rounds(lane, target)}"
    )
    action = (
        f"raise num_workers from {now} to {target}: its {batches} batches an epoch take "
        f"{rounds} rounds of a batch per worker, against {rounds_now} now"
    )
    advice = Recommendation(action, workers(target), rates[target] * lanes, basis)
    kept = rounds_images_per_s(lane, target, kept=True) or 0.0
    if lane.persistent_workers is not False or not start.loader_start_ms or kept <= rates[target]:
        return advice
    return replace(
        advice,
        action=f"{action}, and keep the workers across epochs (persistent_workers=True)",
        predicted_images_per_s=kept * lanes,
        basis=f"{basis}; with persistent_workers=True an epoch starts no worker (resuming kept "
        "workers is taken as free)",
        notes=(
            f"without persistent_workers=True: {IMAGES_PER_S.text(rates[target] * lanes)}, the "
            f"loader's start growing from {start.loader_start_ms:,.0f} ms at "
            f"{counted(now, 'worker')} to {per_worker * target:,.0f} ms at {target}",
        ),
    )


def rounds_images_per_s(lane: LaneFacts, w: int, kept: bool = False) -> float | None:
    """One lane's images/s at `w` workers for a DataLoader read epoch by epoch, from its epochs
    as measured at its own workers. An epoch of B batches is made in rounds, each worker one
    batch a round, so w workers take ceil(B / w) rounds, the last with the batches left (24
    batches: 8 workers take 3 rounds, 12 and 16 take 2). An epoch takes the loader's start (per
    worker, times w; none where the workers are `kept` from the epoch before; where the start was
    not measured apart, the epoch start's whole stall, kept as it is) and each round the time a
    worker makes a batch (the measured epoch less its start, over its rounds), or longer
    where the round's batches need more CPU than the lane's cores give (`cpu_ms_per_image`); at
    most the consumer's rate. None where the lane reads one stream, or its epoch or rate was not
    measured."""
    start, figures, now = lane.figures.epoch_start, lane.figures, lane.num_workers or 0
    if (
        lane.backend != "torch"
        or start is None
        or not start.starts
        or round(start.batches_per_epoch) < 1
        or not figures.images_per_s
        or now < 1
        or w < 1
    ):
        return None
    batches = round(start.batches_per_epoch)
    epoch_s = batches * lane.batch_size / figures.images_per_s
    split = start.loader_start_ms is not None  # else the whole stall, kept as it is
    start_s = (start.stall_ms if start.loader_start_ms is None else start.loader_start_ms) / 1000
    batch_s = max(0.0, epoch_s - start_s) / math.ceil(batches / now)
    cpu_ms, cores = figures.cpu_ms_per_image, lane.loader_cores

    def round_s(made: int) -> float:
        """A round of `made` batches: a worker's batch, or the cores' time for all of them."""
        needed = made * lane.batch_size * cpu_ms / 1000 / cores if cpu_ms and cores else 0.0
        return max(batch_s, needed)

    full, left = divmod(batches, w)
    starting = 0.0 if kept else start_s * w / now if split else start_s
    seconds = starting + full * round_s(w) + (round_s(left) if left else 0.0)
    made = batches * lane.batch_size / seconds if seconds > 0 else math.inf
    return min(made, lane.consumer_images_per_s or math.inf)
