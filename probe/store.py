"""The store: one SQLite file holding runs, their lanes, batch events and hardware samples.

WAL mode and a busy timeout let readers (the dashboard, `probe show`) read while a probe writes;
the probe's coordinating process is the only writer of a run. The schema version is kept in the
`meta` table. Where the file lives: `--db`, else `$FEEDSCOPE_DB`, else the user's data folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pipelines import InputError
from probe.samplers import GpuSample, HostSample, LaneCpuSample, Unavailable

SCHEMA_VERSION = 4
ENV_VAR = "FEEDSCOPE_DB"

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
    PRIMARY KEY (run_id, lane, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_samples (
    run_id TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    t_ns INTEGER NOT NULL,
    kernel_active_pct REAL,
    sm_active_pct REAL,
    sm_occupancy_pct REAL,
    nvjpg_pct REAL,
    nvjpg_gpm_pct REAL,
    memory_used_mib REAL,
    pcie_rx_mib_s REAL,
    pcie_tx_mib_s REAL,
    power_w REAL,
    clocks_event_reasons INTEGER,
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

GPU_COLUMNS = (
    "kernel_active_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "nvjpg_pct",
    "nvjpg_gpm_pct",
    "memory_used_mib",
    "pcie_rx_mib_s",
    "pcie_tx_mib_s",
    "power_w",
    "clocks_event_reasons",
)


class RunStatus(str, Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    kind: str  # "probe"
    created: str  # UTC, ISO 8601: for people; durations come from the monotonic clock
    status: RunStatus
    reason: str | None
    pipeline: str  # "torch" or "dali"
    consumer: str
    label: str | None
    config: dict[str, Any]
    host: dict[str, Any]
    hostname: str
    pid: int | None  # the process that writes the run
    started_ns: int  # time.monotonic_ns() of the host that ran it
    ended_ns: int | None
    session_id: str | None = None  # the sweep or doctor session it belongs to


@dataclass(frozen=True)
class SessionRecord:
    """A sweep or a doctor session: several runs and what was concluded from them."""

    session_id: str  # "sweep-..." or "doctor-..."
    kind: str  # "sweep" or "doctor"
    created: str
    status: RunStatus
    reason: str | None
    hostname: str
    pid: int | None
    document: dict[str, Any]


@dataclass(frozen=True)
class LaunchRecord:
    """A probe command started by the dashboard, in a process of its own."""

    launch_id: str
    command: str  # "run", "sweep" or "doctor"
    argv: list[str]  # the probe command's arguments
    devices: list[str]  # "cpu", or GPU indices as text
    created: str
    pid: int | None
    status: RunStatus
    exit_code: int | None
    log_path: str
    ended: str | None


@dataclass(frozen=True)
class LaneRecord:
    run_id: str
    lane: int
    gpu_index: int | None
    gpu_uuid: str | None
    shard_id: int
    num_shards: int
    hostname: str
    pid: int | None
    status: RunStatus
    reason: str | None
    summary: dict[str, Any] | None  # the lane's figures, written when it ends


@dataclass(frozen=True)
class BatchEvent:
    """One batch as the consumer saw it."""

    lane: int
    index: int
    t_ns: int  # when the consumer asked for it
    wait_s: float  # blocked on the pipeline, the copy to the device included
    step_s: float  # the consumer's step
    size: int
    warmup: bool
    # Which reading of the loader it came from: an epoch's `for` (a stream is one reading).
    epoch: int = 0


@dataclass(frozen=True)
class RunExport:
    """A run's lanes with everything recorded for them, as one store hands them to another:
    the ranks of a torchrun probe to rank 0, and `probe merge`."""

    run: RunRecord
    lanes: list[LaneRecord]
    batches: list[BatchEvent]
    gpu: list[GpuSample]
    host: dict[str, list[HostSample]]  # by hostname
    lane_cpu: list[LaneCpuSample]
    unavailable: list[Unavailable]


def default_db_path() -> Path:
    """`$FEEDSCOPE_DB`, else feedscope.db in the user's data folder."""
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("feedscope")) / "feedscope.db"


