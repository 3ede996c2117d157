"""Rows on their way to the store, kept while another process holds its write lock.

A probe or a `watch` loop writes every half second. When another process holds the store's
write lock (a long `probe merge`, a backup, a second node on a shared file system), a write
waits WRITE_WAIT_S, keeps its rows in memory and tries again later, waiting longer each time
(up to RETRY_MAX_S). The rows are bounded by time: a store locked for STORE_WAIT_S (60 s, or
`$FEEDSCOPE_STORE_WAIT_S`) is lost to the run, which then stops and says so. A store the machine
fails (a full disk, the file removed: `StoreFailed`) is lost at once. Each write is one
transaction, so a retry never writes a row twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from probe.measure.recorder import Drained
from probe.records import BatchEvent
from probe.store.connection import StoreBusy, StoreFailed
from probe.store.db import Store

STORE_WAIT_S = float(os.environ.get("FEEDSCOPE_STORE_WAIT_S", "60"))
WRITE_WAIT_S = 0.5  # how long one periodic write waits for the lock before it tries later
RETRY_MAX_S = 8.0

T = TypeVar("T")


def _locked_reason(store: Store) -> str:
    return (
        f"the store {store.path} stayed locked by another process for {STORE_WAIT_S:g} s: "
        "stopped there (what was written before is kept)"
    )


@dataclass
class Unwritten:
    """Batch events and samples of one run not written yet."""

    batches: list[BatchEvent] = field(default_factory=list)
    drained: Drained = field(default_factory=Drained)
    blocked_since: float | None = None  # when the store was first found locked, if it still is
    retry_at: float = 0.0
    failures: int = 0
    failure: str | None = None  # why the machine failed the store (StoreFailed), if it did
    written: int = 0  # the batch events written

    def add(self, batches: list[BatchEvent], drained: Drained | None) -> None:
        self.batches += batches
        if drained is not None:
            self.drained.gpu += drained.gpu
            self.drained.host += drained.host
            self.drained.lanes += drained.lanes
            self.drained.unavailable += drained.unavailable

    def flush(
        self, write: Callable[[list[BatchEvent], Drained], None], *, now: float | None = None
    ) -> bool:
        """Writes the rows (`write` does, in one transaction) if a try is due; returns whether
        the store has been locked for STORE_WAIT_S, and the rows are lost to it."""
        now = time.monotonic() if now is None else now
        if now < self.retry_at:
            return self.lost(now)
        if self.failure is not None:
            return True
        try:
            write(self.batches, self.drained)
        except StoreBusy:
            self.failures += 1
            self.blocked_since = self.blocked_since or now
            self.retry_at = now + min(RETRY_MAX_S, WRITE_WAIT_S * 2**self.failures)
            return self.lost(now)
        except StoreFailed as error:
            self.failure = str(error)
            return True
        self.written += len(self.batches)
        self.batches, self.drained = [], Drained()
        self.blocked_since, self.retry_at, self.failures = None, 0.0, 0
        return False

    def lost(self, now: float) -> bool:
        if self.failure is not None:
            return True
        return self.blocked_since is not None and now - self.blocked_since >= STORE_WAIT_S

    def unfinished(self) -> bool:
        """Whether rows are left that the store did not take: it is locked, or it failed."""
        return self.blocked_since is not None or self.failure is not None

    def lost_reason(self, store: Store) -> str:
        """Why the store is lost to the recording, as a run's reason."""
        if self.failure is not None:
            return f"{self.failure}; stopped there (what was written before is kept)"
        return _locked_reason(store)


def patiently(write: Callable[[], T], since: float | None = None) -> T:
    """`write()`, tried again while the store is locked, until STORE_WAIT_S after `since`
    (default now).

    Raises:
        StoreBusy: the store stayed locked that long.
    """
    deadline = (time.monotonic() if since is None else since) + STORE_WAIT_S
    while True:
        try:
            return write()
        except StoreBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
