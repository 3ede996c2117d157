"""Probes launched by torchrun: one lane per rank, one run for all of them.

Each rank drives its local GPU (LOCAL_RANK) and reads shard RANK of WORLD_SIZE, as a DDP job does.
It measures its lane into a spool beside its node's store (`probe.store.spool`), which keeps
what it recorded if the rank dies. The ranks watch each other through torchrun's key-value store
(`Peers`): one that fails, is stopped, dies or stops answering stops the others within seconds.
A job that ended whole sends every lane to rank 0 over torch.distributed (gloo, so it also works
without GPUs), which records one run with every lane and host. Otherwise, or with
`gather=False`, each rank adds its lane to its node's store, and the lanes of the node's ranks
that died with it; `probe merge` joins the nodes' stores.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from pipelines import InputError
from probe.measure.samplers.host import pid_alive
from probe.measure.stop import Stop
from probe.records import STOPPED_FOR, LaneRecord, RunStatus, stopped_for_another
from probe.store.db import Store
from probe.store.merge import export_run, import_run
from probe.store.spool import adopt, held, record, spool_path

logger = logging.getLogger(__name__)
GLOO_TIMEOUT = timedelta(minutes=30)  # ranks wait for the slowest at the start
BEAT_S = 1.0  # how often a rank says it lives, and reads how the others are
LOST_S = 10.0  # a rank not ended whose beats stopped this long ago is lost
STORE_WAIT_S = 5.0  # how long a call to torchrun's key-value store may wait


class RanksLost(Exception):
    """The job's other ranks went away where this rank needed them (to start, or to end)."""


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def torchrun_rank() -> Rank | None:
    """This process's rank when torchrun (or another launcher setting its variables) started
    it; None otherwise.

    Raises:
        InputError: the variables are there but make no sense.
    """
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        values = [int(os.environ.get(name, default)) for name, default in zip(
            names, ("0", "1", "0", os.environ.get("WORLD_SIZE", "1")), strict=True
        )]  # fmt: skip
    except ValueError:
        found = ", ".join(f"{n}={os.environ.get(n)!r}" for n in names)
        raise InputError(f"torchrun's variables are not whole numbers: {found}") from None
    rank = Rank(*values)
    if not 0 <= rank.rank < rank.world_size or not 0 <= rank.local_rank < rank.local_world_size:
        raise InputError(
            f"RANK {rank.rank} of WORLD_SIZE {rank.world_size}, LOCAL_RANK {rank.local_rank} of "
            f"LOCAL_WORLD_SIZE {rank.local_world_size}: not a rank of its world"
        )
    return rank


def connect(rank: Rank) -> None:
    """Joins the ranks' gloo group (torchrun's MASTER_ADDR and MASTER_PORT)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=GLOO_TIMEOUT)


def disconnect() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def all_errors(error: str | None) -> list[str | None]:
    """Every rank's error (None: none), on every rank."""
    import torch.distributed as dist

    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return errors