class Store:
    """A connection to the store; use one per thread."""

    def __init__(self, path: Path | str | None = None) -> None:
        """Opens (and if new, creates) the store.

        Raises:
            InputError: the file cannot be created or opened, is not a feedscope store, or was
                written by a newer feedscope.
        """
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        if self.path.is_dir():
            raise InputError(f"the store path is a folder, not a file: {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except (sqlite3.DatabaseError, OSError) as error:
            raise InputError(f"cannot use {self.path} as the store: {_reason(error)}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # writing

    def create_run(self, run: RunRecord, lanes: Sequence[LaneRecord]) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _run_row(run))  # fmt: skip
            _add_lanes(db, lanes)

    def update_lane(self, run_id: str, lane: int, **fields: Any) -> None:
        """Sets some of a lane's columns: pid, gpu_uuid, status, reason, summary."""
        allowed = {"pid", "gpu_uuid", "status", "reason", "summary"}
        if not fields.keys() <= allowed:
            raise ValueError(f"not lane columns to update: {sorted(fields.keys() - allowed)}")
        values = {k: _column_value(v) for k, v in fields.items()}
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self._transaction() as db:
            db.execute(
                f"UPDATE lanes SET {assignments} WHERE run_id = ? AND lane = ?",
                (*values.values(), run_id, lane),
            )

    def finish_run(self, run_id: str, status: RunStatus, reason: str | None, ended_ns: int) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET status = ?, reason = ?, ended_ns = ? WHERE run_id = ?",
                (status.value, reason, ended_ns, run_id),
            )

    def save_session(self, session: SessionRecord) -> None:
        """Writes a session (again: its document grows as its runs end)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session.session_id, session.kind, session.created, session.status.value,
                    session.reason, session.hostname, session.pid, json.dumps(session.document),
                ),
            )  # fmt: skip

    def save_launch(self, launch: LaunchRecord) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO launches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    launch.launch_id, launch.command, json.dumps(launch.argv),
                    json.dumps(launch.devices), launch.created, launch.pid, launch.status.value,
                    launch.exit_code, launch.log_path, launch.ended,
                ),
            )  # fmt: skip

    def launches(self) -> list[LaunchRecord]:
        """Every launch, newest first."""
        rows = self._db.execute("SELECT * FROM launches ORDER BY created DESC, launch_id DESC")
        return [
            LaunchRecord(
                launch_id=row["launch_id"], command=row["command"], argv=json.loads(row["argv"]),
                devices=json.loads(row["devices"]), created=row["created"], pid=row["pid"],
                status=RunStatus(row["status"]), exit_code=row["exit_code"],
                log_path=row["log_path"], ended=row["ended"],
            )
            for row in rows
        ]  # fmt: skip

    def add_batches(self, run_id: str, events: Iterable[BatchEvent]) -> None:
        rows = [
            (run_id, e.lane, e.index, e.t_ns, e.wait_s, e.step_s, e.size, int(e.warmup), e.epoch)
            for e in events
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO batches (run_id, lane, idx, t_ns, wait_s, step_s, size, "
                "warmup, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def add_gpu_samples(self, run_id: str, samples: Iterable[GpuSample]) -> None:
        rows = [
            (run_id, s.gpu_uuid, s.t_ns, *(getattr(s, c) for c in GPU_COLUMNS)) for s in samples
        ]
        marks = ", ".join("?" * (3 + len(GPU_COLUMNS)))
        with self._transaction() as db:
            db.executemany(f"INSERT OR REPLACE INTO gpu_samples VALUES ({marks})", rows)

    def add_host_samples(self, run_id: str, hostname: str, samples: Iterable[HostSample]) -> None:
        rows = [
            (
                run_id, hostname, s.t_ns, s.cpu_pct,
                json.dumps([round(c, 1) for c in s.per_core_pct]), s.iowait_pct, s.steal_pct,
                s.disk_read_mib_s, s.memory_used_mib, s.tree_cpu_pct, s.tree_processes,
            )
            for s in samples
        ]  # fmt: skip
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO host_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )

    def add_lane_cpu(self, run_id: str, samples: Iterable[LaneCpuSample]) -> None:
        rows = [
            (
                run_id, s.lane, s.t_ns, s.cpu_pct, s.main_cpu_pct, s.main_thread_cpu_pct,
                s.processes, s.threads,
            )
            for s in samples
        ]  # fmt: skip
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO lane_cpu VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def add_unavailable(self, run_id: str, items: Iterable[Unavailable]) -> None:
        rows = [(run_id, u.source, u.device, u.metric, u.reason) for u in items]
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO unavailable VALUES (?, ?, ?, ?, ?)", rows)

    def mark_abandoned_runs(self, hostname: str, is_alive: Any) -> list[str]:
        """Marks `running` runs of this host whose process is gone as interrupted.

        Args:
            hostname: this host: runs of other hosts are left alone.
            is_alive: called with a process id.
        """
        rows = self._db.execute(
            "SELECT run_id, pid FROM runs WHERE status = ? AND hostname = ?",
            (RunStatus.RUNNING.value, hostname),
        ).fetchall()
        gone = [row["run_id"] for row in rows if row["pid"] is None or not is_alive(row["pid"])]
        reason = "the probe process ended without finishing the run (killed?)"
        with self._transaction() as db:
            for run_id in gone:
                db.execute(
                    "UPDATE runs SET status = ?, reason = ? WHERE run_id = ?",
                    (RunStatus.INTERRUPTED.value, reason, run_id),
                )
                db.execute(
                    "UPDATE lanes SET status = ?, reason = ? WHERE run_id = ? AND status = ?",
                    (RunStatus.INTERRUPTED.value, reason, run_id, RunStatus.RUNNING.value),
                )
        return gone

    def import_run(self, export: RunExport) -> list[int]:
        """Adds a run's lanes from another store, with their events and samples, to the run of
        the same id here (created if new); returns the lanes added. Lanes, GPUs and hosts the run
        already has here are kept as they are. Times from another host are moved onto this
        run's clock through the wall clock both hosts read at their start."""
        run = export.run
        with self._transaction() as db:  # several ranks may create the run at once
            db.execute(
                "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _run_row(run),
            )
            here = _run(db.execute("SELECT * FROM runs WHERE run_id = ?", (run.run_id,)).fetchone())
        shift = 0 if here.hostname == run.hostname else clock_shift(here.host, run.host)
        have = {lane.lane for lane in self.lanes(run.run_id)}
        lanes = [lane for lane in export.lanes if lane.lane not in have]
        added = {lane.lane for lane in lanes}
        uuids = {lane.gpu_uuid for lane in lanes} - {None}
        known = self._db.execute(
            "SELECT DISTINCT gpu_uuid FROM gpu_samples WHERE run_id = ?", (run.run_id,)
        ).fetchall()
        uuids -= {r[0] for r in known}
        hosts = {r[0] for r in self._db.execute(
            "SELECT DISTINCT hostname FROM host_samples WHERE run_id = ?", (run.run_id,)
        )}  # fmt: skip
        with self._transaction() as db:
            _add_lanes(db, lanes)
        self.add_rows(
            RunExport(
                run, lanes, [e for e in export.batches if e.lane in added],
                [g for g in export.gpu if g.gpu_uuid in uuids],
                {name: rows for name, rows in export.host.items() if name not in hosts},
                [c for c in export.lane_cpu if c.lane in added], export.unavailable,
            ),
            shift,
        )  # fmt: skip
        self._join(here, run, shift)
        self.settle_run(run.run_id)
        return sorted(added)

    def add_rows(self, export: RunExport, shift: int = 0) -> None:
        """Writes an export's events and samples (not its run or lanes), `shift` added to their
        times."""
        run_id = export.run.run_id
        self.add_batches(run_id, _moved(export.batches, shift))
        self.add_gpu_samples(run_id, _moved(export.gpu, shift))
        for hostname, samples in export.host.items():
            self.add_host_samples(run_id, hostname, _moved(samples, shift))
        self.add_lane_cpu(run_id, _moved(export.lane_cpu, shift))
        self.add_unavailable(run_id, export.unavailable)

    def export_run(self, run_id: str) -> RunExport:
        """Everything recorded for a run (its exact id)."""
        run = _run(self._find("runs", "run_id", run_id, "run"))
        host: dict[str, list[HostSample]] = {}
        for row in self._db.execute(
            "SELECT * FROM host_samples WHERE run_id = ? ORDER BY t_ns", (run.run_id,)
        ):
            host.setdefault(row["hostname"], []).append(_host(row))
        return RunExport(
            run, self.lanes(run.run_id), self.batches(run.run_id), self.gpu_samples(run.run_id),
            host, self.lane_cpu(run.run_id), self.unavailable(run.run_id),
        )  # fmt: skip

    def settle_run(self, run_id: str) -> None:
        """Sets a run's status from its lanes' once none is running: failed if one failed,
        interrupted if one was, else completed; a run missing lanes (recorded in another store:
        `probe merge` joins them) says which."""
        run = self.run(run_id)
        lanes = self.lanes(run_id)
        if any(lane.status is RunStatus.RUNNING for lane in lanes):
            return
        expected = int(run.config.get("world_size") or len(run.config.get("lanes", [])))
        missing = sorted(set(range(expected)) - {lane.lane for lane in lanes})
        failed = [x for x in lanes if x.status is RunStatus.FAILED]
        stopped = [x for x in lanes if x.status is RunStatus.INTERRUPTED]
        if failed:
            status, reasons = (
                RunStatus.FAILED,
                [f"lane {x.lane} failed: {x.reason}" for x in failed],
            )
        elif stopped:
            status, reasons = (
                RunStatus.INTERRUPTED,
                [f"lane {stopped[0].lane}: {stopped[0].reason}"],
            )
        else:
            status, reasons = RunStatus.COMPLETED, []
        if missing:
            reasons.append(
                f"{len(lanes)} of {expected} lanes recorded here (missing: "
                f"{', '.join(map(str, missing))}; `probe merge` adds them from their stores)"
            )
        ended = max((run.ended_ns or 0, *(self.time_span(run_id) or (0, 0))))
        self.finish_run(run_id, status, "; ".join(reasons) or None, ended)

    def _join(self, here: RunRecord, other: RunRecord, shift: int) -> None:
        """Folds another store's record of a run into this one's: its lanes' configuration,
        its host, its start."""
        config = dict(here.config)
        lanes = {lane["lane"]: lane for lane in (*config.get("lanes", []), *other.config["lanes"])}
        config["lanes"] = [lanes[k] for k in sorted(lanes)]
        host = dict(here.host)
        nodes = dict(host.get("nodes", {}))
        for name, facts in {other.hostname: other.host, **other.host.get("nodes", {})}.items():
            if name != here.hostname:
                nodes.setdefault(name, {k: v for k, v in facts.items() if k != "nodes"})
        if nodes:
            host["nodes"] = nodes
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET config = ?, host = ?, started_ns = ? WHERE run_id = ?",
                (
                    json.dumps(config), json.dumps(host),
                    min(here.started_ns, other.started_ns + shift), here.run_id,
                ),
            )  # fmt: skip

    # reading

    def runs(self) -> list[RunRecord]:
        """Every run, newest first."""
        rows = self._db.execute("SELECT * FROM runs ORDER BY created DESC, run_id DESC")
        return [_run(row) for row in rows]

    def run(self, run_id: str) -> RunRecord:
        """A run by its id, a unique prefix of it, or `last`.

        Raises:
            InputError: no run or several runs match.
        """
        if run_id == "last":
            row = self._db.execute(
                "SELECT * FROM runs ORDER BY created DESC, run_id DESC LIMIT 1"
            ).fetchone()
            if row is None:
                raise InputError(f"the store {self.path} holds no runs yet")
            return _run(row)
        return _run(self._find("runs", "run_id", run_id, "run"))

    def sessions(self) -> list[SessionRecord]:
        """Every sweep and doctor session, newest first."""
        rows = self._db.execute("SELECT * FROM sessions ORDER BY created DESC, session_id DESC")
        return [_session(row) for row in rows]

    def session(self, session_id: str) -> SessionRecord:
        """A session by its id or a unique prefix of it.

        Raises:
            InputError: no session or several match.
        """
        return _session(self._find("sessions", "session_id", session_id, "session"))

    def lanes(self, run_id: str) -> list[LaneRecord]:
        rows = self._db.execute("SELECT * FROM lanes WHERE run_id = ? ORDER BY lane", (run_id,))
        return [_lane(row) for row in rows]

    def batches(self, run_id: str, lane: int | None = None) -> list[BatchEvent]:
        query = "SELECT * FROM batches WHERE run_id = ?"
        params: tuple[Any, ...] = (run_id,)
        if lane is not None:
            query, params = query + " AND lane = ?", (run_id, lane)
        rows = self._db.execute(query + " ORDER BY lane, idx", params)
        return [
            BatchEvent(
                row["lane"], row["idx"], row["t_ns"], row["wait_s"], row["step_s"], row["size"],
                bool(row["warmup"]), row["epoch"],
            )
            for row in rows
        ]  # fmt: skip

    def gpu_samples(self, run_id: str, gpu_uuid: str | None = None) -> list[GpuSample]:
        query = "SELECT * FROM gpu_samples WHERE run_id = ?"
        params: tuple[Any, ...] = (run_id,)
        if gpu_uuid is not None:
            query, params = query + " AND gpu_uuid = ?", (run_id, gpu_uuid)
        rows = self._db.execute(query + " ORDER BY gpu_uuid, t_ns", params)
        return [
            GpuSample(
                t_ns=row["t_ns"], gpu_uuid=row["gpu_uuid"], **{c: row[c] for c in GPU_COLUMNS}
            )
            for row in rows
        ]

    def host_samples(self, run_id: str) -> list[HostSample]:
        return self.host_rows(run_id)

    def lane_cpu(self, run_id: str) -> list[LaneCpuSample]:
        rows = self._db.execute(
            "SELECT * FROM lane_cpu WHERE run_id = ? ORDER BY lane, t_ns", (run_id,)
        )
        return [
            LaneCpuSample(
                t_ns=row["t_ns"], lane=row["lane"], cpu_pct=row["cpu_pct"],
                main_cpu_pct=row["main_cpu_pct"], main_thread_cpu_pct=row["main_thread_cpu_pct"],
                processes=row["processes"], threads=row["threads"],
            )
            for row in rows
        ]  # fmt: skip

    def unavailable(self, run_id: str) -> list[Unavailable]:
        rows = self._db.execute(
            "SELECT * FROM unavailable WHERE run_id = ? ORDER BY source, device, metric", (run_id,)
        )
        return [
            Unavailable(row["source"], row["device"], row["metric"], row["reason"]) for row in rows
        ]

    def sample_counts(self, run_id: str) -> dict[str, int]:
        """How many GPU and host samples a run holds."""
        gpu = self._db.execute("SELECT COUNT(*) FROM gpu_samples WHERE run_id = ?", (run_id,))
        host = self._db.execute("SELECT COUNT(*) FROM host_samples WHERE run_id = ?", (run_id,))
        return {"gpu": gpu.fetchone()[0], "host": host.fetchone()[0]}

    # aggregates: what long runs need without loading every row

    def batch_stats(self, run_id: str, lane: int) -> dict[str, Any]:
        """A lane's measured batches: count, first request, last end, mean step (s)."""
        row = self._db.execute(
            "SELECT COUNT(*) AS n, MIN(t_ns) AS start_ns, "
            "MAX(t_ns + CAST((wait_s + step_s) * 1e9 AS INTEGER)) AS end_ns, "
            "AVG(step_s) AS step_mean_s FROM batches "
            "WHERE run_id = ? AND lane = ? AND warmup = 0",
            (run_id, lane),
        ).fetchone()
        return dict(row)

    def host_means(
        self, run_id: str, hostname: str, start_ns: int, end_ns: int
    ) -> dict[str, float | None]:
        """Mean figures of one host between two times: cpu_pct, iowait_pct, steal_pct,
        disk_read_mib_s, tree_cpu_pct (the run's processes)."""
        row = self._db.execute(
            "SELECT AVG(cpu_pct) AS cpu_pct, AVG(iowait_pct) AS iowait_pct, "
            "AVG(steal_pct) AS steal_pct, AVG(disk_read_mib_s) AS disk_read_mib_s, "
            "AVG(tree_cpu_pct) AS tree_cpu_pct "
            "FROM host_samples WHERE run_id = ? AND hostname = ? AND t_ns BETWEEN ? AND ?",
            (run_id, hostname, start_ns, end_ns),
        ).fetchone()
        return dict(row)

    def time_span(self, run_id: str) -> tuple[int, int] | None:
        """The first and last time anything of the run was recorded (monotonic ns)."""
        row = self._db.execute(
            "SELECT MIN(t), MAX(t) FROM ("
            " SELECT MIN(t_ns) AS t FROM batches WHERE run_id = ?1"
            " UNION ALL SELECT MAX(t_ns + CAST((wait_s + step_s) * 1e9 AS INTEGER))"
            "  FROM batches WHERE run_id = ?1"
            " UNION ALL SELECT MIN(t_ns) FROM gpu_samples WHERE run_id = ?1"
            " UNION ALL SELECT MAX(t_ns) FROM gpu_samples WHERE run_id = ?1"
            " UNION ALL SELECT MIN(t_ns) FROM host_samples WHERE run_id = ?1"
            " UNION ALL SELECT MAX(t_ns) FROM host_samples WHERE run_id = ?1)",
            (run_id,),
        ).fetchone()
        return None if row[0] is None else (row[0], row[1])

    def gpu_buckets(
        self, run_id: str, start_ns: int, bucket_ns: int, since_ns: int | None = None
    ) -> list[sqlite3.Row]:
        """GPU samples per GPU and time bucket: min, mean and max of the busy-ness figures, so
        that downsampled lines keep their peaks and dips."""
        columns = ", ".join(
            f"MIN({c}) AS {c}_min, AVG({c}) AS {c}_mean, MAX({c}) AS {c}_max"
            for c in ("sm_active_pct", "kernel_active_pct", "nvjpg_pct", "memory_used_mib")
        )
        return self._db.execute(
            f"SELECT gpu_uuid, (t_ns - ?) / ? AS bucket, {columns} FROM gpu_samples "
            "WHERE run_id = ? AND t_ns > ? GROUP BY gpu_uuid, bucket ORDER BY gpu_uuid, bucket",
            (start_ns, bucket_ns, run_id, since_ns if since_ns is not None else -1),
        ).fetchall()

    def batch_buckets(
        self, run_id: str, start_ns: int, bucket_ns: int, since_ns: int | None = None
    ) -> list[sqlite3.Row]:
        """Measured batch events per lane and time bucket: images, wait and step sums, mean and
        worst latency."""
        return self._db.execute(
            "SELECT lane, (t_ns - ?) / ? AS bucket, COUNT(*) AS batches, SUM(size) AS images, "
            "SUM(wait_s) AS wait_s, SUM(step_s) AS step_s, "
            "AVG(wait_s + step_s) AS latency_mean_s, MAX(wait_s + step_s) AS latency_max_s "
            "FROM batches WHERE run_id = ? AND warmup = 0 AND t_ns > ? "
            "GROUP BY lane, bucket ORDER BY lane, bucket",
            (start_ns, bucket_ns, run_id, since_ns if since_ns is not None else -1),
        ).fetchall()

    def latency_bins(self, run_id: str, bin_ms: float, last_bin: int) -> list[sqlite3.Row]:
        """Measured batch latencies (wait + step) counted per lane in bins of `bin_ms`; bin
        `last_bin` counts all from there on."""
        return self._db.execute(
            "SELECT lane, MIN(CAST((wait_s + step_s) * 1000 / ? AS INTEGER), ?) AS bin, "
            "COUNT(*) AS n FROM batches WHERE run_id = ? AND warmup = 0 "
            "GROUP BY lane, bin ORDER BY lane, bin",
            (bin_ms, last_bin, run_id),
        ).fetchall()

    def lane_cpu_buckets(self, run_id: str, start_ns: int, bucket_ns: int) -> list[sqlite3.Row]:
        return self._db.execute(
            "SELECT lane, (t_ns - ?) / ? AS bucket, AVG(cpu_pct) AS cpu_pct, "
            "AVG(main_thread_cpu_pct) AS main_thread_cpu_pct, MAX(processes) AS processes, "
            "MAX(threads) AS threads FROM lane_cpu WHERE run_id = ? "
            "GROUP BY lane, bucket ORDER BY lane, bucket",
            (start_ns, bucket_ns, run_id),
        ).fetchall()

    def host_rows(self, run_id: str) -> list[HostSample]:
        rows = self._db.execute(
            "SELECT * FROM host_samples WHERE run_id = ? ORDER BY t_ns", (run_id,)
        ).fetchall()
        return [_host(row) for row in rows]

    def host_rows_bucketed(self, run_id: str, start_ns: int, bucket_ns: int) -> list[HostSample]:
        """The first host sample of each time bucket (per-core figures are long to decode)."""
        rows = self._db.execute(
            "SELECT * FROM host_samples WHERE run_id = ?1 AND t_ns IN ("
            " SELECT MIN(t_ns) FROM host_samples WHERE run_id = ?1 GROUP BY (t_ns - ?2) / ?3)"
            " ORDER BY t_ns",
            (run_id, start_ns, bucket_ns),
        ).fetchall()
        return [_host(row) for row in rows]

    def rows_since(self, table: str, run_id: str, since_ns: int) -> list[sqlite3.Row]:
        """Rows of `batches`, `gpu_samples`, `lane_cpu` or `host_samples` newer than a time."""
        if table not in {"batches", "gpu_samples", "lane_cpu", "host_samples"}:
            raise ValueError(f"not a table of samples or events: {table}")
        return self._db.execute(
            f"SELECT * FROM {table} WHERE run_id = ? AND t_ns > ? ORDER BY t_ns", (run_id, since_ns)
        ).fetchall()

    # internals

    def _find(self, table: str, key: str, wanted: str, what: str) -> sqlite3.Row:
        """The row whose `key` is `wanted`, or the only one it starts.

        Raises:
            InputError: none or several match.
        """
        rows = self._db.execute(
            f"SELECT * FROM {table} WHERE {key} = ? OR {key} LIKE ? ESCAPE '\\' LIMIT 6",
            (wanted, _like_prefix(wanted)),
        ).fetchall()
        exact = [row for row in rows if row[key] == wanted]
        if exact or len(rows) == 1:
            return (exact or rows)[0]  # type: ignore[no-any-return]
        if not rows:
            raise InputError(f"no {what} {wanted!r} in {self.path} (see `probe runs`)")
        names = ", ".join(row[key] for row in rows[:5])
        raise InputError(f"{wanted!r} matches several {what}s ({names}): give more of the id")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        """Creates the schema, or brings an older one up to date; an up-to-date store is only
        read here (readers must not take the write lock from a running probe)."""
        has_meta = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        row = None
        if has_meta:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row["value"]) if row is not None else None
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"it was written by a newer feedscope (schema {version}, "
                f"this one reads {SCHEMA_VERSION})"
            )
        with self._transaction() as db:
            if version == 1:  # 1 -> 2: runs belong to sweep and doctor sessions
                db.execute("ALTER TABLE runs ADD COLUMN session_id TEXT")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            columns = {row["name"] for row in db.execute("PRAGMA table_info(batches)")}
            if "epoch" not in columns:  # 3 -> 4: a batch's epoch
                db.execute("ALTER TABLE batches ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )


def _add_lanes(db: sqlite3.Connection, lanes: Sequence[LaneRecord]) -> None:
    db.executemany(
        "INSERT INTO lanes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                lane.run_id, lane.lane, lane.gpu_index, lane.gpu_uuid, lane.shard_id,
                lane.num_shards, lane.hostname, lane.pid, lane.status.value, lane.reason,
                None if lane.summary is None else json.dumps(lane.summary),
            )
            for lane in lanes
        ],
    )  # fmt: skip


