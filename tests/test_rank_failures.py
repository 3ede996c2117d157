"""A torchrun probe whose ranks do not all end well: one killed, the job stopped by its launcher,
one stalled. Each ends within seconds of the fault, in one line that names each rank's end, with
every lane's samples in the store and nothing left in the temporary folder."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import probe_cli, stop_group
from pipelines import discover
from pipelines.dataset import read_order, shard
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.records import LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.spool import spool_dir, spool_path

WITHIN_S = 30.0  # from the fault to the launcher's end


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=3))
    return root


@contextmanager
def torchrun(
    tmp_path: Path, data: Path, ranks: int, *flags: str
) -> Iterator[subprocess.Popen[str]]:
    """`torchrun -m probe run` on the CPU with `ranks` ranks, its temporary folder its own
    (tmp_path/tmp); stopped with everything it started if the test ends first."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={ranks}", "-m", "probe", "run", "--gpus", "none", "--data", str(data),
        "--batch-size", "4", "--workers", "1", "--image-size", "32", "--sample-hz", "5",
        "--db", str(tmp_path / "store.db"), *flags,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            stop_group(process)


def measuring(db: Path, ranks: int, batches: int, timeout: float = 240) -> list[int]:
    """Once every rank's spool holds `batches` batches: the ranks' process ids."""
    folder, deadline = spool_dir(db), time.monotonic() + timeout
    while time.monotonic() < deadline:
        spools = sorted(folder.glob("*.rank*.db")) if folder.is_dir() else []
        if len(spools) == ranks:
            try:
                found = [_spool(path) for path in spools]
            except (sqlite3.Error, ValueError):  # not written yet: its tables, or its run's row
                found = []
            if found and all(count >= batches for _, count in found):
                return [pid for pid, _ in found]
        time.sleep(0.5)
    raise AssertionError(f"the ranks did not measure {batches} batches each in {timeout:.0f} s")


