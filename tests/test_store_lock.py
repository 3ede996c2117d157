"""Another process holds the store's write lock for longer than a write waits (10 s): the run
goes on and keeps every row, or, locked past what it allows, stops `failed` naming the lock;
the command never hangs nor prints a traceback. `watch` keeps the user's loop running."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.store.connection import BUSY_TIMEOUT_S

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lock") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=3))
    return root


def started(db: Path, timeout: float = 120) -> None:
    """Waits until a run is recorded and measuring (it has batches)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as reader:
                    if reader.execute("SELECT COUNT(*) FROM batches").fetchone()[0]:
                        return
            except sqlite3.OperationalError:
                pass
        time.sleep(0.2)
    raise AssertionError("the run never started measuring")


def hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def probe(photos: Path, db: Path, duration: float, wait_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "probe", "run", "--gpus", "none", "--data", str(photos),
         "--db", str(db), "--duration", str(duration), "--batch-size", "8", "--workers", "1",
         "--consumer", "sleep:20", "--sample-hz", "10"],
        env={**os.environ, "FEEDSCOPE_STORE_WAIT_S": str(wait_s)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def rows(db: Path) -> tuple[str, str | None, int, int]:
    """The run's status and reason, its batch rows, and the rows its lane numbered."""
    with sqlite3.connect(db) as reader:
        status, reason = reader.execute("SELECT status, reason FROM runs").fetchone()
        count, numbered = reader.execute("SELECT COUNT(*), MAX(idx) + 1 FROM batches").fetchone()
    return status, reason, count, numbered


def test_a_lock_held_longer_than_a_write_waits_loses_nothing(photos: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    run = probe(photos, db, duration=10, wait_s=60)
    started(db)
    holder = hold_lock(db, BUSY_TIMEOUT_S + 2)  # longer than any write would wait
    _, stderr = run.communicate(timeout=300)
    holder.wait(timeout=60)
    assert run.returncode == 0, stderr
    assert "Traceback" not in stderr
    status, reason, count, numbered = rows(db)
    assert (status, reason) == ("completed", None)
    assert count == numbered > 0  # every batch the lane numbered is stored


def test_a_store_locked_past_the_bound_fails_the_run_naming_the_lock(
    photos: Path, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    run = probe(photos, db, duration=60, wait_s=3)
    started(db)
    holder = hold_lock(db, 6)  # lost after 3 s; released while the run ends
    _, stderr = run.communicate(timeout=120)
    holder.wait(timeout=60)
    assert "Traceback" not in stderr
    assert run.returncode == 1, stderr
    status, reason, count, numbered = rows(db)
    assert status == "failed"
    assert reason is not None and "locked by another process" in reason
    assert count == numbered > 0  # what it measured before is kept, all of it


def test_a_store_locked_to_the_end_ends_in_one_line(photos: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    run = probe(photos, db, duration=60, wait_s=2)
    started(db)
    holder = hold_lock(db, 40)
    try:
        _, stderr = run.communicate(timeout=35)  # never hangs: well before the lock goes
    finally:
        holder.kill()
    assert run.returncode == 1
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "locked by another process" in errors[0], stderr
    listing = subprocess.run(
        [sys.executable, "-m", "probe", "runs", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    [run_row] = json.loads(listing.stdout)
    assert run_row["status"] == "interrupted"  # its process is gone: not shown as running


WATCHED = """
import sys, time
from probe import watch
count = 0
for item in watch(range(int(sys.argv[2])), name="locked", db=sys.argv[1]):
    time.sleep(0.02)
    count += 1
print(count, flush=True)
"""


def test_watch_keeps_every_row_through_a_lock_and_the_loop_runs_on(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    loop = subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(db), "800"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started(db)
    holder = hold_lock(db, BUSY_TIMEOUT_S + 2)
    stdout, stderr = loop.communicate(timeout=300)
    holder.wait(timeout=60)
    assert loop.returncode == 0, stderr
    assert stdout.strip() == "800"
    assert "Traceback" not in stderr and "recording stopped" not in stderr
    status, _, count, numbered = rows(db)
    assert status == "completed"
    assert count == numbered == 800
