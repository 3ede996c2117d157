"""The store's tables and how records map to their rows: the schema (its version in the `meta`
table, and the steps that bring an older store up to date) and the record <-> row conversions.
The GPU samples' columns are the metric layer's GPU metrics; the rollups' tables are written
out by `probe.store.rollups`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from probe.metrics import GPU_COLUMNS, GPU_METRICS
from probe.records import (
    HostSample,
    LaneRecord,
    LaunchRecord,
    RunRecord,
    RunStatus,
    SessionRecord,
    TuneRecord,
)
from probe.store import rollups

SCHEMA_VERSION = 10

BATCH_COLUMNS = (
    "run_id", "lane", "idx", "t_ns", "wait_s", "step_s", "size", "warmup", "epoch", "synced"
)  # fmt: skip
GPU_TABLE_COLUMNS = ("run_id", "gpu_uuid", "t_ns", *GPU_COLUMNS)
HOST_COLUMNS = (
    "run_id", "hostname", "t_ns", "cpu_pct", "per_core", "iowait_pct", "steal_pct",
    "disk_read_mib_s", "memory_used_mib", "tree_cpu_pct", "tree_processes", "job_cpu_pct",
)  # fmt: skip
LANE_CPU_COLUMNS = (
    "run_id", "lane", "t_ns", "cpu_pct", "main_cpu_pct", "main_thread_cpu_pct", "processes",
    "threads", "pss_mib", "worker_threads",
)  # fmt: skip

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    created TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    pipeline TEXT NOT NULL,
    consumer TEXT NOT NULL,
    label TEXT,
    config TEXT NOT NULL,
    host TEXT NOT NULL,
    hostname TEXT NOT NULL,
    pid INTEGER,
    started_ns INTEGER NOT NULL,
    ended_ns INTEGER,
    session_id TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    created TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    hostname TEXT NOT NULL,
    pid INTEGER,
    document TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tunes (
    tune_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    created TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    document TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS launches (
    launch_id TEXT PRIMARY KEY,
    command TEXT NOT NULL,
    argv TEXT NOT NULL,
    devices TEXT NOT NULL,
    created TEXT NOT NULL,
    pid INTEGER,
    status TEXT NOT NULL,
    exit_code INTEGER,
    log_path TEXT NOT NULL,
    ended TEXT
);
CREATE TABLE IF NOT EXISTS lanes (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lane INTEGER NOT NULL,
    gpu_index INTEGER,
    gpu_uuid TEXT,
    shard_id INTEGER NOT NULL,
    num_shards INTEGER NOT NULL,
    hostname TEXT NOT NULL,
    pid INTEGER,
    status TEXT NOT NULL,
    reason TEXT,
    summary TEXT,
    traceback TEXT,
    PRIMARY KEY (run_id, lane)
);
CREATE TABLE IF NOT EXISTS batches (
    run_id TEXT NOT NULL,
    lane INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    t_ns INTEGER NOT NULL,
    wait_s REAL NOT NULL,
    step_s REAL NOT NULL,
    size INTEGER NOT NULL,
    warmup INTEGER NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    synced INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, lane, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_samples (
    run_id TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    t_ns INTEGER NOT NULL,
    {gpu_columns},
    PRIMARY KEY (run_id, gpu_uuid, t_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS host_samples (
    run_id TEXT NOT NULL,
    hostname TEXT NOT NULL,
    t_ns INTEGER NOT NULL,
    cpu_pct REAL NOT NULL,
    per_core TEXT NOT NULL,
    iowait_pct REAL,
    steal_pct REAL,
    disk_read_mib_s REAL,
    memory_used_mib REAL,
    tree_cpu_pct REAL,
    tree_processes INTEGER,
    job_cpu_pct REAL,
    PRIMARY KEY (run_id, hostname, t_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lane_cpu (
    run_id TEXT NOT NULL,
    lane INTEGER NOT NULL,
    t_ns INTEGER NOT NULL,
    cpu_pct REAL NOT NULL,
    main_cpu_pct REAL NOT NULL,
    main_thread_cpu_pct REAL NOT NULL,
    processes INTEGER NOT NULL,
    threads INTEGER NOT NULL,
    pss_mib REAL,
    worker_threads INTEGER,
    PRIMARY KEY (run_id, lane, t_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS unavailable (
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    device TEXT NOT NULL,
    metric TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (run_id, source, device, metric)
) WITHOUT ROWID;
"""


