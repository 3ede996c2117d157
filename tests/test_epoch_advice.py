"""Advice on num_workers for a loop read epoch by epoch counts what the change does to its
epoch starts: a watched loop's in rounds of a batch per worker (`probe.judge.epochs.in_rounds`),
a sweep's or the model's by `read_by_epoch`. Each expected figure here is worked out from the
documented formula, not read back from the code: for rounds, ceil(B / w) rounds of the measured
epoch's round after the loader's start; for `read_by_epoch`, E / (E / R + S) for an epoch of E
images at the steady rate R plus one epoch start of S seconds."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from probe.judge.changes import Recommendation, workers
from probe.judge.epochs import read_by_epoch
from probe.judge.facts import LaneFacts
from probe.judge.knee import SweepPoint, analyze_sweep
from probe.judge.model import curve_of
from probe.judge.recommend import recommend
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import EpochStartCost, LaneFigures

BATCH = 256
PER_EPOCH = 70  # batches an epoch
STEADY_8 = 1546.0  # images/s between epoch starts at 8 workers: 193.25 per worker

# pytorch/examples' ImageNet script under `watch`: 8 workers started again at every epoch.
IMAGENET_START = EpochStartCost(
    starts=3, batches_per_epoch=PER_EPOCH, opening_batches=8, stall_ms=1037.0, share=0.08,
    steady_images_per_s=STEADY_8, loader_start_ms=957.0, refill_ms=80.0,
)  # fmt: skip

# A watched loop: no stage times (so no model curve), no consumer's rate (so the estimate
# aims at twice the rate: 16 workers).
IMAGENET = LaneFacts(
    lane=0, status="completed", backend="torch", consumer="model:resnet50", batch_size=BATCH,
    figures=LaneFigures(batches=200, images=200 * BATCH, images_per_s=1420.0,
                        data_wait_frac=0.3, data_wait_frac_error=0.02, blocks=20,
                        epoch_start=IMAGENET_START),
    hostname="node0", host_cpus=32, lanes_on_host=1, on_gpu=True, num_workers=8,
    pin_memory=True, output_dtype="uint8", persistent_workers=False,
)  # fmt: skip

STARVED = Verdict(VerdictKind.STARVED_CPU_HEADROOM, Severity.HIGH, 0.3, ())


def epoch_read(steady: float, start_ms: float, lanes: int = 1) -> float:
    """The documented formula: an epoch's images over its steady time plus one epoch start."""
    images = PER_EPOCH * BATCH * lanes
    return images / (images / steady + start_ms / 1000)


def advice_for(
    lane: LaneFacts, setting: int = 16
) -> tuple[str, float | None, str, tuple[str, ...]]:
    """The lane's one num_workers recommendation: its action, prediction, basis and notes."""
    (only,) = [r for r in recommend([lane], [STARVED]) if r.change == workers(setting)]
    return only.action, only.predicted_images_per_s, only.basis, only.notes


def in_rounds(workers_: int, start_ms: float, measured_start_ms: float = 957.0) -> float:
    """The documented rounds: the 8-worker epoch (70 batches at 1,420 images/s) less its
    loader's start, over its ceil(70 / 8) = 9 rounds, is a round; `workers_` take
    ceil(70 / workers_) of them after a start of `start_ms`."""
    images = PER_EPOCH * BATCH
    round_s = (images / 1420.0 - measured_start_ms / 1000) / math.ceil(PER_EPOCH / 8)
    return images / (start_ms / 1000 + math.ceil(PER_EPOCH / workers_) * round_s)


def test_imagenet_more_workers_are_predicted_in_rounds_and_keep_the_workers() -> None:
    """70 batches an epoch: 8 workers take 9 rounds, 14 take 5 (as 16 do, with a shorter
    start): 14, paired with persistent workers, since each epoch would start 14 of them."""
    action, predicted, basis, notes = advice_for(IMAGENET, 14)
    kept, without = in_rounds(14, 0.0), in_rounds(14, 957.0 / 8 * 14)
    assert predicted == pytest.approx(kept)
    assert without < kept
    assert action == (
        "raise num_workers from 8 to 14: its 70 batches an epoch take 5 rounds of a batch per "
        "worker, against 9 now, and keep the workers across epochs (persistent_workers=True)"
    )
    assert "12.6 s an epoch at 8 workers, 9 rounds after the loader's start (120 ms per " in basis
    assert notes == (
        f"without persistent_workers=True: {without:,.0f} images/s, the loader's start growing "
        "from 957 ms at 8 workers to 1,675 ms at 14",
    )


