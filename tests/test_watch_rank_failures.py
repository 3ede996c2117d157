"""A watched DDP job (`probe watch` or `watch()` under torchrun) whose rank dies: each rank writes
its own lane, so the dead rank's lane is marked by the others' writers within seconds, or by the
next command that reads the store; the run names the rank that died first, and the others'
lanes say they stopped for it."""

from __future__ import annotations

import calendar
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from helpers import free_port, probe_cli, stop_group
from probe.measure import recording
from probe.measure.recording import Recording
from probe.records import BatchEvent, LaneCpuSample, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.spool import mark_dead_ranks, tidy

ROOT = Path(__file__).resolve().parents[1]
RUN = "20261128-watch-0000dead"
EIGHT_AM_NS = calendar.timegm((2026, 11, 28, 8, 0, 0)) * 10**9  # the wall clock at monotonic 0
S = 10**9


def watched_run(store: Store, pids: dict[int, int], world: int = 2, kind: str = "watch") -> None:
    """A running run (watched, unless `kind`) of `world` ranks on host "here", a lane per rank
    in `pids` (lane: pid), rank 0's pid the run's; its monotonic clock reads 0 at 08:00 UTC."""
    run = RunRecord(
        run_id=RUN, kind=kind, created="2026-11-28T08:00:00Z", status=RunStatus.RUNNING,
        reason=None, pipeline="torch", consumer="your training step", label="ddp.py",
        config={"world_size": world, "read": "epochs", "warmup": 0,
                "lanes": [{"lane": lane} for lane in pids]},
        host={"clock": {"monotonic_ns": 0, "unix_ns": EIGHT_AM_NS}}, hostname="here",
        pid=pids[min(pids)], started_ns=0, ended_ns=None,
    )  # fmt: skip
    store.create_run(run, [lane_of(lane, pid) for lane, pid in pids.items()])


def lane_of(lane: int, pid: int) -> LaneRecord:
    return LaneRecord(RUN, lane, None, None, lane, 2, "here", pid, RunStatus.RUNNING, None, None)