def schema() -> str:
    """The tables; the GPU samples' columns are the metric layer's GPU metrics."""
    columns = ",\n    ".join(f"{m.name} {'INTEGER' if m.integer else 'REAL'}" for m in GPU_METRICS)
    return _SCHEMA.replace("{gpu_columns}", columns) + rollups.tables()


def migrate(db: sqlite3.Connection) -> None:
    """Creates the schema, or brings an older one up to date; an up-to-date store is only
    read here (readers must not take the write lock from a running probe)."""
    has_meta = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    row = None
    if has_meta:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row["value"]) if row is not None else None
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(
            f"it was written by a newer feedscope (schema {version}, "
            f"this one reads {SCHEMA_VERSION})"
        )
    db.execute("BEGIN IMMEDIATE")
    try:
        if version == 1:  # 1 -> 2: runs belong to sweep and doctor sessions
            db.execute("ALTER TABLE runs ADD COLUMN session_id TEXT")
        for statement in schema().split(";"):
            if statement.strip():
                db.execute(statement)
        _add_columns(db)
        if version is not None and version < 7:  # 6 -> 7: rollups, built from the rows stored
            rollups.rebuild(db)
        db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _add_columns(db: sqlite3.Connection) -> None:
    """The columns an older store lacks, added (before its rollups are built from its rows)."""
    columns = {row["name"] for row in db.execute("PRAGMA table_info(batches)")}
    if "epoch" not in columns:  # 3 -> 4: a batch's epoch
        db.execute("ALTER TABLE batches ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
    if "synced" not in columns:  # 4 -> 5: whether a batch's wait was synced
        db.execute("ALTER TABLE batches ADD COLUMN synced INTEGER NOT NULL DEFAULT 1")
    columns = {row["name"] for row in db.execute("PRAGMA table_info(lane_cpu)")}
    if "pss_mib" not in columns:  # 5 -> 6: a lane's memory (PSS), its workers' threads
        db.execute("ALTER TABLE lane_cpu ADD COLUMN pss_mib REAL")
        db.execute("ALTER TABLE lane_cpu ADD COLUMN worker_threads INTEGER")
    columns = {row["name"] for row in db.execute("PRAGMA table_info(host_samples)")}
    if "job_cpu_pct" not in columns:  # 8 -> 9: the busy share of the run's own cores
        db.execute("ALTER TABLE host_samples ADD COLUMN job_cpu_pct REAL")
    columns = {row["name"] for row in db.execute("PRAGMA table_info(host_rollup)")}
    if "job_cpu_pct_n" not in columns:  # made before 9: its buckets hold none of it
        for statement in rollups.added_metric(rollups.HOST, "job_cpu_pct"):
            db.execute(statement)
    columns = {row["name"] for row in db.execute("PRAGMA table_info(lanes)")}
    if "traceback" not in columns:  # 7 -> 8: a failed lane's whole traceback
        db.execute("ALTER TABLE lanes ADD COLUMN traceback TEXT")


def add_lanes(db: sqlite3.Connection, lanes: Sequence[LaneRecord]) -> None:
    db.executemany(
        "INSERT INTO lanes (run_id, lane, gpu_index, gpu_uuid, shard_id, num_shards, hostname, "
        "pid, status, reason, summary, traceback) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                lane.run_id, lane.lane, lane.gpu_index, lane.gpu_uuid, lane.shard_id,
                lane.num_shards, lane.hostname, lane.pid, lane.status.value, lane.reason,
                None if lane.summary is None else json.dumps(lane.summary), lane.traceback,
            )
            for lane in lanes
        ],
    )  # fmt: skip


