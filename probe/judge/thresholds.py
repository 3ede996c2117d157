"""The judging rules' thresholds, each with its reason, and the severity they give data-wait.

Starvation is the share of batch time the consumer waits for data (`probe.metrics.wait_share`);
TensorFlow's input-pipeline analyzer calls >= 20% highly and >= 5% moderately input-bound, and
so does this.
"""

from __future__ import annotations

from enum import Enum

WAIT_HIGH = 0.20  # data-wait share: highly input-bound
WAIT_MODERATE = 0.05  # moderately input-bound; below it, fed
CPU_SATURATED_PCT = 85.0  # host busy share above which decoding has no CPU left
# A loader whose images/s reach this share of what its cores can make at the CPU each image
# costs (`LaneFacts.cpu_cap_images_per_s`), within the rate's error, is held by the CPU; below it,
# with fewer workers than cores, by its workers. Its rate over that cap is the share of its cores
# its processes keep busy, so this is the busy share at which the CPU has none left.
CPU_CAP_NEAR = CPU_SATURATED_PCT / 100
THREADS_SATURATED = 0.90  # a DALI lane keeps this share of its threads' time busy: all of them
MAIN_THREAD_BOUND_PCT = 90.0  # the training loop's thread is busy all the time
IOWAIT_BOUND_PCT = 10.0  # share of CPU time spent waiting for the disk
NVJPG_SATURATED_PCT = 90.0  # hardware JPEG decoder busy share
HW_DECODER_STEP = 0.25  # DALI's hw_decoder_load raised by this where nvJPEG slows the step
KNEE_WITHIN = 0.05  # a sweep's knee: the smallest setting within 5% of the best
KNEE_POINTS = 2  # a knee is stated where this many settings were measured: one beside it
PAST_PEAK = 0.05  # larger settings this far below the best are oversubscribed
DALI_WORTH_IT = 0.15  # a DALI migration must gain at least 15% over the DataLoader ...
DALI_FREES_WORTH_IT = 0.25  # ... unless it frees this share of the cores: then any gain will do
IMBALANCE = 0.15  # lanes' images/s differing by more than this share of the fastest
# A rank that spends this share of its step waiting for another rank's data is held by it
# (below it, what ranks' steps differ by on their own, a clock or a noisy host, can explain it).
HELD_SHARE = 0.10
# Ranks run in step (DDP's all-reduce keeps them) where their batch times differ by less than
# this share of what one's step is longer than the other's: what the holding rank waits longer.
IN_STEP = 0.25
# Ranks whose mean batch times agree within this share keep one pace, as an all-reduce makes them
SAME_PACE = 0.05
STEP_STALL = 1.5  # mean step over median step: steps stall (the loop waits for CPU too)
STEP_SLOWED = 0.05  # a step this much slower under the loader's load than alone: a finding
# A DataLoader worker's own busy threads: its loop, and its queue's feeder thread (busy handing
# over float32 batches); more are its dataset's (OpenCV, BLAS, a pool).
DATALOADER_THREADS = 2
STEP_CPU_SHARE = 0.25  # a step whose CPU time is this share of its time works on the CPU
EPOCH_START_SHARE = 0.05  # epoch starts costing this share of the time are a finding
LONGER_EPOCHS = 4  # "longer epochs" is predicted for epochs this many times as long
# Other processes using this share of the host's cores (and at least OTHER_LOAD_MIN_CORES), or
# this much steal, could have moved a CPU-bound answer: the figures are not trusted then.
OTHER_LOAD_SHARE = 0.10
OTHER_LOAD_MIN_CORES = 0.25
STEAL_MOVES_PCT = 5.0
# A watched DataLoader costing this many times the CPU an image of feedscope's DataLoader recipe
# on its files: the recipe is a change of its own (`probe migrate --to dataloader`)
RECIPE_WORTH_IT = 1.25


class Severity(str, Enum):
    HIGH = "high"
    MODERATE = "moderate"
    NONE = "none"


def severity_of(data_wait_frac: float | None) -> Severity:
    """How input-bound a data-wait share is, by WAIT_HIGH and WAIT_MODERATE."""
    if data_wait_frac is None:
        return Severity.NONE
    if data_wait_frac >= WAIT_HIGH:
        return Severity.HIGH
    if data_wait_frac >= WAIT_MODERATE:
        return Severity.MODERATE
    return Severity.NONE


def in_step(batch_apart: float, step_apart: float) -> bool:
    """Whether ranks run in step: DDP's all-reduce gives them one batch time, so that what their
    steps differ by (`step_apart`) is what their waits for data differ by, while their batch
    times (`batch_apart`, in the same unit) stay within IN_STEP of it. Lanes each their own
    loop (a probe's) have batch times as far apart as their steps."""
    return batch_apart < IN_STEP * step_apart