def batches(store: Store, lane: int, until_s: int) -> None:
    """One batch a second for the lane, the last ending at `until_s` (08:00:`until_s` UTC)."""
    store.add_batches(RUN, [
        BatchEvent(lane, i, (i + 1) * S - S // 10, 0.01, 0.09, 4, False) for i in range(until_s)
    ])  # fmt: skip


def alive(*pids: int) -> Callable[[int], bool]:
    return lambda pid: pid in pids


def lanes(store: Store) -> dict[int, LaneRecord]:
    return {lane.lane: lane for lane in store.lanes(RUN)}


def test_a_dead_rank_is_marked_with_its_last_record_while_the_others_run(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        watched_run(store, {0: 100, 1: 101})
        batches(store, 0, 9)
        batches(store, 1, 5)
        (marked,) = mark_dead_ranks(store, "here", alive(100))
        assert marked.lane == 1 and marked.status is RunStatus.INTERRUPTED
        found = lanes(store)
        assert found[1].reason == (
            "rank 1 died without a word after its last record at 08:00:05 UTC (pid 101: SIGKILL, "
            "as the OOM killer sends, or SIGTERM, as torchrun sends to stop a job, or a crash; "
            "torchrun's summary gives its exit code)"
        )
        assert found[1].summary is not None and found[1].summary["batches"] == 5
        assert found[0].status is RunStatus.RUNNING  # alive: its own writer ends it
        assert store.run(RUN).status is RunStatus.RUNNING
        assert mark_dead_ranks(store, "here", alive(100)) == []  # marked once


def test_the_rank_that_died_first_is_named_and_the_others_stopped_for_it(tmp_path: Path) -> None:
    """Both ranks found dead at once (torchrun's SIGTERM ended rank 0 before it wrote its
    lane): the one last heard of first died; rank 0, heard of later (a CPU sample after its
    last batch), stopped for it, whatever the order of their lanes."""
    with Store(tmp_path / "s.db") as store:
        watched_run(store, {0: 100, 1: 101})
        batches(store, 0, 5)
        batches(store, 1, 5)
        store.add_lane_cpu(RUN, [LaneCpuSample(7 * S, 0, 50.0, 50.0, 40.0, 1, 4)])
        store.add_lane_cpu(RUN, [LaneCpuSample(4 * S, 1, 50.0, 50.0, 40.0, 1, 4)])
        marked = mark_dead_ranks(store, "here", alive())
        assert [lane.lane for lane in marked] == [1, 0]
        found, run = lanes(store), store.run(RUN)
    assert (found[0].reason or "").startswith(
        "stopped for rank 1 (it died without a word): its process ended too, unrecorded, after "
        "its last record at 08:00:07 UTC (pid 100: torchrun's SIGTERM, or a crash)"
    )
    assert run.status is RunStatus.INTERRUPTED and run.ended_ns is not None
    assert run.reason == f"lane 1: {found[1].reason}"
    assert "08:00:05 UTC (pid 101: SIGKILL" in run.reason


def test_a_rank_found_dead_later_is_stopped_for_the_one_that_ended_first(tmp_path: Path) -> None:
    """A rank already known dead, or one that ended of itself (its script failed), is what the
    others found dead afterwards stopped for, even where their last record is earlier."""
    for first, first_reason, what in (
        ("dead", None, "it died without a word"),
        ("failed", "the script failed: ValueError: bad batch", "it was interrupted"),
    ):
        with Store(tmp_path / f"{first}.db") as store:
            watched_run(store, {0: 100, 1: 101})
            batches(store, 0, 3)
            batches(store, 1, 6)
            if first_reason is None:
                mark_dead_ranks(store, "here", alive(100))
            else:
                store.update_lane(RUN, 1, status=RunStatus.INTERRUPTED, reason=first_reason)
            (marked,) = mark_dead_ranks(store, "here", alive())
            run = store.run(RUN)
        assert marked.lane == 0
        assert (marked.reason or "").startswith(f"stopped for rank 1 ({what}): its process ended")
        assert (run.reason or "").startswith("lane 1: " + (first_reason or "rank 1 died"))


def test_a_single_process_and_a_probe_keep_their_reason(tmp_path: Path) -> None:
    """A watched run of one process, and a probe, whose lanes are its own child processes
    (which it ends itself), are the run's process's to end (`mark_abandoned_runs`)."""
    for kind, world, pids in (("watch", 1, {0: 100}), ("probe", 2, {0: 100, 1: 101})):
        with Store(tmp_path / f"{kind}.db") as store:
            watched_run(store, pids, world=world, kind=kind)
            assert mark_dead_ranks(store, "here", alive()) == []
            tidy(store, "here", alive())
            run = store.run(RUN)
        assert run.status is RunStatus.INTERRUPTED
        assert run.reason == "the probe process ended without finishing the run (killed?)"


def test_rank_0_dead_leaves_the_living_ranks_and_other_hosts_running(tmp_path: Path) -> None:
    """Rank 0's process is the run's: where it died, the run goes on with rank 1 (alive, or on
    another host, which judges its own ranks)."""
    for where in ("here", "there"):
        with Store(tmp_path / f"{where}.db") as store:
            watched_run(store, {0: 100, 1: 101})
            with store.transaction() as db:
                db.execute("UPDATE lanes SET hostname = ? WHERE lane = 1", (where,))
            tidy(store, "here", alive(101))
            found = lanes(store)
            assert store.run(RUN).status is RunStatus.RUNNING
            assert found[1].status is RunStatus.RUNNING
            assert (found[0].reason or "").startswith("rank 0 died without a word")


def test_a_busy_store_is_marked_by_the_next_command(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        watched_run(store, {0: 100, 1: 101})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing
    try:
        with Store(path) as store:
            tidy(store, "here", alive(100))
            assert lanes(store)[1].status is RunStatus.RUNNING
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Store(path) as store:
        tidy(store, "here", alive(100))
        assert lanes(store)[1].status is RunStatus.INTERRUPTED


def test_a_survivor_ending_after_a_rank_died_says_it_stopped_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's collective lost its connection to rank 1, killed: its lane's reason names rank 1
    first, so that the run's does; rank 1's lane is marked on the way."""
    monkeypatch.setattr(recording, "pid_alive", alive(100))
    monkeypatch.setattr(recording, "DYING_S", 0.05)
    lost = "the script failed: RuntimeError: Connection reset by peer"
    with Store(tmp_path / "s.db") as store:
        watched_run(store, {0: 100, 1: 101})
        batches(store, 1, 5)
        rank0 = Recording(store.path, store.run(RUN), 0, 0, None)
        assert rank0._blamed(store, RunStatus.COMPLETED, None) is None
        assert rank0._blamed(store, RunStatus.INTERRUPTED, lost) == (
            f"stopped for rank 1 (it died without a word): {lost}"
        )
        assert (lanes(store)[1].reason or "").startswith("rank 1 died without a word")
        monkeypatch.setattr(recording, "pid_alive", alive(100, 101))
        store.update_lane(RUN, 1, status=RunStatus.INTERRUPTED, reason="interrupted (Ctrl-C)")
        assert rank0._blamed(store, RunStatus.INTERRUPTED, lost) == lost  # not a death


# -- under torchrun ----------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    folder, rank = Path(sys.argv[1]), int(os.environ["RANK"])
    if rank == 0:  # it outlives torchrun's stop, until the test lets it go on
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo")
    (folder / f"rank{rank}.pid").write_text(str(os.getpid()))
    for _ in range(20):
        for (batch,) in DataLoader(TensorDataset(torch.zeros(4000, 3)), batch_size=4):
            time.sleep(0.01)
            while rank == 0 and (folder / "hold").exists() and not (folder / "go").exists():
                (folder / "holding").touch()
                time.sleep(0.05)
            dist.all_reduce(torch.ones(1))
""")
WITHIN_S = 30.0  # from the kill to rank 1's lane marked


def test_a_rank_killed_under_torchrun_is_marked_by_the_rank_that_waits_for_it(
    tmp_path: Path,
) -> None:
    """Two CPU ranks watched under torchrun; rank 0 holds outside any collective (and ignores
    SIGTERM: a rank its launcher has not stopped yet) when rank 1 is killed. Rank 0's writer
    marks rank 1's lane while rank 0 lives; let go, rank 0's all_reduce fails and its lane
    says it stopped for rank 1; the run is interrupted, naming rank 1's death."""
    (tmp_path / "tmp").mkdir()
    script, db = tmp_path / "ddp.py", tmp_path / "store.db"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp"),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--master-port", str(free_port()), "-m", "probe", "watch", "--db", str(db),
        "--sample-hz", "5", "--", str(script), str(tmp_path),
    ]  # fmt: skip
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, start_new_session=True)  # fmt: skip
    try:
        pid = recorded_pid(tmp_path, db, job)
        (tmp_path / "hold").touch()
        waited_for(tmp_path / "holding", job)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        reason = marked(db, 1, killed + WITHIN_S)
        took = time.monotonic() - killed
        (tmp_path / "go").touch()
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            stop_group(job)
    assert reason.startswith("rank 1 died without a word after its last record at"), reason
    assert f"(pid {pid}: SIGKILL" in reason and took < WITHIN_S
    assert job.returncode != 0
    listing = probe_cli("runs", "--db", db, "--json")  # reads the store as any command does
    assert listing.returncode == 0, listing.stderr
    shown = probe_cli("show", "last", "--db", db, "--json")
    assert shown.returncode == 0, shown.stderr
    with Store(db) as store:
        (run,) = store.runs()
        found = {lane.lane: lane for lane in store.lanes(run.run_id)}
    assert run.status is RunStatus.INTERRUPTED, stderr[-2000:]
    assert run.reason == f"lane 1: {reason}"
    assert found[0].status is RunStatus.INTERRUPTED
    assert (found[0].reason or "").startswith(
        "stopped for rank 1 (it died without a word): the script failed: RuntimeError:"
    )