def run_row(run: RunRecord) -> tuple[Any, ...]:
    return (
        run.run_id, run.kind, run.created, run.status.value, run.reason, run.pipeline,
        run.consumer, run.label, json.dumps(run.config), json.dumps(run.host), run.hostname,
        run.pid, run.started_ns, run.ended_ns, run.session_id,
    )  # fmt: skip


def run_from_row(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"], kind=row["kind"], created=row["created"],
        status=RunStatus(row["status"]), reason=row["reason"], pipeline=row["pipeline"],
        consumer=row["consumer"], label=row["label"], config=json.loads(row["config"]),
        host=json.loads(row["host"]), hostname=row["hostname"], pid=row["pid"],
        started_ns=row["started_ns"], ended_ns=row["ended_ns"], session_id=row["session_id"],
    )  # fmt: skip


def host_from_row(row: sqlite3.Row) -> HostSample:
    return HostSample(
        t_ns=row["t_ns"], cpu_pct=row["cpu_pct"], per_core_pct=tuple(json.loads(row["per_core"])),
        iowait_pct=row["iowait_pct"], steal_pct=row["steal_pct"],
        disk_read_mib_s=row["disk_read_mib_s"], memory_used_mib=row["memory_used_mib"],
        tree_cpu_pct=row["tree_cpu_pct"], tree_processes=row["tree_processes"],
        job_cpu_pct=row["job_cpu_pct"],
    )  # fmt: skip


def session_from_row(row: sqlite3.Row) -> SessionRecord:
    return SessionRecord(
        session_id=row["session_id"], kind=row["kind"], created=row["created"],
        status=RunStatus(row["status"]), reason=row["reason"], hostname=row["hostname"],
        pid=row["pid"], document=json.loads(row["document"]),
    )  # fmt: skip


def lane_from_row(row: sqlite3.Row) -> LaneRecord:
    return LaneRecord(
        run_id=row["run_id"], lane=row["lane"], gpu_index=row["gpu_index"],
        gpu_uuid=row["gpu_uuid"], shard_id=row["shard_id"], num_shards=row["num_shards"],
        hostname=row["hostname"], pid=row["pid"], status=RunStatus(row["status"]),
        reason=row["reason"],
        summary=None if row["summary"] is None else json.loads(row["summary"]),
        traceback=row["traceback"],
    )  # fmt: skip


def tune_from_row(row: sqlite3.Row) -> TuneRecord:
    return TuneRecord(row["tune_id"], row["run_id"], row["created"], RunStatus(row["status"]),
                      row["reason"], json.loads(row["document"]))  # fmt: skip


def launch_from_row(row: sqlite3.Row) -> LaunchRecord:
    return LaunchRecord(
        launch_id=row["launch_id"], command=row["command"], argv=json.loads(row["argv"]),
        devices=json.loads(row["devices"]), created=row["created"], pid=row["pid"],
        status=RunStatus(row["status"]), exit_code=row["exit_code"],
        log_path=row["log_path"], ended=row["ended"],
    )  # fmt: skip


def session_row(session: SessionRecord) -> tuple[Any, ...]:
    return (session.session_id, session.kind, session.created, session.status.value,
            session.reason, session.hostname, session.pid,
            json.dumps(session.document))  # fmt: skip


def tune_row(tune: TuneRecord) -> tuple[Any, ...]:
    return (tune.tune_id, tune.run_id, tune.created, tune.status.value, tune.reason,
            json.dumps(tune.document))  # fmt: skip


def launch_row(launch: LaunchRecord) -> tuple[Any, ...]:
    return (launch.launch_id, launch.command, json.dumps(launch.argv),
            json.dumps(launch.devices), launch.created, launch.pid, launch.status.value,
            launch.exit_code, launch.log_path, launch.ended)  # fmt: skip
