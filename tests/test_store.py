"""The SQLite store: created with its schema, refuses what it cannot use, finds runs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from pipelines import InputError
from probe.records import BatchEvent, HostSample, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.schema import SCHEMA_VERSION


def record(run_id: str, created: str = "2026-11-21T10:00:00Z", pid: int | None = 1) -> RunRecord:
    return RunRecord(
        run_id=run_id, kind="probe", created=created, status=RunStatus.RUNNING, reason=None,
        pipeline="torch", consumer="none", label=None, config={"a": 1}, host={"cpus": 2},
        hostname="here", pid=pid, started_ns=0, ended_ns=None,
    )  # fmt: skip


def lane(run_id: str) -> LaneRecord:
    return LaneRecord(run_id, 0, None, None, 0, 1, "here", None, RunStatus.RUNNING, None, None)


def test_a_new_store_has_the_schema_wal_and_its_version(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "feedscope.db"
    with Store(path) as store:
        store.create_run(record("r1"), [lane("r1")])
        store.add_batches("r1", [BatchEvent(0, 0, 5, 0.1, 0.2, 8, True)])
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION
    assert db.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 1


def test_runs_are_found_by_id_prefix_or_last(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        store.create_run(record("20261121-100000-aaaa", "2026-11-21T10:00:00Z"), [])
        store.create_run(record("20261121-100000-aabb", "2026-11-21T10:00:00Z"), [])
        store.create_run(record("20261121-110000-cccc", "2026-11-21T11:00:00Z"), [])
        assert store.run("20261121-110").run_id == "20261121-110000-cccc"
        assert store.run("last").run_id == "20261121-110000-cccc"
        assert store.run("20261121-100000-aabb").run_id == "20261121-100000-aabb"
        with pytest.raises(InputError, match="matches several runs"):
            store.run("20261121-100000-aa")
        with pytest.raises(InputError, match="no run 'zzz'"):
            store.run("zzz")
        with pytest.raises(InputError, match="no run '2026%'"):  # LIKE wildcards are literal
            store.run("2026%")
        assert store.runs()[0].run_id == "20261121-110000-cccc"


def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my notes, not a database\n" * 100)
    with pytest.raises(InputError, match="not a feedscope store"):
        Store(path)
    assert path.read_bytes() == b"my notes, not a database\n" * 100


def test_a_folder_or_an_unwritable_place_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        Store(tmp_path)
    with pytest.raises(InputError, match=r"cannot use /proc/feedscope/s\.db as the store"):
        Store("/proc/feedscope/s.db")


def test_a_store_from_a_newer_feedscope_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(InputError, match="written by a newer feedscope"):
        Store(path)


def test_runs_whose_process_is_gone_are_marked_interrupted(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        store.create_run(record("gone", pid=111), [lane("gone")])
        store.create_run(record("alive", pid=222), [lane("alive")])
        assert store.mark_abandoned_runs("here", lambda pid: pid == 222) == ["gone"]
        assert store.run("gone").status is RunStatus.INTERRUPTED
        assert store.lanes("gone")[0].status is RunStatus.INTERRUPTED
        assert store.run("alive").status is RunStatus.RUNNING
        assert store.mark_abandoned_runs("elsewhere", lambda pid: False) == []


def test_opening_an_up_to_date_store_takes_no_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        store.create_run(record("r1"), [lane("r1")])
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a probe in the middle of writing
    try:
        with Store(path) as reader:  # would wait out the busy timeout, then fail, if it wrote
            assert [r.run_id for r in reader.runs()] == ["r1"]
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_schema_1_store_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, created TEXT NOT NULL,
            status TEXT NOT NULL, reason TEXT, pipeline TEXT NOT NULL, consumer TEXT NOT NULL,
            label TEXT, config TEXT NOT NULL, host TEXT NOT NULL, hostname TEXT NOT NULL,
            pid INTEGER, started_ns INTEGER NOT NULL, ended_ns INTEGER);
        INSERT INTO runs VALUES ('old-run', 'probe', '2026-11-20T10:00:00Z', 'completed', NULL,
            'torch', 'none', NULL, '{}', '{}', 'here', NULL, 0, 5);
        """
    )
    old.close()
    with Store(path) as store:
        run = store.run("old-run")
        assert run.session_id is None
        assert run.status is RunStatus.COMPLETED
        assert store.sessions() == []
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION


def test_a_schema_4_store_gains_the_synced_column_and_its_batches_read_as_synced(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '4');
        CREATE TABLE batches (run_id TEXT NOT NULL, lane INTEGER NOT NULL, idx INTEGER NOT NULL,
            t_ns INTEGER NOT NULL, wait_s REAL NOT NULL, step_s REAL NOT NULL,
            size INTEGER NOT NULL, warmup INTEGER NOT NULL, epoch INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (run_id, lane, idx)) WITHOUT ROWID;
        INSERT INTO batches VALUES ('old-run', 0, 0, 5, 0.1, 0.2, 8, 0, 3);
        """
    )
    old.close()
    with Store(path) as store:
        assert store.batches("old-run") == [BatchEvent(0, 0, 5, 0.1, 0.2, 8, False, 3, synced=True)]
        store.add_batches("old-run", [BatchEvent(0, 1, 9, 0.1, 0.2, 8, False, 3, synced=False)])
        assert [e.synced for e in store.batches("old-run")] == [True, False]
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 10


def test_a_schema_8_store_gains_the_job_cores_figure_its_old_samples_without_it(
    tmp_path: Path,
) -> None:
    """Samples written before the busy share of the run's own cores was kept read as not
    measured (None), beside later ones that have it."""
    path = tmp_path / "old.db"
    second = 1_000_000_000
    with Store(path) as store:
        store.create_run(record("r1"), [lane("r1")])
        store.add_host_samples("r1", "here", [HostSample(second, 50.0, (50.0, 50.0), 0.0, 0.0,
                                                         None, None, 20.0, 1)])  # fmt: skip
    old = sqlite3.connect(path)
    for statement in (
        "ALTER TABLE host_samples DROP COLUMN job_cpu_pct",
        *(
            f"ALTER TABLE host_rollup DROP COLUMN job_cpu_pct_{c}"
            for c in ("n", "sum", "min", "max")
        ),
        "UPDATE meta SET value = '8' WHERE key = 'schema_version'",
    ):
        old.execute(statement)
    old.commit()
    old.close()
    with Store(path) as store:
        assert store.host_means("r1", "here", 0, 3 * second)["job_cpu_pct"] is None
        store.add_host_samples("r1", "here", [HostSample(2 * second, 50.0, (90.0, 10.0), 0.0, 0.0,
                                                         None, None, 20.0, 1, 90.0)])  # fmt: skip
        means = store.host_means("r1", "here", 0, 3 * second)
        assert means["job_cpu_pct"] == 90.0 and means["cpu_pct"] == 50.0
        assert [s.job_cpu_pct for s in store.host_samples("r1")] == [None, 90.0]


def test_a_schema_9_store_gains_the_tune_sessions_table(tmp_path: Path) -> None:
    recorded = Path(__file__).parent / "benchmarks" / "results" / "2026-11-28-shared-node"
    path = Path(shutil.copy(recorded / "feedscope.db", tmp_path / "old.db"))
    before = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert before == "9"
    with Store(path) as store:
        assert store.tunes() == []
        assert store.runs()  # its runs kept
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 10
