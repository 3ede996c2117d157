"""The doctor's own points: how one of each kind is measured on the session's warm lanes, for
its share of the budget: your setting read epoch by epoch, and the job on fewer GPUs than
the session's (the DataLoader's settings are `probe.judge.session.Points`').
"""

from __future__ import annotations

import math
from dataclasses import replace

from probe.judge.changes import Change
from probe.judge.knee import SweepPoint
from probe.judge.results import DALI, TORCH, EpochsRun, Scaling
from probe.judge.scaling import checked_counts
from probe.judge.session import (
    WarmSession,
    budget_short,
    point_of,
    with_change,
    with_setting,
)
from probe.judge.thresholds import EPOCH_START_SHARE
from probe.measure.config import Checked, ProbeConfig
from probe.measure.lane import Read
from probe.records import RunStatus

# Read epoch by epoch too where a stall of one batch per worker would cost this share of an
# epoch (a DataLoader refills one batch per worker at each epoch start).
EPOCHS_WORTH_MEASURING = EPOCH_START_SHARE / 2
EPOCHS_POINTS = 3  # reading whole epochs, each opening on its stall, costs about three points


def epochs_point(
    session: WarmSession, base: ProbeConfig, baseline: SweepPoint, checked: Checked
) -> EpochsRun:
    """Your setting read epoch by epoch, where a shard is short enough for its epoch starts
    to matter and the budget left fits it: what they cost against the same setting read as a
    stream."""
    images = min(checked.shard_images.values())
    batch = base.spec.batch_size
    per_epoch = math.ceil(images / batch)
    refill = max(1, baseline.setting)  # batches: one per worker
    out = EpochsRun(
        num_workers=baseline.setting,
        batches_per_epoch=per_epoch,
        persistent_workers=base.spec.dataloader.persistent_workers,
        stream_images_per_s=baseline.images_per_s,
        reason=None,
    )
    if images < batch:
        return replace(out, reason=f"a shard holds {images} images, less than one batch")
    if refill / (per_epoch + refill) < EPOCHS_WORTH_MEASURING:
        return replace(
            out,
            reason=f"{per_epoch} batches per epoch: a refill of {refill} batches would cost "
            f"under {EPOCHS_WORTH_MEASURING:.1%} of an epoch",
        )
    if not session.budget.fits(EPOCHS_POINTS - 1):  # whole epochs, each opening on its stall
        return replace(out, reason=budget_short(session.budget, EPOCHS_POINTS - 1, after=False))
    config = with_setting(base, "num_workers", baseline.setting)
    config = replace(config, read=Read.EPOCHS, label=f"num_workers={baseline.setting}, epochs")
    document = session.measure(config)
    if document is None or document.status != RunStatus.COMPLETED.value:
        return replace(out, reason="interrupted" if document is None else document.reason)
    point = point_of(session.store, document, baseline.setting)
    stream = baseline.images_per_s
    return replace(
        out,
        run_id=document.run_id,
        images_per_s=point.images_per_s,
        images_per_s_error=point.images_per_s_error,
        cost_frac=1 - point.images_per_s / stream if stream else None,
        epoch_start=document.lanes[0].figures.epoch_start,
    )


def scaling_points(
    session: WarmSession, base: ProbeConfig, scaling: Scaling, later: int = 0
) -> Scaling:
    """Each pipeline of `scaling` measured on 1 GPU and each power of two below the session's
    GPUs (the first lanes, each on its own shard), at the setting predicted there, with `later`
    points planned after them: the prediction checked."""
    wanted = [(gpus, pipeline) for gpus in checked_counts(scaling.lanes)
              for pipeline in (TORCH, DALI) if scaling.at(pipeline, gpus) is not None]  # fmt: skip
    for position, (gpus, pipeline) in enumerate(wanted):
        point = scaling.at(pipeline, gpus)
        assert point is not None
        config = with_change(base, Change.parse(point.setting))
        left = len(wanted) - position - 1 + later
        if session.stop.is_set() or config is None:
            return replace(scaling, unchecked="interrupted")
        if not session.budget.fits(left):
            return replace(scaling, unchecked=budget_short(session.budget, left))
        label = f"scaling: {gpus} {scaling.device}{'' if gpus == 1 else 's'}, {point.setting}"
        config = replace(config, lanes=base.lanes[:gpus], label=label)
        document = session.measure(config, later=left)
        if document is None or document.status != RunStatus.COMPLETED.value:
            why = "interrupted" if document is None else f"the run failed: {document.reason}"
            return replace(scaling, unchecked=why)
        measured = point_of(session.store, document, 0)
        scaling = scaling.with_measured(
            pipeline, gpus, measured.images_per_s, measured.images_per_s_error, document.run_id
        )
    return scaling
