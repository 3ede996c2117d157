"""TensorBoard: a watched lane's figures as scalars, every `every` measured batches, under
`feedscope/` (the `tensorboard` extra: torch's SummaryWriter needs the tensorboard package).

Each point covers the batches since the last one, its step the lane's batch count:

    feedscope/data_wait_pct     the share of their time spent waiting for them
    feedscope/images_per_s      their images over their time (wait plus step)
    feedscope/step_ms           their mean step
    feedscope/epoch_start_stall_s   the epoch starts' stall so far (a total)
    feedscope/cpu_cores         the lane's processes, its workers included (last sample)

Written by the thread that writes the store, never by the training loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from probe.measure.live import Live
from probe.metrics import wait_share
from probe.records import BatchEvent

TAG = "feedscope"


class TensorBoard:
    """Writes to `target`: a folder (a SummaryWriter of its own, closed at the end) or your
    SummaryWriter (flushed, left open)."""

    def __init__(self, target: str | Path | Any, every: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.owned = isinstance(target, (str, Path))
        self.writer: Any = SummaryWriter(str(target)) if self.owned else target
        self.every = every
        self._batches: list[BatchEvent] = []

    def __call__(self, live: Live, events: Sequence[BatchEvent]) -> None:
        for event in events:
            if event.warmup:
                continue
            self._batches.append(event)
            if len(self._batches) >= self.every:
                self._write(live, self._batches)
                self._batches = []

    def close(self) -> None:
        self.writer.flush()
        if self.owned:
            self.writer.close()

    def _write(self, live: Live, batches: Sequence[BatchEvent]) -> None:
        wait = sum(e.wait_s for e in batches)
        work = sum(e.step_s for e in batches)
        at = batches[-1].index + 1
        share = wait_share(wait, work)
        add = self.writer.add_scalar
        if share is not None:
            add(f"{TAG}/data_wait_pct", 100 * share, at)
            add(f"{TAG}/images_per_s", sum(e.size for e in batches) / (wait + work), at)
        add(f"{TAG}/step_ms", 1e3 * work / len(batches), at)
        add(f"{TAG}/epoch_start_stall_s", live.stalls.stall_s, at)
        if live.cpu_cores is not None:
            add(f"{TAG}/cpu_cores", live.cpu_cores, at)
