"""The store: one SQLite file holding runs, their lanes, batch events and hardware samples.

WAL mode and a busy timeout let readers (the dashboard, `probe show`) read while a probe writes;
the probe's coordinating process is the only writer of a run. The schema version is kept in the
`meta` table. Where the file lives: `--db`, else `$FEEDSCOPE_DB`, else the user's data folder.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from pipelines import InputError
from probe.metrics import GPU_COLUMNS, LaneFigures
from probe.records import (
    BatchEvent,
    GpuSample,
    HostSample,
    LaneCpuSample,
    LaneRecord,
    LaunchRecord,
    RunRecord,
    RunStatus,
    SessionRecord,
    Unavailable,
)
from probe.store.schema import (
    add_lanes,
    host_from_row,
    lane_from_row,
    migrate,
    run_from_row,
    run_row,
    session_from_row,
)

ENV_VAR = "FEEDSCOPE_DB"


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
            migrate(self._db)
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
        with self.transaction() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       run_row(run))  # fmt: skip
            add_lanes(db, lanes)

    def update_lane(self, run_id: str, lane: int, **fields: Any) -> None:
        """Sets some of a lane's columns: pid, gpu_uuid, status, reason, summary."""
        allowed = {"pid", "gpu_uuid", "status", "reason", "summary"}
        if not fields.keys() <= allowed:
            raise ValueError(f"not lane columns to update: {sorted(fields.keys() - allowed)}")
        values = {k: _column_value(v) for k, v in fields.items()}
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self.transaction() as db:
            db.execute(
                f"UPDATE lanes SET {assignments} WHERE run_id = ? AND lane = ?",
                (*values.values(), run_id, lane),
            )

    def finish_run(self, run_id: str, status: RunStatus, reason: str | None, ended_ns: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET status = ?, reason = ?, ended_ns = ? WHERE run_id = ?",
                (status.value, reason, ended_ns, run_id),
            )

    def save_session(self, session: SessionRecord) -> None:
        """Writes a session (again: its document grows as its runs end)."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session.session_id, session.kind, session.created, session.status.value,
                    session.reason, session.hostname, session.pid, json.dumps(session.document),
                ),
            )  # fmt: skip

    def save_launch(self, launch: LaunchRecord) -> None:
        with self.transaction() as db:
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
            (run_id, e.lane, e.index, e.t_ns, e.wait_s, e.step_s, e.size, int(e.warmup), e.epoch,
             int(e.synced))
            for e in events
        ]  # fmt: skip
        with self.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO batches (run_id, lane, idx, t_ns, wait_s, step_s, size, "
                "warmup, epoch, synced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def add_gpu_samples(self, run_id: str, samples: Iterable[GpuSample]) -> None:
        rows = [
            (run_id, s.gpu_uuid, s.t_ns, *(getattr(s, c) for c in GPU_COLUMNS)) for s in samples
        ]
        marks = ", ".join("?" * (3 + len(GPU_COLUMNS)))
        with self.transaction() as db:
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
        with self.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO host_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )

    def add_lane_cpu(self, run_id: str, samples: Iterable[LaneCpuSample]) -> None:
        rows = [
            (
                run_id, s.lane, s.t_ns, s.cpu_pct, s.main_cpu_pct, s.main_thread_cpu_pct,
                s.processes, s.threads, s.pss_mib, s.worker_threads,
            )
            for s in samples
        ]  # fmt: skip
        with self.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO lane_cpu (run_id, lane, t_ns, cpu_pct, main_cpu_pct, "
                "main_thread_cpu_pct, processes, threads, pss_mib, worker_threads) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def add_unavailable(self, run_id: str, items: Iterable[Unavailable]) -> None:
        rows = [(run_id, u.source, u.device, u.metric, u.reason) for u in items]
        with self.transaction() as db:
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
        with self.transaction() as db:
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

    # reading

    def runs(self) -> list[RunRecord]:
        """Every run, newest first."""
        rows = self._db.execute("SELECT * FROM runs ORDER BY created DESC, run_id DESC")
        return [run_from_row(row) for row in rows]

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
            return run_from_row(row)
        return run_from_row(self._find("runs", "run_id", run_id, "run"))

    def sessions(self) -> list[SessionRecord]:
        """Every sweep and doctor session, newest first."""
        rows = self._db.execute("SELECT * FROM sessions ORDER BY created DESC, session_id DESC")
        return [session_from_row(row) for row in rows]

    def session(self, session_id: str) -> SessionRecord:
        """A session by its id or a unique prefix of it.

        Raises:
            InputError: no session or several match.
        """
        return session_from_row(self._find("sessions", "session_id", session_id, "session"))

    def lanes(self, run_id: str) -> list[LaneRecord]:
        rows = self._db.execute("SELECT * FROM lanes WHERE run_id = ? ORDER BY lane", (run_id,))
        return [lane_from_row(row) for row in rows]

    def batches(self, run_id: str, lane: int | None = None) -> list[BatchEvent]:
        query = "SELECT * FROM batches WHERE run_id = ?"
        params: tuple[Any, ...] = (run_id,)
        if lane is not None:
            query, params = query + " AND lane = ?", (run_id, lane)
        rows = self._db.execute(query + " ORDER BY lane, idx", params)
        return [
            BatchEvent(
                row["lane"], row["idx"], row["t_ns"], row["wait_s"], row["step_s"], row["size"],
                bool(row["warmup"]), row["epoch"], bool(row["synced"]),
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
        rows = self._db.execute(
            "SELECT * FROM host_samples WHERE run_id = ? ORDER BY t_ns", (run_id,)
        ).fetchall()
        return [host_from_row(row) for row in rows]

    def lane_cpu(self, run_id: str) -> list[LaneCpuSample]:
        rows = self._db.execute(
            "SELECT * FROM lane_cpu WHERE run_id = ? ORDER BY lane, t_ns", (run_id,)
        )
        return [
            LaneCpuSample(
                t_ns=row["t_ns"], lane=row["lane"], cpu_pct=row["cpu_pct"],
                main_cpu_pct=row["main_cpu_pct"], main_thread_cpu_pct=row["main_thread_cpu_pct"],
                processes=row["processes"], threads=row["threads"], pss_mib=row["pss_mib"],
                worker_threads=row["worker_threads"],
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
            " SELECT MIN(t_ns) AS t FROM batches WHERE run_id = :run"
            " UNION ALL SELECT MAX(t_ns + CAST((wait_s + step_s) * 1e9 AS INTEGER))"
            "  FROM batches WHERE run_id = :run"
            " UNION ALL SELECT MIN(t_ns) FROM gpu_samples WHERE run_id = :run"
            " UNION ALL SELECT MAX(t_ns) FROM gpu_samples WHERE run_id = :run"
            " UNION ALL SELECT MIN(t_ns) FROM host_samples WHERE run_id = :run"
            " UNION ALL SELECT MAX(t_ns) FROM host_samples WHERE run_id = :run)",
            {"run": run_id},
        ).fetchone()
        return None if row[0] is None else (row[0], row[1])

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[sqlite3.Row]:
        """The rows of one read (for the store's own modules: series, merge)."""
        return self._db.execute(sql, params).fetchall()

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
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _column_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, LaneFigures):
        return json.dumps(value.to_json())
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
