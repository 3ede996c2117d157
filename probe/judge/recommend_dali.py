"""Recommendations in DALI's terms, and DALI's place beside the DataLoader's answer.

For a run (`probe.judge.recommend`): a DALI lane's own changes (more CPU threads, the decoder,
the hardware decoder's share), decoding off the SMs where DALI slows the step on its GPU, and a
move to DALI where the CPU caps a DataLoader, each estimated and said to be. For a doctor's
session: the migration to the DALI run it measured (`dali_recommendation`), what DALI must gain
to be worth it (`dali_gain_needed`, `dali_worth_it`), and why it is not recommended where it
falls short (`dali_advice`)."""

from __future__ import annotations

from collections.abc import Sequence

from probe.judge.changes import Change, Knob, Recommendation, to_dali
from probe.judge.dali_run import CoresFreed, DaliRun
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import (
    DALI_FREES_WORTH_IT,
    DALI_WORTH_IT,
    HW_DECODER_STEP,
    NVJPG_SATURATED_PCT,
)
from probe.judge.verdicts import FED_KINDS, Verdict, VerdictKind
from probe.metrics import IMAGES_PER_S, NVJPG, signed
from probe.steady import MIN_BLOCKS, Estimate, above, margin


def off_the_sms(lane: LaneFacts, lanes: int) -> list[Recommendation]:
    """Where DALI's `mixed` decoder slows the step on its GPU: decode on DALI's CPU threads
    instead (at best the consumer alone's rate), or, where the hardware JPEG decoder has room,
    send it more of the JPEGs and nvJPEG on the SMs fewer."""
    alone = lane.consumer_images_per_s
    busy_cpu = lane.host.cpu_pct
    room = "" if busy_cpu is None else f" (the host's CPU was {busy_cpu:.0f}% busy)"
    out = [
        Recommendation(
            "decode on DALI's CPU threads (decoder cpu), leaving the SMs to the model: it frees "
            "the GPU at the cost of CPU",
            to_dali("cpu", lane.num_threads or 1),
            None if alone is None else alone * lanes,
            "estimated: at best the consumer alone's rate, if the CPU threads keep up; "
            "`probe doctor --decoder cpu` measures it",
            notes=(
                f"where the CPU has room{room}, the DataLoader, decoding on the CPU, is the "
                "alternative: the doctor measures it beside DALI",
            ),
        )
    ]
    busy, load = lane.figures.nvjpg_pct, lane.hw_decoder_load
    if busy is not None and busy < NVJPG_SATURATED_PCT and load is not None and load < 1:
        out.append(
            Recommendation(
                f"send more JPEGs to the hardware decoder ({NVJPG.text(busy)} busy) and fewer "
                "to nvJPEG on the SMs",
                Change(Knob.HW_DECODER_LOAD, round(min(1.0, load + HW_DECODER_STEP), 2)),
                None,
                "not predicted: the split between the decoders is not measured apart",
            )
        )
    return out


def more_threads(lane: LaneFacts, lanes: int) -> list[Recommendation]:
    """Twice DALI's CPU threads, up to the cores: images/s per thread times threads, at most
    what the cores make at the CPU each image costs and the consumer's rate."""
    threads = lane.num_threads or 1
    target = int(min(threads * 2, lane.cores_per_lane))
    if target <= threads:
        return []
    rate = lane.figures.images_per_s
    bounds = [b for b in (lane.consumer_images_per_s, lane.cpu_cap_images_per_s) if b]
    predicted = max(rate, min([rate * target / threads, *bounds]))  # never below today's
    return [
        Recommendation(
            f"raise DALI num_threads from {threads} to {target}",
            Change(Knob.NUM_THREADS, target),
            predicted * lanes,
            f"estimated, not measured: images/s per thread times threads, bounded by the "
            f"{lane.cores_per_lane_text}, what they make at the CPU each image costs, and the "
            f"consumer's own rate; {_dali_search(lane)}",
        )
    ]


def _dali_search(lane: LaneFacts) -> str:
    """What measures a DALI lane's settings: the doctor's search of DALI's threads and, mixed,
    the hardware decoder's share, on the lane's files (a watched job's where they are known)."""
    searches = "searches DALI's threads and the hardware decoder's share"
    if lane.watched_run and lane.watched_files:
        return f"`probe doctor --like {lane.watched_run}` {searches} on its files"
    if lane.watched_run:
        return f"`probe doctor --data DIR` (DIR: a class-per-folder copy of its images) {searches}"
    return f"`probe doctor` {searches}"


def in_dalis_terms(lane: LaneFacts, verdict: Verdict, lanes: int) -> list[Recommendation]:
    """A starved DALI lane's changes in DALI's own terms: more CPU threads where the CPU has
    room (up to what the cores make, where the CPU caps it); decoding on the GPU (mixed) where it
    decodes on the CPU beside one; the hardware decoder's share, where it was measured to have
    room. Its threads
    all busy are `probe.judge.recommend`'s."""
    out = []
    capped_with_room = (  # the CPU caps it, yet its threads use only part of the cores
        lane.cpu_capped and not lane.cpu_saturated and (lane.num_threads or 1) < lane.cores_per_lane
    )
    if verdict.kind is VerdictKind.DALI_THREADS_TOO_FEW or capped_with_room:
        out += more_threads(lane, lanes)
    alone = lane.consumer_images_per_s
    if lane.on_gpu and lane.decoder == "cpu":
        out.append(
            Recommendation(
                "decode on the GPU (decoder mixed: nvJPEG and the hardware JPEG decoder), "
                "freeing DALI's CPU threads of the decoding",
                to_dali("mixed", lane.num_threads or 1),
                None if alone is None else alone * lanes,
                f"estimated: at most the consumer's own rate; {_dali_search(lane)}",
            )
        )
    busy, load = lane.figures.nvjpg_pct, lane.hw_decoder_load
    if (
        lane.decoder == "mixed"
        and load is not None
        and load < 1
        and busy is not None
        and busy < NVJPG_SATURATED_PCT
    ):
        out.append(
            Recommendation(
                f"send more JPEGs to the hardware decoder ({NVJPG.text(busy)} busy), taking "
                "decoding off DALI's CPU threads and nvJPEG's",
                Change(Knob.HW_DECODER_LOAD, round(min(1.0, load + HW_DECODER_STEP), 2)),
                None,
                f"not predicted: the split between the decoders is not measured apart; "
                f"{_dali_search(lane)}",
            )
        )
    return out