def _run_row(run: RunRecord) -> tuple[Any, ...]:
    return (
        run.run_id, run.kind, run.created, run.status.value, run.reason, run.pipeline,
        run.consumer, run.label, json.dumps(run.config), json.dumps(run.host), run.hostname,
        run.pid, run.started_ns, run.ended_ns, run.session_id,
    )  # fmt: skip


def _run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"], kind=row["kind"], created=row["created"],
        status=RunStatus(row["status"]), reason=row["reason"], pipeline=row["pipeline"],
        consumer=row["consumer"], label=row["label"], config=json.loads(row["config"]),
        host=json.loads(row["host"]), hostname=row["hostname"], pid=row["pid"],
        started_ns=row["started_ns"], ended_ns=row["ended_ns"], session_id=row["session_id"],
    )  # fmt: skip


def _host(row: sqlite3.Row) -> HostSample:
    return HostSample(
        t_ns=row["t_ns"], cpu_pct=row["cpu_pct"], per_core_pct=tuple(json.loads(row["per_core"])),
        iowait_pct=row["iowait_pct"], steal_pct=row["steal_pct"],
        disk_read_mib_s=row["disk_read_mib_s"], memory_used_mib=row["memory_used_mib"],
        tree_cpu_pct=row["tree_cpu_pct"], tree_processes=row["tree_processes"],
    )  # fmt: skip


