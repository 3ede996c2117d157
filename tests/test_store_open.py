"""Opening the store: a mistyped --db creates nothing, read-only media can be read, and another
application's SQLite file is left as it was. (Processes creating one store at once: the two-node
launch of tests/test_distributed.py.)"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from pipelines import InputError
from probe.present.cli import main
from probe.records import RunRecord, RunStatus
from probe.store.db import Store


@pytest.mark.parametrize(
    "argv",
    [["show", "last"], ["runs"], ["report", "last"], ["check", "last", "--max-data-wait", "20%"]],
)
def test_a_mistyped_db_creates_nothing(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "no-such-folder" / "feedscpoe.db"
    assert main([*argv, "--db", str(typo)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: no store at {typo}: nothing was recorded there"
    assert not typo.parent.exists()


def run_record(run_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id, kind="probe", created="2026-01-01T00:00:00Z", status=RunStatus.COMPLETED,
        reason=None, pipeline="torch", consumer="none", label=None, config={}, host={},
        hostname="h", pid=1, started_ns=0, ended_ns=1,
    )  # fmt: skip


def test_a_store_on_read_only_media_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "media" / "store.db"
    with Store(db) as store:
        store.create_run(run_record("r1"), [])
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    # What read-only media answer (root, as tests may run, is refused no permission here)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: mode != os.W_OK and real_access(path, mode)
    )
    with Store(db) as store:
        assert store.read_only and [r.run_id for r in store.runs()] == ["r1"]
        with pytest.raises(InputError, match="is read-only here: it can only be read"):
            store.create_run(run_record("r2"), [])
    assert main(["runs", "--db", str(db)]) == 0
    assert "r1" in capsys.readouterr().out
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_another_applications_sqlite_file_is_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "notes.sqlite"
    with sqlite3.connect(theirs) as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        db.execute("INSERT INTO notes (text) VALUES ('keep me')")
    db.close()
    before = hashlib.sha256(theirs.read_bytes()).hexdigest()
    for argv in (["runs"], ["run", "--gpus", "none", "--batches", "2"]):
        assert main([*argv, "--db", str(theirs)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert "is an SQLite file of another application, not a feedscope store" in line
    assert hashlib.sha256(theirs.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]  # no -wal, no -shm
