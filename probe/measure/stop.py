"""A request to stop a run, with what asked for it: a signal ("stopped by SIGTERM") or another
rank of the job ("stopped for rank 1, which died"). The run's lanes and the run itself are marked
`interrupted` with it."""

from __future__ import annotations

import threading


class Stop(threading.Event):
    """Set to stop the run; `cause` says why (the first cause asked wins)."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: str | None = None

    def ask(self, cause: str) -> None:
        if not self.is_set():
            self.cause = cause
        self.set()


def stop_cause(stop: threading.Event) -> str | None:
    """What asked `stop` to stop the run, where it says (None: not said, or not set)."""
    return stop.cause if isinstance(stop, Stop) and stop.is_set() else None