def test_persistent_workers_are_resumed_and_not_paired_again() -> None:
    resumed = replace(IMAGENET_START, stall_ms=120.0, loader_start_ms=40.0, refill_ms=80.0)
    lane = replace(IMAGENET, persistent_workers=True,
                   figures=replace(IMAGENET.figures, epoch_start=resumed))  # fmt: skip
    action, predicted, basis, notes = advice_for(lane, 14)
    assert predicted == pytest.approx(in_rounds(14, 40.0 / 8 * 14, measured_start_ms=40.0))
    assert action.startswith("raise num_workers from 8 to 14: ") and "persistent" not in action
    assert notes == ()
    assert "(5 ms per worker resumed, 70 ms at 14)" in basis


@pytest.mark.parametrize("start", [None, replace(IMAGENET_START, starts=0)])
def test_a_stream_gets_todays_prediction(start: EpochStartCost | None) -> None:
    lane = replace(IMAGENET, figures=replace(IMAGENET.figures, images_per_s=STEADY_8,
                                             epoch_start=start))  # fmt: skip
    action, predicted, basis, notes = advice_for(lane)
    assert (action, predicted, notes) == ("raise num_workers from 8 to 16", 3092.0, ())
    assert basis.startswith("estimated, not measured: 193 images/s per worker")
    assert "epoch" not in basis


def test_a_start_not_split_is_kept_as_it_is_and_says_so() -> None:
    unsplit = replace(IMAGENET_START, loader_start_ms=None, refill_ms=None)
    lane = replace(IMAGENET, figures=replace(IMAGENET.figures, epoch_start=unsplit))
    action, predicted, basis, notes = advice_for(lane, 14)
    # the whole epoch start, 1,037 ms, kept as it is at 14 workers
    assert predicted == pytest.approx(in_rounds(14, 1037.0, measured_start_ms=1037.0))
    assert "persistent" not in action  # nothing measured to pair it on
    assert notes == ()
    assert (
        "9 rounds after its epoch start (1,037 ms; the loader's start was not measured apart, "
        "so it is kept as it is)"
    ) in basis


def test_a_sweeps_point_counts_the_starts_and_its_error_for_all_lanes() -> None:
    sweep = analyze_sweep([
        SweepPoint(8, 3000.0, images_per_s_error=30.0),
        SweepPoint(16, 6000.0, images_per_s_error=60.0, run_id="r16"),
        SweepPoint(24, 6050.0, images_per_s_error=60.0),
    ])  # fmt: skip
    two = [IMAGENET, replace(IMAGENET, lane=1)]  # two lanes, each reading its own epochs
    (advice,) = [r for r in recommend(two, [STARVED, STARVED], sweep=sweep)
                 if r.change == workers(16)]  # fmt: skip
    kept = epoch_read(6000.0, 80.0, lanes=2)
    assert advice.predicted_images_per_s == pytest.approx(kept)
    # The error is the steady part's: d(kept)/d(steady) = (kept / steady)^2.
    assert advice.predicted_error == pytest.approx(60.0 * (kept / 6000.0) ** 2)
    assert advice.action.endswith("and keep the workers across epochs (persistent_workers=True)")
    assert advice.basis.startswith("measured in a sweep: num_workers=16 gave 6,000 ± 60")


def test_the_models_knee_counts_the_starts() -> None:
    stages = {"read": 0.5, "decode": 3.0, "crop_resize": 1.0, "flip": 0.1, "collate": 0.2,
              "worker_rest": 0.3, "receive": 0.05, "to_device": 0.02}  # fmt: skip
    timed = replace(IMAGENET.figures, stages_ms=stages, cpu_pct=500.0, step_ms_p50=60.0)
    lane = replace(IMAGENET, figures=timed, step_ms_mean=60.0)
    curve = curve_of(lane)
    assert curve is not None
    knee = curve.knee(curve.settings())
    assert knee > 8
    (advice,) = [r for r in recommend([lane], [STARVED]) if r.change == workers(knee)]
    assert advice.predicted_images_per_s == pytest.approx(
        epoch_read(curve.images_per_s(knee), 80.0)
    )
    assert advice.basis.startswith("predicted by the model from this run")
    assert "persistent_workers=True" in advice.action


def test_fewer_workers_start_faster_and_need_no_pairing() -> None:
    fewer = Recommendation("lower num_workers from 8 to 4", workers(4), 1500.0, "assumed")
    advice = read_by_epoch(fewer, IMAGENET)
    assert advice.predicted_images_per_s == pytest.approx(epoch_read(1500.0, 957.0 / 2 + 80.0))
    assert (advice.action, advice.notes) == ("lower num_workers from 8 to 4", ())
    assert "epoch start 1,037 ms at 8 workers, predicted 558 ms at 4" in advice.basis