def _spool(path: Path) -> tuple[int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as spool:
        [(pid,)] = spool.execute("SELECT pid FROM runs").fetchall()
        [(count,)] = spool.execute("SELECT COUNT(*) FROM batches").fetchall()
    return int(pid), int(count)


def ended(process: subprocess.Popen[str], fault_at: float) -> tuple[str, float]:
    """The launcher's stderr, and how long after the fault it ended."""
    _, stderr = process.communicate(timeout=120)
    return stderr, time.monotonic() - fault_at


def our_line(stderr: str) -> str:
    """The one line the ranks end with (the launcher's own summary aside), and no traceback of
    ours."""
    assert "/probe/" not in stderr and "[rank" not in stderr, stderr
    [line] = [x for x in stderr.splitlines() if x.startswith("run ")]
    return line


def recorded(db: Path) -> tuple[RunRecord, dict[int, LaneRecord], dict[int, int]]:
    """The one run, its lanes, and how many batches each lane recorded."""
    with Store(db) as store:
        (run,) = store.runs()
        lanes = {lane.lane: lane for lane in store.lanes(run.run_id)}
        counts = {lane: len(store.batches(run.run_id, lane)) for lane in lanes}
    return run, lanes, counts


def nothing_left(tmp_path: Path) -> None:
    """No spool beside the store, nothing in the temporary folder but the launcher's own log
    folder (torchelastic_*, which torchrun leaves on every run)."""
    assert not spool_dir(tmp_path / "store.db").exists()
    left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchelastic_")]
    assert left == []


def test_a_rank_killed_mid_run_loses_no_lane(photos: Path, tmp_path: Path) -> None:
    """SIGKILL (as the OOM killer sends) to rank 1 of 3: the others stop within seconds, and the
    run keeps all three lanes, rank 1's to its death, naming it."""
    db = tmp_path / "store.db"
    with torchrun(tmp_path, photos, 3, "--duration", "120") as job:
        pids = measuring(db, 3, batches=10)
        os.kill(pids[1], signal.SIGKILL)
        stderr, took = ended(job, time.monotonic())
    assert job.returncode != 0 and took < WITHIN_S
    line = our_line(stderr)
    assert f"interrupted: rank 1 died without a word (pid {pids[1]}" in line
    assert "rank 0 was stopped for rank 1" in line and "rank 2 was stopped for rank 1" in line
    run, lanes, counts = recorded(db)
    assert run.status is RunStatus.INTERRUPTED
    assert run.reason is not None and run.reason.startswith("lane 1: rank 1 died without a word")
    assert "after its last record at" in run.reason
    assert sorted(lanes) == [0, 1, 2] and all(counts[lane] >= 10 for lane in lanes)
    assert all(lane.status is RunStatus.INTERRUPTED for lane in lanes.values())
    assert lanes[0].reason is not None and lanes[0].reason.startswith("stopped for rank 1")
    assert all(lane.summary is not None for lane in lanes.values())
    nothing_left(tmp_path)


def test_a_job_stopped_by_its_launcher_is_interrupted_not_failed(
    photos: Path, tmp_path: Path
) -> None:
    """SIGTERM to torchrun, as a scheduler preempting the job sends: every rank's DataLoader
    workers die with it, and the run is `interrupted` by SIGTERM, not failed on a worker."""
    db = tmp_path / "store.db"
    with torchrun(tmp_path, photos, 2, "--duration", "120") as job:
        measuring(db, 2, batches=10)
        job.send_signal(signal.SIGTERM)
        stderr, took = ended(job, time.monotonic())
    assert job.returncode != 0 and took < WITHIN_S
    line = our_line(stderr)
    assert "interrupted: rank 0 was stopped by SIGTERM; rank 1 was stopped by SIGTERM" in line
    run, lanes, counts = recorded(db)
    assert run.status is RunStatus.INTERRUPTED and run.reason is not None
    assert run.reason.endswith("stopped by SIGTERM"), run.reason
    assert [lane.reason for lane in lanes.values()] == ["stopped by SIGTERM"] * 2
    assert all(lane.traceback is None for lane in lanes.values())
    assert all(count >= 10 for count in counts.values())
    nothing_left(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_rank_stalled_on_a_file_is_named_and_the_others_stopped(
    photos: Path, tmp_path: Path
) -> None:
    """A FIFO among rank 1's images: opening it waits forever. Rank 1's stall rule names it,
    and rank 0 stops for it rather than measuring on, or waiting at the end."""
    data = tmp_path / "data"
    shutil.copytree(photos, data)
    stuck = _fifo_in_shard(data, 1, 2)
    db = tmp_path / "store.db"
    with torchrun(tmp_path, data, 2, "--duration", "120", "--stall-s", "5") as job:
        writer = _opened(stuck, job)  # from here rank 1 waits for bytes that never come
        try:
            stderr, took = ended(job, time.monotonic())
        finally:
            os.close(writer)
    assert job.returncode == 1 and took < WITHIN_S
    line = our_line(stderr)
    assert "failed: rank 1 failed: stalled: no batch and no CPU work for" in line
    assert "rank 0 was stopped for rank 1" in line and "lanes 0, 1 recorded" in line
    run, lanes, counts = recorded(db)
    assert run.status is RunStatus.FAILED
    assert lanes[1].status is RunStatus.FAILED and "stalled" in (lanes[1].reason or "")
    assert lanes[0].status is RunStatus.INTERRUPTED and counts[0] > 0
    nothing_left(tmp_path)


def _opened(fifo: Path, job: subprocess.Popen[str], timeout: float = 240) -> int:
    """The moment a rank opens `fifo` to read it: a writer's end of it, held open (never
    written) so that the reader waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it yet
            time.sleep(0.05)
    raise AssertionError(f"no rank opened {fifo}")


def _fifo_in_shard(root: Path, rank: int, ranks: int) -> Path:
    """A FIFO named like an image, where `rank` of `ranks` reads it (shard of the shuffled
    order, as the probe reads it)."""
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        path = folder / "stuck.jpg"  # where it falls moves with its folder
        os.mkfifo(path)
        files = shard(read_order(discover(root), shuffle=True, seed=0), rank, ranks).files
        if any(Path(str(f)).name == path.name for f in files):
            return path
        path.unlink()
    raise AssertionError("no FIFO name fell in the shard")


def test_a_spool_whose_rank_died_unseen_is_recorded_by_the_next_command(tmp_path: Path) -> None:
    """A rank killed with nobody of its node left to record it: `probe runs` records its
    spool, the lane interrupted with when it was last heard of."""
    db = tmp_path / "store.db"
    Store(db).close()
    run = RunRecord(
        run_id="20261127-000000-dead", kind="probe", created="2026-11-27T00:00:00Z",
        status=RunStatus.RUNNING, reason=None, pipeline="torch", consumer="none", label=None,
        config={"world_size": 2, "lanes": [{"lane": 1}]}, host={}, hostname="node-b",
        pid=4242, started_ns=0, ended_ns=None,
    )  # fmt: skip
    lane = LaneRecord(run.run_id, 1, None, None, 1, 2, "node-b", 4243, RunStatus.RUNNING,
                      None, None)  # fmt: skip
    path = spool_path(db, run.run_id, 1)
    path.parent.mkdir()
    with Store(path) as spool:
        spool.create_run(run, [lane])
    listing = probe_cli("runs", "--db", db)
    assert listing.returncode == 0, listing.stderr
    _, lanes, _ = recorded(db)
    assert lanes[1].status is RunStatus.INTERRUPTED
    assert (lanes[1].reason or "").startswith("rank 1 died without a word after its last record")
    assert "(pid 4242:" in (lanes[1].reason or "")
    assert not spool_dir(db).exists()