def to_dali_estimate(lane: LaneFacts, lanes: int) -> Recommendation:
    """A move to DALI where the CPU caps the loader (or its main process holds it): on a GPU,
    decoding there, predicted at most the consumer's own rate; on the CPU alone, DALI's CPU
    decoder, which uses the same cores: not predicted. The doctor measures it, on a watched
    job's own files where it watched one."""
    threads = min(8, max(1, int(lane.cores_per_lane)))
    like = f" --like {lane.watched_run}" if lane.watched_run else ""
    files = " on the job's own files" if lane.watched_run else ""
    measures = f"`probe doctor{like}` measures it{files}"
    if not lane.on_gpu:
        return Recommendation(
            "move decoding to DALI (its CPU decoder)",
            to_dali("cpu", threads),
            None,
            f"not predicted: DALI's CPU decoder uses the same cores; {measures}",
        )
    alone = lane.consumer_images_per_s
    return Recommendation(
        "move decoding to DALI (nvJPEG and the hardware decoder)",
        to_dali("mixed", threads),
        None if alone is None else alone * lanes,
        f"estimated: at most the consumer's own rate, if DALI keeps up; {measures}",
    )


def dali_recommendation(dali: DaliRun, notes: Sequence[str] = ()) -> Recommendation:
    """The migration to the DALI pipeline the doctor measured, predicted at what it measured,
    with `notes` (what it frees and costs)."""
    assert dali.images_per_s is not None  # measured
    return Recommendation(
        "move decoding and augmentation to DALI",
        dali.change,
        dali.images_per_s,
        f"measured in the DALI run {dali.run_id}",
        notes=tuple(notes),
        predicted_error=dali.images_per_s_error,
    )


def dali_gain_needed(freed: CoresFreed | None) -> float:
    """What DALI must gain over the DataLoader to be worth a migration: DALI_WORTH_IT, or
    nothing beyond the errors where it frees DALI_FREES_WORTH_IT of the cores or more (those
    cores are a gain of their own: other work, or more GPUs fed by the same host)."""
    if freed is not None and freed.share >= DALI_FREES_WORTH_IT:
        return 0.0
    return DALI_WORTH_IT


def dali_worth_it(reference: Estimate, dali: DaliRun, freed: CoresFreed | None = None) -> bool:
    """Whether DALI measured significantly more than the DataLoader's `reference` (beyond both
    errors and the drift between runs) by what it must gain (`dali_gain_needed`)."""
    if not dali.judged or dali.images_per_s is None:
        return False
    measured = Estimate(dali.images_per_s, dali.images_per_s_error, MIN_BLOCKS)
    return above(measured, 1 + dali_gain_needed(freed), reference)


def dali_advice(
    reference: Estimate, setting: str, dali: DaliRun, verdict: Verdict, freed: CoresFreed | None
) -> str | None:
    """Why DALI is not recommended, and by how much it falls short, where it was measured and
    does not help (None where it was not measured, or is recommended); `reference` is the
    DataLoader's `setting` as measured (and verified)."""
    if not dali.judged or dali.images_per_s is None or dali_worth_it(reference, dali, freed):
        return None
    measured = Estimate(dali.images_per_s, dali.images_per_s_error, MIN_BLOCKS)
    gain = dali.images_per_s / reference.value - 1 if reference.value > 0 else 0.0
    shown = IMAGES_PER_S.cell(dali.images_per_s, dali.images_per_s_error)
    versus = f"{signed(gain)} on {setting} ({IMAGES_PER_S.cell(reference.value, reference.error)})"
    frees = "" if freed is None else f"; it {freed.text}"
    if verdict.kind in FED_KINDS:
        return (
            f"DALI would not help: the DataLoader feeds the GPU (compute-bound); DALI measured "
            f"{shown} images/s, {versus}{frees}"
        )
    needed = dali_gain_needed(freed)
    error = margin(measured, 1.0, reference, drift=True)
    surely = (dali.images_per_s - error) / reference.value
    if needed and (dali.images_per_s + error) / reference.value >= 1 + needed:
        return (  # the bar lies within DALI's error: say so, and keep the same first answer
            f"either: DALI measured {shown} images/s, {signed(gain)} "
            f"± {error / reference.value:.0%} on {setting}{frees}; a migration should gain "
            f"{needed:.0%}, within that error, so "
            "your setting stays first; a longer doctor (more --budget) measures both longer"
        )
    why = (
        f"a migration should gain {needed:.0%} where it frees under "
        f"{DALI_FREES_WORTH_IT:.0%} of the cores, and it is surely at least {signed(surely - 1)}: "
        f"{(1 + needed - surely) * 100:.0f} points short"
        if needed
        else f"not faster beyond both errors and the drift between runs (surely at least "
        f"{signed(surely - 1)})"
    )
    return f"DALI measured {shown} images/s, {versus}{frees}: {why}"
