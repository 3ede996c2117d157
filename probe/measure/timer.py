"""The one way a batch is timed: asked for, got, done after the step.

A batch's wait runs from the moment it is asked for until it is got: ready on the device where
the timer can wait for that (the copy to the device included), else as the loader handed it
over. Its step runs from then until the step is done. Every batch event a lane, `watch` or
`bench` records is made here, on `time.monotonic_ns()`, the clock the samplers stamp with.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

from probe.records import BatchEvent


class BatchTimer:
    """Times one lane's batches, one after another, and numbers them.

    Args:
        lane: the lane the events belong to.
        wait_for_device: waits until a batch just got is ready on the device
            (`probe.measure.devices.device_sync`; a no-op on the CPU, where a batch in hand is
            ready). None where the timer must not wait: each wait then ends when the loader
            hands the batch over, and its events say `synced=False`.
        numbers: the events' indices, where several timers number one lane's batches together
            (each `for` over a watched loader has its own); default 0, 1, 2...
    """

    def __init__(
        self,
        lane: int,
        wait_for_device: Callable[[], None] | None,
        numbers: Iterator[int] | None = None,
    ) -> None:
        self.lane = lane
        self.synced = wait_for_device is not None
        self._wait_for_device = wait_for_device
        self._numbers = itertools.count() if numbers is None else numbers
        self.asked_ns = self.got_ns = self.done_ns = 0

    def ask(self, at_ns: int | None = None) -> None:
        """The consumer asks for the next batch: now, or at `at_ns` (when the last step ended,
        so that no time falls between one batch and the next)."""
        self.asked_ns = time.monotonic_ns() if at_ns is None else at_ns

    def got(self) -> None:
        """The consumer has the batch: waits until it is ready on the device, where it can."""
        if self._wait_for_device is not None:
            self._wait_for_device()
        self.got_ns = time.monotonic_ns()

    def done(self, size: int, epoch: int = 0) -> BatchEvent:
        """The step is done: the batch's event (not warm-up; the caller decides that)."""
        self.done_ns = time.monotonic_ns()
        return BatchEvent(
            lane=self.lane,
            index=next(self._numbers),
            t_ns=self.asked_ns,
            wait_s=(self.got_ns - self.asked_ns) / 1e9,
            step_s=(self.done_ns - self.got_ns) / 1e9,
            size=size,
            warmup=False,
            epoch=epoch,
            synced=self.synced,
        )
