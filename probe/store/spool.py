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

from probe.records import STOPPED_FOR, LaneRecord, RunRecord, RunStatus
from probe.store.connection import StoreBusy, StoreFailed
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store
from probe.store.merge import export_run, first_to_end, import_run, settle_run

TIDY_WAIT_S = 0.5  # how long a command's first marks wait for another process's write lock
DIED = "died without a word"
KILLED = "SIGKILL, as the OOM killer sends"  # what ends a probe's rank unseen (it catches SIGTERM)
KILLED_OR_STOPPED = f"{KILLED}, or SIGTERM, as torchrun sends to stop a job"  # a watched rank


def died_unseen(rank: int, pid: int | None, last: str, signals: str = KILLED) -> str:
    """The reason of rank `rank`'s lane whose process `pid` is gone with its lane still running,
    last heard of at `last` (a wall clock "HH:MM:SS UTC"): its rank died without a word, as only
    a crash, or a signal it does not catch (`signals`: a probe catches SIGTERM, a watched
    script need not), leaves it."""
    return (
        f"rank {rank} {DIED} after its last record at {last} (pid {pid}: {signals}, or a crash; "
        "torchrun's summary gives its exit code)"
    )


def died(lane: LaneRecord) -> bool:
    """Whether a lane was marked so: its rank died without a word (`died_unseen`)."""
    return lane.status is RunStatus.INTERRUPTED and (lane.reason or "").startswith(
        f"rank {lane.lane} {DIED}"
    )


def stopped_for(cause: LaneRecord, reason: str | None) -> str:
    """The reason of a lane that ended after rank `cause.lane` went wrong: what became of that
    rank after STOPPED_FOR, then `reason`, what this lane saw of it (a collective's lost
    connection), so that the run's reason (`settle_run`) gives that rank's, not this one's."""
    if died(cause):
        what = f"it {DIED}"
    else:
        what = "it failed" if cause.status is RunStatus.FAILED else "it was interrupted"
    return f"{STOPPED_FOR}{cause.lane} ({what})" + (f": {reason}" if reason else "")


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


def mark_dead_ranks(
    store: Store, hostname: str, is_alive: Callable[[int], bool], run_id: str | None = None
) -> list[LaneRecord]:
    """Marks interrupted the lanes still running of this host's ranks of a watched job whose
    process is gone (of run `run_id` alone, where given), with their figures, and settles each
    such run that has no lane running any more (`settle_run`); returns the lanes marked.

    Each rank writes its own lane, so a rank killed (SIGKILL, as the OOM killer sends) leaves
    its lane running, while the others may wait for it in a collective. The run names the rank
    that went wrong first: a lane of it that already ended failed or interrupted of itself
    (`first_to_end`), else, of those found dead now, the one last heard of first, which "died
    without a word" (`died_unseen`). The others found dead were stopped for it (`stopped_for`),
    as torchrun stops a job's other ranks (SIGTERM) once one ended.

    Raises:
        StoreBusy: another process held the write lock longer than this store waits.
        StoreFailed: the store's file failed.
    """
    if store.read_only:
        return []  # a store on read-only media: nobody is running there
    marked = []
    for run in store.running_ranked_runs(run_id):
        lanes = store.lanes(run.run_id)
        dead = [
            x
            for x in lanes
            if x.status is RunStatus.RUNNING
            and x.hostname == hostname
            and x.pid is not None
            and not is_alive(x.pid)
        ]
        last = {x.lane: _last_record(store, run, x) for x in dead}
        cause = first_to_end(lanes)
        for lane in sorted(dead, key=lambda x: (last[x.lane], x.lane)):
            at = _wall(run, last[lane.lane])
            if cause is None:
                reason = died_unseen(lane.lane, lane.pid, at, KILLED_OR_STOPPED)
            else:
                reason = stopped_for(cause, f"its process ended too, unrecorded, after its last "
                                     f"record at {at} (pid {lane.pid}: torchrun's SIGTERM, or "
                                     "a crash)")  # fmt: skip
            figures = lane_figures_from_store(store, run, lane)
            ended = replace(lane, status=RunStatus.INTERRUPTED, reason=reason,
                            summary=figures.to_json())  # fmt: skip
            if store.update_lane(run.run_id, lane.lane, if_running=True, status=ended.status,
                                 reason=reason, summary=figures):  # fmt: skip
                marked.append(ended)
            cause = cause or ended
        if lanes and all(x.status is not RunStatus.RUNNING for x in store.lanes(run.run_id)):
            settle_run(store, run.run_id)
    return marked


def tidy(store: Store, hostname: str, is_alive: Callable[[int], bool]) -> None:
    """What a command does first with the store: records the spools whose rank died unseen
    (`adopt`), marks the lanes of this host's watched ranks whose process is gone
    (`mark_dead_ranks`), and marks interrupted the other runs of this host whose process is
    gone. Where the store is busy or full, it is left for the next command."""
    with suppress(StoreBusy, StoreFailed):
        adopt(store)
    store.busy_timeout(TIDY_WAIT_S)  # a reader does not wait on another writer for these
    try:
        with suppress(StoreBusy, StoreFailed):  # the next command marks them
            mark_dead_ranks(store, hostname, is_alive)
        store.mark_abandoned_runs(hostname, is_alive)
    finally:
        store.busy_timeout()


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
        reason=died_unseen(lane.lane, run.pid, last),  # the spool's run is its rank's process
        summary=figures.to_json(),
    )


def _last_record(store: Store, run: RunRecord, lane: LaneRecord) -> int:
    """When a lane was last heard of (monotonic ns): its own last record, else the run's."""
    span = store.time_span(run.run_id)
    return store.lane_last_ns(run.run_id, lane.lane) or (span[1] if span else run.started_ns)


def _wall(run: RunRecord, monotonic_ns: int) -> str:
    """A time of the run's host's monotonic clock on the wall clock, "HH:MM:SS UTC"."""
    clock = run.host.get("clock") or {}
    unix_ns = clock.get("unix_ns", 0) + monotonic_ns - clock.get("monotonic_ns", monotonic_ns)
    return time.strftime("%H:%M:%S UTC", time.gmtime(unix_ns / 1e9))
