"""A torchrun rank's spool: the store it measures its lane into, in a folder beside the node's
store (`<store>.ranks/`), so that what it recorded outlives it.

Its rank holds a lock on it (`flock` on a file of its own: SQLite's locks are the other kind,
and closing a second handle on the database would drop them) from before the spool exists until
it is recorded in the node's store, or sent to rank 0's, and removed. A spool whose lock nobody
holds lost its rank: a surviving rank of its node records it at its end, or else the next
command that opens the store (`adopt`). Its lanes still running then are marked interrupted, with
when they were last heard of.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

from probe.records import LaneRecord, RunRecord, RunStatus
from probe.store.connection import StoreBusy, StoreFailed
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store
from probe.store.merge import export_run, import_run


def died_unseen(run: RunRecord, lane: LaneRecord, last: str) -> str:
    """The reason of a lane whose spool nobody holds, last heard of at `last` (a wall clock
    "HH:MM:SS UTC"): its rank died without a word, as only a signal it cannot catch, or a
    crash, leaves it."""
    return (
        f"rank {lane.lane} died without a word after its last record at {last} (pid "
        f"{run.pid}: SIGKILL, as the OOM killer sends, or a crash; torchrun's summary gives "
        "its exit code)"
    )


def spool_dir(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".ranks")


def spool_path(store_path: Path, run_id: str, rank: int) -> Path:
    return spool_dir(store_path) / f"{run_id}.rank{rank}.db"


@contextmanager
def held(path: Path) -> Iterator[Path]:
    """Holds the spool at `path` for this process (made here: nobody may have it yet) while
    the block runs; the spool is removed after it, unless the block raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(_lock_of(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path
        remove(path)
    finally:
        os.close(lock)


def record(store: Store, path: Path) -> list[int]:
    """Adds what the spool at `path` holds to `store`, lanes still running marked interrupted
    (`died_unseen`); returns the lanes added. The caller holds the spool."""
    with Store(path) as spool:
        (run,) = spool.runs()
        export = export_run(spool, run.run_id)
        lanes = [_ended(spool, run, lane) for lane in export.lanes]
    return import_run(store, replace(export, lanes=lanes))


def remove(path: Path) -> None:
    """Removes a spool: its database, SQLite's journal files, then its lock."""
    for part in (path, *(path.with_name(path.name + end) for end in ("-wal", "-shm", "-journal"))):
        with suppress(FileNotFoundError):
            part.unlink()
    with suppress(FileNotFoundError):
        _lock_of(path).unlink()
    with suppress(OSError):  # left where another spool is still in it
        path.parent.rmdir()


def adopt(store: Store, run_id: str | None = None) -> None:
    """Records in `store`, and removes, the spools beside it (of run `run_id` alone, where given)
    whose rank is gone."""
    folder = spool_dir(store.path)
    if store.read_only or not folder.is_dir():
        return
    for path in sorted(folder.glob(f"{run_id or '*'}.rank*.db")):
        lock = os.open(_lock_of(path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its rank holds it: alive
            if path.exists():  # not recorded and removed by another while this one waited
                record(store, path)
                remove(path)
        finally:
            os.close(lock)


def tidy(store: Store, hostname: str, is_alive: Callable[[int], bool]) -> None:
    """What a command does first with the store: records the spools whose rank died unseen
    (`adopt`), and marks interrupted the runs of this host whose process is gone. Where the
    store is busy or full, it is left for the next command."""
    with suppress(StoreBusy, StoreFailed):
        adopt(store)
    store.mark_abandoned_runs(hostname, is_alive)


def _lock_of(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _ended(store: Store, run: RunRecord, lane: LaneRecord) -> LaneRecord:
    """The lane as recorded, or where it was still running, interrupted, with its figures."""
    if lane.status is not RunStatus.RUNNING:
        return lane
    span = store.time_span(run.run_id)
    last = _wall(run, span[1] if span else run.started_ns)
    figures = lane_figures_from_store(store, run, lane)
    return replace(
        lane,
        status=RunStatus.INTERRUPTED,
        reason=died_unseen(run, lane, last),
        summary=figures.to_json(),
    )


def _wall(run: RunRecord, monotonic_ns: int) -> str:
    """A time of the run's host's monotonic clock on the wall clock, "HH:MM:SS UTC"."""
    clock = run.host.get("clock") or {}
    unix_ns = clock.get("unix_ns", 0) + monotonic_ns - clock.get("monotonic_ns", monotonic_ns)
    return time.strftime("%H:%M:%S UTC", time.gmtime(unix_ns / 1e9))