def recorded_pid(folder: Path, db: Path, job: subprocess.Popen[str], timeout: float = 45) -> int:
    """Rank 1's pid, once rank 1 has recorded some batches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        pid_file = folder / "rank1.pid"
        if pid_file.exists() and db.exists():
            try:
                with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as store:
                    query = "SELECT COUNT(*) FROM batches WHERE lane = 1"
                    (count,) = store.execute(query).fetchone()
            except sqlite3.Error:  # not written yet
                count = 0
            if count >= 20:
                return int(pid_file.read_text())
        time.sleep(0.2)
    raise AssertionError(f"rank 1 recorded no 20 batches in {timeout:.0f} s: {job.poll()}")


def waited_for(path: Path, job: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline and job.poll() is None, f"no {path.name}"
        time.sleep(0.1)


def marked(db: Path, lane: int, deadline: float) -> str:
    """The lane's reason, once it is no longer running (read only: no command tidies here)."""
    while time.monotonic() < deadline:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as store:
            row = store.execute(
                "SELECT status, reason FROM lanes WHERE lane = ?", (lane,)
            ).fetchone()
        if row is not None and row[0] != RunStatus.RUNNING.value:
            return str(row[1])
        time.sleep(0.1)
    raise AssertionError(f"lane {lane} still running {WITHIN_S:.0f} s after its rank was killed")