def shared_run_id(rank: Rank, make: Callable[[], str]) -> str:
    """Rank 0's new run id, for every rank."""
    import torch.distributed as dist

    box = [make() if rank.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


@dataclass(frozen=True)
class RankState:
    """A rank as it last published itself, and, where it went silent, why it is taken for lost."""

    rank: int
    host: str
    pid: int
    state: str  # "measuring", then how its lane ended: completed, interrupted or failed
    reason: str | None
    beat: float  # the wall clock of its last beat
    recorded: bool = False  # its lane is in its node's store
    lost: str | None = None  # "died": its process is gone; "stopped answering": its beats did

    @property
    def ended(self) -> bool:
        return self.lost is not None or self.state != "measuring"

    @property
    def knock_on(self) -> bool:
        """It was stopped because another rank went wrong."""
        return self.lost is None and stopped_for_another(self.reason)

    @property
    def gone_wrong(self) -> bool:
        """It ended otherwise than completed, of itself."""
        if self.lost:
            return True
        return self.state in ("failed", "interrupted") and not self.knock_on

    def stopped_for(self) -> str:
        """The reason of a rank this one's going wrong stopped."""
        return f"{STOPPED_FOR}{self.rank}, which {self.what()}"

    def what(self) -> str:
        """What became of it, in words that follow "rank N"."""
        if self.lost:
            return f"{self.lost} (pid {self.pid} on {self.host})"
        if self.state == "failed":
            return f"failed: {self.reason}"
        if self.state == "interrupted":
            return (self.reason or "was stopped").replace("stopped ", "was stopped ", 1)
        return self.state


class Peers:
    """The job's ranks, as each publishes itself in torchrun's key-value store (the TCPStore at
    MASTER_ADDR:MASTER_PORT, which every launcher of the job reaches): its host and pid, how
    its lane is, and a beat every BEAT_S. A rank not ended whose process is gone (on this host),
    or whose beats stopped for LOST_S (on any), is lost. Where the store cannot be reached, the
    other ranks are unknown: none is taken for lost, and none is waited for."""

    def __init__(self, rank: Rank, run_id: str) -> None:
        import torch.distributed as dist

        self.rank, self.prefix = rank, f"feedscope/{run_id}/"
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.since = time.time()
        self._mine: dict[str, Any] = {"state": "measuring", "reason": None, "recorded": False}
        self._lock = threading.Lock()  # one client, used by the beat thread and the rank's own
        try:
            address = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            self._client: Any = dist.TCPStore(*address,  # type: ignore[attr-defined]
                                              is_master=False, wait_for_workers=False,
                                              timeout=timedelta(seconds=STORE_WAIT_S))  # fmt: skip
        except (KeyError, ValueError, RuntimeError) as error:
            logger.warning("the ranks cannot watch each other: %s", error)
            self._client = None
        self.publish()

    def publish(self, **changes: Any) -> None:
        """This rank's beat, with what changed of its state, reason and whether it recorded."""
        self._mine.update(changes)
        mine = {**self._mine, "host": self.host, "pid": self.pid, "beat": time.time()}
        self._call(lambda client: client.set(f"{self.prefix}{self.rank.rank}", json.dumps(mine)))

    def read(self) -> dict[int, RankState]:
        """Every rank's state but this one's (ranks not yet published: measuring, since this
        rank started); empty where the store cannot be reached."""
        keys = [f"{self.prefix}{r}" for r in range(self.rank.world_size) if r != self.rank.rank]

        def fetch(client: Any) -> list[Any]:
            return [client.get(k) if client.check([k]) else None for k in keys]

        values = self._call(fetch)
        if values is None:
            return {}
        now, out = time.time(), {}
        for key, value in zip(keys, values, strict=True):
            rank = int(key.rsplit("/", 1)[1])
            found = json.loads(value) if value is not None else {}
            state = RankState(rank, found.get("host", "?"), found.get("pid", 0),
                              found.get("state", "measuring"), found.get("reason"),
                              found.get("beat", self.since),
                              found.get("recorded", False))  # fmt: skip
            if not state.recorded:  # its lane may be lost with it
                died = "died without a word" if not state.ended else "died before it recorded"
                if state.host == self.host and state.pid and not pid_alive(state.pid):
                    state = replace(state, lost=died)
                elif now - state.beat > LOST_S:
                    silent = f"stopped answering (no beat for {now - state.beat:.0f} s)"
                    state = replace(state, lost=silent)
            out[rank] = state
        return out

    @contextmanager
    def watching(self, stop: Stop) -> Iterator[None]:
        """Beats while the block runs, and stops this rank (`stop`) once another rank went
        wrong: it failed, was stopped of itself, or is lost."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(BEAT_S):
                self.publish()
                if stop.is_set():
                    continue
                for other in self.read().values():
                    if other.gone_wrong:
                        stop.ask(other.stopped_for())
                        break

        thread = threading.Thread(target=watch, name="feedscope-ranks", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def settled(self, done: Callable[[RankState], bool]) -> dict[int, RankState]:
        """The other ranks once each is `done`, or lost (this rank beats meanwhile)."""
        while True:
            states = self.read()
            if all(state.lost or done(state) for state in states.values()):
                return states
            time.sleep(BEAT_S / 2)
            self.publish()

    def _call(self, use: Callable[[Any], Any]) -> Any:
        if self._client is None:
            return None
        with self._lock:
            try:
                return use(self._client)
            except RuntimeError as error:  # the launcher, and its store, went away
                logger.warning("the ranks cannot watch each other any more: %s", error)
                self._client = None
                return None


@dataclass(frozen=True)
class Ending:
    """How a rank's part of the run ended: the run, the other ranks' states, and where its lane
    went: `gathered` (to rank 0's store, with every rank's) or recorded in this node's store,
    with the lanes of this node's lost ranks."""

    run_id: str
    others: dict[int, RankState]
    whole: bool  # every rank completed
    gathered: bool


def run_ranked(
    rank: Rank,
    measure: Callable[[Store, str], Any],
    store: Store,
    run_id: str,
    stop: Stop,
    *,
    gather: bool = True,
) -> Ending:
    """Runs `measure(spool, run_id)`, this rank's lane, into a spool beside `store`
    (`probe.store.spool`) while the ranks watch each other (`Peers`), then records it. Where
    every rank completed (and `gather`), rank 0 records every rank's
    lane in its store; otherwise each rank records its own in its node's store, and the lanes
    of this node's lost ranks with it (`probe merge` joins the nodes' stores).

    Raises:
        InputError: this rank's configuration cannot work (its lane is recorded as failed
            where its run had started).
    """
    peers = Peers(rank, run_id)
    path = spool_path(store.path, run_id, rank.rank)
    failure: InputError | None = None
    with held(path), peers.watching(stop):
        try:
            with Store(path) as spool:
                measure(spool, run_id)
        except InputError as error:
            failure = error
        except Exception as error:  # the others are told, and stop; its spool is kept
            peers.publish(state=RunStatus.FAILED.value, reason=f"{type(error).__name__}: {error}")
            raise
        lane = _own_lane(path, run_id)
        if lane is None:
            peers.publish(state=RunStatus.FAILED.value, reason=str(failure))
        else:
            peers.publish(state=lane.status.value, reason=lane.reason)
        others = peers.settled(lambda other: other.ended)
        completed = RunStatus.COMPLETED.value
        whole = lane is not None and lane.status is RunStatus.COMPLETED
        whole = whole and all(o.state == completed and not o.lost for o in others.values())
        gathered = gather and whole and _gather(rank, path, run_id, store)
        if not gathered:
            if lane is not None:
                peers.publish(reason=_blame(path, run_id, lane, others))
                record(store, path)
            adopt(store, run_id=run_id)  # the spools of this node's ranks that were lost
            peers.publish(recorded=True)  # the node's ranks wait for each other's lanes
            here = peers.host
            others = peers.settled(lambda other: other.host != here or other.recorded)
    if failure is not None:
        raise failure
    return Ending(run_id, others, whole, gathered)


def _own_lane(path: Path, run_id: str) -> LaneRecord | None:
    """This rank's lane as its spool holds it (None: its run never started)."""
    with Store(path) as spool:
        try:
            return spool.lanes(spool.run(run_id).run_id)[0]
        except (InputError, IndexError):
            return None


def _blame(path: Path, run_id: str, lane: LaneRecord, others: dict[int, RankState]) -> str | None:
    """This lane's reason, naming the rank whose death stopped it: torchrun passes a rank's
    death on to the others as a SIGTERM, which may come before this rank saw the death."""
    lost = [o for o in others.values() if o.lost]
    if lane.status is not RunStatus.INTERRUPTED or not lost or stopped_for_another(lane.reason):
        return lane.reason
    reason = lost[0].stopped_for()
    with Store(path) as spool:
        spool.update_lane(run_id, lane.lane, reason=reason)
    return reason


def _gather(rank: Rank, path: Path, run_id: str, store: Store) -> bool:
    """Sends this rank's lane to rank 0, which records every rank's; whether the job got
    through it (a rank that died meanwhile leaves each rank to record its own)."""
    import torch.distributed as dist

    with Store(path) as spool:
        export = export_run(spool, run_id)
    parts: list[Any] = [None] * rank.world_size if rank.rank == 0 else []
    try:
        dist.gather_object(export, parts if rank.rank == 0 else None, dst=0)
        if rank.rank == 0:
            for part in parts:
                import_run(store, part)
        dist.barrier()  # every lane is in rank 0's store: the spools may go
    except RuntimeError as error:
        logger.warning("rank %s: the ranks could not gather (%s): recorded here", rank.rank, error)
        return False
    return True