def _session(row: sqlite3.Row) -> SessionRecord:
    return SessionRecord(
        session_id=row["session_id"], kind=row["kind"], created=row["created"],
        status=RunStatus(row["status"]), reason=row["reason"], hostname=row["hostname"],
        pid=row["pid"], document=json.loads(row["document"]),
    )  # fmt: skip


def _lane(row: sqlite3.Row) -> LaneRecord:
    return LaneRecord(
        run_id=row["run_id"], lane=row["lane"], gpu_index=row["gpu_index"],
        gpu_uuid=row["gpu_uuid"], shard_id=row["shard_id"], num_shards=row["num_shards"],
        hostname=row["hostname"], pid=row["pid"], status=RunStatus(row["status"]),
        reason=row["reason"],
        summary=None if row["summary"] is None else json.loads(row["summary"]),
    )  # fmt: skip


def _column_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return json.dumps(value)
    return value


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if "file is not a database" in text:
        return "it is not a feedscope store (not an SQLite file)"
    if "unable to open database file" in text:
        return "the file cannot be created or opened there (permissions?)"
    return text


_Timed = TypeVar("_Timed", BatchEvent, GpuSample, HostSample, LaneCpuSample)


def _moved(items: Sequence[_Timed], shift: int) -> list[_Timed]:
    """`items` with `shift` added to their times."""
    if not shift:
        return list(items)
    return [dataclasses.replace(item, t_ns=item.t_ns + shift) for item in items]


def clock_shift(here: dict[str, Any], there: dict[str, Any]) -> int:
    """What to add to a monotonic time of host `there` to put it on host `here`'s monotonic
    clock, from the (monotonic, wall) pair each read together (a host dict's `clock`); 0 when
    either lacks one. As good as the hosts' wall clocks agree (NTP: milliseconds)."""
    a, b = here.get("clock"), there.get("clock")
    if not a or not b:
        return 0
    return int((a["monotonic_ns"] - a["unix_ns"]) - (b["monotonic_ns"] - b["unix_ns"]))
