"""The store's queries: runs, their lanes, batch events and hardware samples written to and read
from one SQLite file (opened by `probe.store.connection`).

The probe's coordinating process is the only writer of a run. Samples and batches are written
with their rollups (`probe.store.rollups`), in one transaction; what a run's totals and windows
need is read from those, a bounded number of rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from pathlib import Path
from typing import Any

from pipelines import InputError
from probe.lane_figures import LaneFigures
from probe.metrics import GPU_COLUMNS
from probe.records import (
    BatchAcross,
    BatchEvent,
    GpuSample,
    HostSample,
    LaneCpuSample,
    LaneRecord,
    LaunchRecord,
    RunRecord,
    RunStatus,
    SessionRecord,
    TuneRecord,
    Unavailable,
)
from probe.store import rollups
from probe.store.connection import BUSY_TIMEOUT_S, StoreBusy, StoreFailed, connect, default_db_path
from probe.store.rollups import GPU, HOST, BatchTotals, Samples, Totals
from probe.store.schema import (
    BATCH_COLUMNS,
    GPU_TABLE_COLUMNS,
    HOST_COLUMNS,
    LANE_CPU_COLUMNS,
    add_lanes,
    host_from_row,
    lane_from_row,
    launch_from_row,
    launch_row,
    run_from_row,
    run_row,
    session_from_row,
    session_row,
    tune_from_row,
    tune_row,
)

# The runs whose lanes are each written by a process of its own, a rank of a watched job under
# torchrun: a rank that dies leaves its lane running, whatever became of the run's process (the
# rank that created it). `probe.store.spool.mark_dead_ranks` ends such lanes; others, with their
# run, `Store.mark_abandoned_runs`.
RANKED_RUNS = "kind = 'watch' AND COALESCE(json_extract(config, '$.world_size'), 1) > 1"


class Store:
    """A connection to the store; use one per thread."""

    def __init__(self, path: Path | str | None = None, *, create: bool = True) -> None:
        """Opens (and if new and `create`, creates) the store (`connect`).

        Raises:
            InputError: as `connect`.
        """
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self._db = connect(self.path, create)

    @property
    def read_only(self) -> bool:
        """Opened for reading only: this process cannot write the file."""
        return self._db.read_only

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

    def update_lane(self, run_id: str, lane: int, if_running: bool = False, **fields: Any) -> bool:
        """Sets some of a lane's columns: pid, gpu_uuid, status, reason, summary, traceback;
        with `if_running`, only where the lane is still running (another process may have
        ended it since it was read). Returns whether it did."""
        allowed = {"pid", "gpu_uuid", "status", "reason", "summary", "traceback"}
        if not fields.keys() <= allowed:
            raise ValueError(f"not lane columns to update: {sorted(fields.keys() - allowed)}")
        values = {k: _column_value(v) for k, v in fields.items()}
        assignments = ", ".join(f"{name} = ?" for name in values)
        running = " AND status = 'running'" if if_running else ""
        with self.transaction() as db:
            cursor = db.execute(
                f"UPDATE lanes SET {assignments} WHERE run_id = ? AND lane = ?{running}",
                (*values.values(), run_id, lane),
            )
        return cursor.rowcount > 0

    def update_spec(self, run_id: str, **fields: Any) -> None:
        """Sets some of a run's `config["spec"]` entries: what a watched loop learns of its
        pipeline once its batches come (their image size)."""
        with self.transaction() as db:
            row = db.execute("SELECT config FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return
            config = json.loads(row["config"])
            config["spec"] = {**config.get("spec", {}), **fields}
            db.execute("UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), run_id))

    def finish_run(self, run_id: str, status: RunStatus, reason: str | None, ended_ns: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET status = ?, reason = ?, ended_ns = ? WHERE run_id = ?",
                (status.value, reason, ended_ns, run_id),
            )

    def save_session(self, session: SessionRecord) -> None:
        """Writes a session (again: its document grows as its runs end)."""
        self._save("sessions", session_row(session))

    def save_tune(self, tune: TuneRecord) -> None:
        """Writes a tune session (again: its document grows trial by trial)."""
        self._save("tunes", tune_row(tune))

    def tunes(self, run_id: str | None = None) -> list[TuneRecord]:
        """The tune sessions (of `run_id` where given), newest first."""
        rows = self._db.execute(
            "SELECT * FROM tunes WHERE ? IS NULL OR run_id = ? ORDER BY created DESC, tune_id DESC",
            (run_id, run_id),
        )
        return [tune_from_row(row) for row in rows]

    def save_launch(self, launch: LaunchRecord) -> None:
        self._save("launches", launch_row(launch))

    def _save(self, table: str, row: Sequence[Any]) -> None:
        with self.transaction() as db:
            db.execute(f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * len(row))})", row)

    def launches(self) -> list[LaunchRecord]:
        """Every launch, newest first."""
        rows = self._db.execute("SELECT * FROM launches ORDER BY created DESC, launch_id DESC")
        return [launch_from_row(row) for row in rows]

    def add_batches(self, run_id: str, events: Iterable[BatchEvent]) -> None:
        self.add_rows(run_id, batches=events)

    def add_gpu_samples(self, run_id: str, samples: Iterable[GpuSample]) -> None:
        self.add_rows(run_id, gpu=samples)

    def add_host_samples(self, run_id: str, hostname: str, samples: Iterable[HostSample]) -> None:
        self.add_rows(run_id, host={hostname: samples})

    def add_lane_cpu(self, run_id: str, samples: Iterable[LaneCpuSample]) -> None:
        self.add_rows(run_id, lane_cpu=samples)

    def add_unavailable(self, run_id: str, items: Iterable[Unavailable]) -> None:
        self.add_rows(run_id, unavailable=items)

    def add_rows(
        self,
        run_id: str,
        *,
        batches: Iterable[BatchEvent] = (),
        gpu: Iterable[GpuSample] = (),
        host: Mapping[str, Iterable[HostSample]] | None = None,
        lane_cpu: Iterable[LaneCpuSample] = (),
        unavailable: Iterable[Unavailable] = (),
    ) -> None:
        """Writes a run's batch events and samples, with their rollups, in one transaction: all
        of them or, if it raises, none.

        Raises:
            StoreBusy: another process held the write lock for longer than the busy timeout.
        """
        tables = {
            "batches": (BATCH_COLUMNS, [
                (run_id, e.lane, e.index, e.t_ns, e.wait_s, e.step_s, e.size, int(e.warmup),
                 e.epoch, int(e.synced))
                for e in batches
            ]),
            "gpu_samples": (GPU_TABLE_COLUMNS, [
                (run_id, s.gpu_uuid, s.t_ns, *(getattr(s, c) for c in GPU_COLUMNS)) for s in gpu
            ]),
            "host_samples": (HOST_COLUMNS, [
                (
                    run_id, hostname, s.t_ns, s.cpu_pct,
                    json.dumps([round(c, 1) for c in s.per_core_pct]), s.iowait_pct,
                    s.steal_pct, s.disk_read_mib_s, s.memory_used_mib, s.tree_cpu_pct,
                    s.tree_processes, s.job_cpu_pct,
                )
                for hostname, samples in (host or {}).items()
                for s in samples
            ]),
            "lane_cpu": (LANE_CPU_COLUMNS, [
                (
                    run_id, s.lane, s.t_ns, s.cpu_pct, s.main_cpu_pct, s.main_thread_cpu_pct,
                    s.processes, s.threads, s.pss_mib, s.worker_threads,
                )
                for s in lane_cpu
            ]),
        }  # fmt: skip
        missing = [(run_id, u.source, u.device, u.metric, u.reason) for u in unavailable]
        with self.transaction() as db:
            for table, (columns, rows) in tables.items():
                if rows:
                    rollups.add(db, table, run_id, columns, rows)
            db.executemany("INSERT OR IGNORE INTO unavailable VALUES (?, ?, ?, ?, ?)", missing)

    def busy_timeout(self, seconds: float = BUSY_TIMEOUT_S) -> None:
        """How long a write waits for another process's write lock before StoreBusy."""
        self._db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")

    def mark_abandoned_runs(self, hostname: str, is_alive: Any) -> list[str]:
        """Marks `running` runs of this host whose process is gone as interrupted (not those
        whose ranks write their own lanes: `RANKED_RUNS`).

        Args:
            hostname: this host: runs of other hosts are left alone.
            is_alive: called with a process id.
        """
        if self.read_only:
            return []  # a store on read-only media: nobody is running there
        rows = self._db.execute(
            "SELECT run_id, pid FROM runs WHERE status = ? AND hostname = ? "
            f"AND NOT ({RANKED_RUNS})",
            (RunStatus.RUNNING.value, hostname),
        ).fetchall()
        gone = [row["run_id"] for row in rows if row["pid"] is None or not is_alive(row["pid"])]
        if not gone:
            return []  # nothing to write: no write lock taken (readers never wait on one)
        reason = "the probe process ended without finishing the run (killed?)"
        try:
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
        except (StoreBusy, StoreFailed):
            return []  # the next reader marks them (a full disk: once it has room)
        return gone

    # reading

    def runs(self) -> list[RunRecord]:
        """Every run, newest first."""
        rows = self._db.execute("SELECT * FROM runs ORDER BY created DESC, run_id DESC")
        return [run_from_row(row) for row in rows]

    def running_ranked_runs(self, run_id: str | None = None) -> list[RunRecord]:
        """The running runs whose ranks write their own lanes (`RANKED_RUNS`); of run `run_id`
        alone (its exact id), where given."""
        query = f"SELECT * FROM runs WHERE status = ? AND {RANKED_RUNS}"
        params: tuple[Any, ...] = (RunStatus.RUNNING.value,)
        if run_id is not None:
            query, params = query + " AND run_id = ?", (*params, run_id)
        return [run_from_row(row) for row in self._db.execute(query, params)]

    def loaders(self, run: RunRecord) -> list[RunRecord]:
        """The runs of the process that watched `run`: each loader a script iterates is a
        watched run of its own, and a process is known by its first lane's host and pid (rank
        0's under torchrun). The one with the most batches (the training loader) first; [run]
        where it is not watched."""
        first = self._db.execute(
            "SELECT lane, hostname, pid FROM lanes WHERE run_id = ? ORDER BY lane LIMIT 1",
            (run.run_id,),
        ).fetchone()
        if run.kind != "watch" or first is None or first["pid"] is None:
            return [run]
        rows = self._db.execute(
            "SELECT r.*, (SELECT COALESCE(SUM(b.batches), 0) FROM batch_rollup b "
            "WHERE b.run_id = r.run_id AND b.res_s = ?) AS counted FROM runs r "
            "WHERE r.kind = 'watch' AND EXISTS (SELECT 1 FROM lanes l WHERE l.run_id = r.run_id "
            "AND l.lane = ? AND l.hostname = ? AND l.pid = ?) "
            "ORDER BY counted DESC, r.created, r.run_id",
            (rollups.COARSEST_S, first["lane"], first["hostname"], first["pid"]),
        )
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

    def gpu_samples(
        self, run_id: str, gpu_uuid: str | None = None, window: tuple[int, int] | None = None
    ) -> list[GpuSample]:
        """A run's GPU samples (of one GPU); with `window` (of one GPU), those timed in it and
        the first after it, which covers the time up to its end."""
        query, params = self._samples_query("gpu_samples", "gpu_uuid", run_id, gpu_uuid, window)
        return [
            GpuSample(
                t_ns=row["t_ns"], gpu_uuid=row["gpu_uuid"], **{c: row[c] for c in GPU_COLUMNS}
            )
            for row in self._db.execute(query, params)
        ]

    def host_samples(self, run_id: str) -> list[HostSample]:
        rows = self._db.execute(
            "SELECT * FROM host_samples WHERE run_id = ? ORDER BY t_ns", (run_id,)
        ).fetchall()
        return [host_from_row(row) for row in rows]

    def lane_cpu(
        self, run_id: str, lane: int | None = None, window: tuple[int, int] | None = None
    ) -> list[LaneCpuSample]:
        """A run's lanes' CPU samples (of one lane); `window` as for `gpu_samples`."""
        query, params = self._samples_query("lane_cpu", "lane", run_id, lane, window)
        return [
            LaneCpuSample(
                t_ns=row["t_ns"], lane=row["lane"], cpu_pct=row["cpu_pct"],
                main_cpu_pct=row["main_cpu_pct"], main_thread_cpu_pct=row["main_thread_cpu_pct"],
                processes=row["processes"], threads=row["threads"], pss_mib=row["pss_mib"],
                worker_threads=row["worker_threads"],
            )
            for row in self._db.execute(query, params)
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
        counts = {}
        for name, kind in (("gpu", GPU), ("host", HOST)):
            row = self._db.execute(
                f"SELECT COALESCE(SUM(samples), 0) FROM {kind.table} "
                "WHERE run_id = ? AND res_s = ?",
                (run_id, rollups.COARSEST_S),
            ).fetchone()
            counts[name] = row[0]
        return counts

    # aggregates: what long runs need without loading every row

    def batch_totals(self, run_id: str, lane: int, warmup: bool = False) -> BatchTotals:
        """A lane's measured batches (or its warm-up ones) summed."""
        row = self._db.execute(
            "SELECT COALESCE(SUM(batches), 0), COALESCE(SUM(images), 0), TOTAL(wait_s), "
            "TOTAL(step_s), TOTAL(seconds), MIN(first_ns), MAX(end_ns), MIN(first_idx), "
            "MAX(last_idx) FROM batch_rollup "
            "WHERE run_id = ? AND res_s = ? AND warmup = ? AND lane = ?",
            (run_id, rollups.COARSEST_S, int(warmup), lane),
        ).fetchone()
        return BatchTotals(*row)

    def batch_stats(self, run_id: str, lane: int) -> dict[str, Any]:
        """A lane's measured batches: count, first request, last end, mean step (s)."""
        totals = self.batch_totals(run_id, lane)
        return {
            "n": totals.batches,
            "start_ns": totals.first_ns,
            "end_ns": totals.end_ns,
            "step_mean_s": totals.step_s / totals.batches if totals.batches else None,
        }

    def batches_across(self, run_id: str) -> list[BatchAcross]:
        """Each batch index that every lane with measured batches measured (warm-up ones left
        out), across those lanes, in index order: where ranks' batch counts differ, the indices
        all have."""
        rows = self._db.execute(
            "SELECT MIN(step_s), MAX(step_s), MIN(wait_s + step_s), MAX(wait_s + step_s) "
            "FROM batches WHERE run_id = ? AND warmup = 0 GROUP BY idx HAVING COUNT(*) = "
            "(SELECT COUNT(DISTINCT lane) FROM batches WHERE run_id = ? AND warmup = 0) "
            "ORDER BY idx",
            (run_id, run_id),
        )
        return [BatchAcross(*row) for row in rows]

    def host_means(
        self, run_id: str, hostname: str, start_ns: int, end_ns: int
    ) -> dict[str, float | None]:
        """Mean figures of one host between two times: cpu_pct, iowait_pct, steal_pct,
        disk_read_mib_s, tree_cpu_pct (the run's processes), job_cpu_pct (the cores they may
        run on)."""
        totals = self.totals(HOST, run_id, hostname, (start_ns, end_ns))
        names = (
            "cpu_pct", "iowait_pct", "steal_pct", "disk_read_mib_s", "tree_cpu_pct", "job_cpu_pct"
        )  # fmt: skip
        return {name: totals[name].mean for name in names}

    def totals(
        self,
        kind: Samples,
        run_id: str,
        key: str | int,
        window: tuple[int, int],
        then: bool = False,
    ) -> dict[str, Totals]:
        """Each metric of `kind`'s samples of `key` (a GPU, a lane, a host) timed within
        `window` (both ends included), and with `then` the first sample after it, which covers
        the time up to its end: from whole buckets of the rollups, and the raw rows of the
        window's partial seconds at its ends."""
        whole, raw = rollups.pieces(window[0], window[1] + 1, self._origin(run_id))
        out = {m: Totals() for m in kind.metrics}
        stats = ", ".join(
            f"SUM({m}_n), TOTAL({m}_sum), MIN({m}_min), MAX({m}_max)" for m in kind.metrics
        )
        rows = [
            self._db.execute(
                f"SELECT {stats} FROM {kind.table} WHERE run_id = ? AND res_s = ? "
                f"AND {kind.key} = ? AND bucket BETWEEN ? AND ?",
                (run_id, res_s, key, first, last),
            ).fetchone()
            for res_s, first, last in whole
        ]
        stats = ", ".join(f"COUNT({m}), TOTAL({m}), MIN({m}), MAX({m})" for m in kind.metrics)
        rows += [
            self._db.execute(
                f"SELECT {stats} FROM {kind.source} WHERE run_id = ? AND {kind.key} = ? "
                "AND t_ns >= ? AND t_ns < ?",
                (run_id, key, start, end),
            ).fetchone()
            for start, end in raw
        ]
        if then:
            values = ", ".join(kind.metrics)
            after = self._db.execute(
                f"SELECT {values} FROM {kind.source} WHERE run_id = ? AND {kind.key} = ? "
                "AND t_ns > ? ORDER BY t_ns LIMIT 1",
                (run_id, key, window[1]),
            ).fetchone()
            if after is not None:
                rows.append([x for v in after for x in (int(v is not None), v or 0.0, v, v)])
        for row in rows:
            for i, m in enumerate(kind.metrics):
                out[m] += Totals(row[4 * i] or 0, row[4 * i + 1], row[4 * i + 2], row[4 * i + 3])
        return out

    def batch_ranks(
        self, run_id: str, lane: int, kind: str, ranks: Sequence[int]
    ) -> dict[int, int]:
        """Per rank (0: the shortest) of a lane's measured batches by `kind` (latency, wait or
        step), the `batch_bins` bin (its start, us) that holds it."""
        rows = self._db.execute(
            "WITH bins AS MATERIALIZED (SELECT key_us, SUM(n) OVER (ORDER BY key_us) AS upto "
            "FROM batch_bins WHERE run_id = ? AND kind = ? AND lane = ?) "
            "SELECT r.value, (SELECT MIN(key_us) FROM bins WHERE upto > r.value) "
            "FROM json_each(?) AS r",
            (run_id, kind, lane, json.dumps(sorted(set(ranks)))),
        )
        return {row[0]: row[1] for row in rows}

    def time_span(self, run_id: str) -> tuple[int, int] | None:
        """The first and last time anything of the run was recorded (monotonic ns)."""
        row = self._db.execute(
            "SELECT MIN(t), MAX(t) FROM ("
            " SELECT MIN(first_ns) AS t FROM batch_rollup WHERE run_id = :run AND res_s = :res"
            " UNION ALL SELECT MAX(end_ns) FROM batch_rollup WHERE run_id = :run AND res_s = :res"
            " UNION ALL SELECT MIN(first_ns) FROM gpu_rollup WHERE run_id = :run AND res_s = :res"
            " UNION ALL SELECT MAX(last_ns) FROM gpu_rollup WHERE run_id = :run AND res_s = :res"
            " UNION ALL SELECT MIN(first_ns) FROM host_rollup WHERE run_id = :run AND res_s = :res"
            " UNION ALL SELECT MAX(last_ns) FROM host_rollup WHERE run_id = :run AND res_s = :res)",
            {"run": run_id, "res": rollups.COARSEST_S},
        ).fetchone()
        return None if row[0] is None else (row[0], row[1])

    def lane_last_ns(self, run_id: str, lane: int) -> int | None:
        """The last time a lane recorded anything (monotonic ns): its last batch's end, or its
        last CPU sample; None where it recorded nothing."""
        row = self._db.execute(
            "SELECT MAX(t) FROM ("
            " SELECT MAX(end_ns) AS t FROM batch_rollup"
            " WHERE run_id = :run AND res_s = :res AND lane = :lane"
            " UNION ALL SELECT MAX(last_ns) FROM lane_cpu_rollup"
            " WHERE run_id = :run AND res_s = :res AND lane = :lane)",
            {"run": run_id, "res": rollups.COARSEST_S, "lane": lane},
        ).fetchone()
        return None if row[0] is None else int(row[0])

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[sqlite3.Row]:
        """The rows of one read (for the store's own modules: series, merge)."""
        return self._db.execute(sql, params).fetchall()

    # internals

    def _origin(self, run_id: str) -> int:
        """Where the run's rollup buckets start: its start."""
        row = self._db.execute("SELECT started_ns FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _samples_query(
        table: str, key: str, run_id: str, wanted: str | int | None, window: tuple[int, int] | None
    ) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"run": run_id, "key": wanted}
        query = f"SELECT * FROM {table} WHERE run_id = :run"
        if wanted is not None:
            query += f" AND {key} = :key"
        if window is not None:
            params["start"], params["end"] = window
            first_after = (
                f"SELECT MIN(t_ns) FROM {table} WHERE run_id = :run AND {key} = :key "
                "AND t_ns > :end"
            )
            query += f" AND t_ns >= :start AND t_ns <= COALESCE(({first_after}), :end)"
        return query + f" ORDER BY {key}, t_ns", params

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

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (StoreBusy, StoreFailed where refused: `connection`)."""
        return self._db.transaction()


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
