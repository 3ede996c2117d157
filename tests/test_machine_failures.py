"""Failures of the machine, made for real: a store's disk that fills up, a store damaged on disk,
a store removed while a doctor session writes it, a lane that stops making progress. Each ends
in one line and exit 1, without a traceback, and loses nothing already recorded."""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from helpers import probe_cli, run_captured
from pipelines import InputError
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.measure import devices


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("machine") / "photos"
    make_sample_dataset(root, SampleParams(count=64, classes=4, seed=7))
    return root


def one_line_error(stderr: str) -> str:
    """The last line, once it is checked that no traceback came before it."""
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), stderr
    return last


def statuses(db: Path) -> list[tuple[str, str, int]]:
    """Each run's id, status and batch rows, read straight from the file."""
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT r.run_id, r.status, (SELECT COUNT(*) FROM batches b WHERE b.run_id = r.run_id)"
            " FROM runs r ORDER BY r.run_id"
        ).fetchall()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 400 KiB tmpfs, where this machine lets the tests mount one."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(folder)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()})")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_its_batches(
    photos: Path, small_disk: Path
) -> None:
    db = small_disk / "store.db"
    result = probe_cli("run", "--data", photos, "--gpus", "none", "--db", db, "--duration", "45",
                       "--batch-size", "4", "--workers", "1", "--image-size", "32",
                       "--sample-hz", "50", timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    # Where the disk filled decides who says so: the run's last write (its one error line), or
    # a write while the lane measured (the lane fails with that reason, the run ends failed).
    [line] = [line for line in result.stderr.splitlines() if "is full" in line]
    assert f"the disk of the store {db} is full" in line
    assert "kept" in line
    # Once there is room again, the run is read back as it ended, its rows kept.
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    listing = probe_cli("runs", "--db", db)
    assert listing.returncode == 0, listing.stderr
    [(_, status, batches)] = statuses(db)
    assert status in ("failed", "interrupted")
    assert batches > 0


WATCHED_LOOP = """
import sys, time
from probe import watch
for n, _ in enumerate(watch(range(6000), db=sys.argv[1], sample_hz=50)):
    time.sleep(0.002)
print("the loop ended after", n + 1, "batches")
"""


def test_a_full_disk_under_watch_warns_once_and_the_loop_goes_on(small_disk: Path) -> None:
    db = small_disk / "store.db"
    loop = run_captured([sys.executable, "-c", WATCHED_LOOP, db], timeout=300)
    assert loop.returncode == 0, loop.stderr
    assert loop.stdout.strip() == "the loop ended after 6000 batches"
    assert "Traceback" not in loop.stderr
    assert loop.stderr.count("recording stopped: the disk of the store") == 1, loop.stderr
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    # Where the disk filled decides whether the run's end could still be written: if not, the
    # run is marked interrupted when the store is next read (its process is gone), as here.
    listing = probe_cli("runs", "--db", db)
    assert listing.returncode == 0, listing.stderr
    [(_, status, batches)] = statuses(db)
    assert status in ("failed", "interrupted") and batches > 0, "what was written is kept"


def test_a_report_to_a_full_disk_fails_in_one_line_and_leaves_no_part_of_it(
    photos: Path, tmp_path: Path, small_disk: Path
) -> None:
    db = tmp_path / "store.db"
    made = probe_cli("run", "--data", photos, "--gpus", "none", "--db", db, "--batches", "8",
                     "--batch-size", "4", "--workers", "0", "--image-size", "32")  # fmt: skip
    assert made.returncode == 0, made.stderr
    (small_disk / "pad").write_bytes(b"\0" * (380 * 1024))
    report = small_disk / "report.html"
    result = probe_cli("report", "last", "--db", db, "-o", report)
    assert result.returncode == 1, result.stderr
    assert one_line_error(result.stderr) == (
        f"error: cannot write {report}: No space left on device"
    )
    assert sorted(p.name for p in small_disk.iterdir()) == ["pad"]


def test_a_damaged_store_is_refused_with_what_can_be_saved(photos: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    made = probe_cli("run", "--data", photos, "--gpus", "none", "--db", db, "--batches", "8",
                     "--batch-size", "4", "--workers", "0", "--image-size", "32")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(db) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page : page * 3] = b"\xa5" * (page * 2)  # the schema's pages: damaged, not truncated
    db.write_bytes(bytes(data))
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for command in (["runs"], ["report", "last", "--format", "md"], ["show", "last"]):
        result = probe_cli(*command, "--db", db)
        assert result.returncode == 1, result.stderr
        line = one_line_error(result.stderr)
        assert f"the store {db} cannot be read" in line
        assert f'`sqlite3 {db} ".recover" | sqlite3 recovered.db`' in line
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before, "a refused store is unchanged"


def test_a_store_removed_during_a_doctor_session_stops_it_at_the_first_lost_write(
    photos: Path, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    doctor = subprocess.Popen(
        [sys.executable, "-m", "probe", "doctor", "--gpus", "none", "--data", photos,
         "--db", db, "--batch-size", "4", "--image-size", "32", "--budget", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and doctor.poll() is None:
        time.sleep(0.2)
        if db.exists() and any(status == "completed" for _, status, _ in _readable(db)):
            break
    for name in ("store.db", "store.db-wal", "store.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    _, stderr = doctor.communicate(timeout=120)
    assert doctor.returncode == 1, stderr
    line = one_line_error(stderr)
    assert f"the store {db} was removed or replaced while in use" in line
    assert "images/s" in stderr, "the points measured before are still shown"
    assert not db.exists(), "nothing writes a new store in its place"


def _readable(db: Path) -> list[tuple[str, str, int]]:
    try:
        return statuses(db)
    except sqlite3.Error:
        return []  # not made yet, or locked a moment


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_lane_stalled_on_a_file_that_never_opens_is_stopped_with_what_it_waited_for(
    photos: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(photos, data)
    os.mkfifo(next(data.iterdir()) / "000_stuck.jpg")  # opening it waits for a writer forever
    db = tmp_path / "store.db"
    started = time.monotonic()
    result = probe_cli("run", "--data", data, "--gpus", "none", "--db", db, "--duration", "10",
                       "--batch-size", "4", "--workers", "2", "--image-size", "32",
                       "--stall-s", "5", timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 90
    assert "Traceback" not in result.stderr
    reason = next(line for line in result.stderr.splitlines() if "failed: stalled" in line)
    assert "no batch and no CPU work for" in reason
    assert "(the bound: 5 s, --stall-s)" in reason
    workers = [int(pid) for pid in re.findall(r"worker (\d+)", reason)]
    assert len(workers) == 2, reason
    time.sleep(1)
    alive = [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, "the stalled lane's workers, the stuck one too, are ended"
    [(_, status, _)] = statuses(db)
    assert status == "failed"
    with sqlite3.connect(db) as connection:
        [(stored,)] = connection.execute("SELECT reason FROM lanes").fetchall()
    assert "stalled" in stored


def test_a_cuda_that_does_not_start_is_named_with_the_address_space_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = (
        "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 2: out of memory"
    )
    monkeypatch.setattr(devices, "_NO_CUDA", [error])
    monkeypatch.setattr(resource, "getrlimit", lambda _: (6 * 2**30, 6 * 2**30))
    with pytest.raises(InputError) as refused:
        devices.select_gpus("0", [])
    text = str(refused.value)
    assert "CUDA did not start (Unexpected error from cudaGetDeviceCount()" in text
    assert "limited to 6.0 GiB (ulimit -v)" in text
    monkeypatch.setattr(devices, "_NO_CUDA", [])
    with pytest.raises(InputError, match="CUDA sees no GPU here"):
        devices.select_gpus("0", [])
