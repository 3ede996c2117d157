"""Rollups: a run's samples and batches summed per time bucket at a few resolutions, and its
batches counted by duration, kept up to date in the transaction that writes their rows, so that
opening a run, long or short, reads a bounded number of rows.

Resolutions (`RESOLUTIONS_S`): 1 s, 10 s, 60 s and 600 s, as time-series stores keep them. A chart
is about 600 points wide (`probe.store.series.POINTS`): a run of up to 10 minutes is drawn from
its raw rows (at most 6,000 a series at 10 Hz); a longer one from the coarsest resolution whose
buckets still give it two thirds of its points. Each resolution is 6 to 10 times the one below,
so a chart reads at most about 10 rows per point, and a run's totals (its counts, its time span)
read its 600 s buckets: 144 a day per GPU or lane. A time window (a lane's measured window)
is summed from the coarsest whole buckets inside it, finer ones at its ends, and the raw rows of
its last partial seconds (`pieces`): exact, and a few dozen rows whatever its length.

Buckets count from the run's start (`runs.started_ns`), as the charts do, so that a chart's
bucket is whole buckets of a resolution; where a merge moves a run's start, its rollups are built
again. A bucket keeps, per metric, the count of the samples that have it, their sum, minimum and
maximum, and its first and last time:

- `gpu_rollup` per GPU: every GPU metric but the clocks bit mask (its bits are not amounts).
- `lane_cpu_rollup` per lane, `host_rollup` per host: their CPU and memory figures; a host's
  first sample of a bucket is read by its time where a chart draws the per-core strip.
- `batch_rollup` per lane, warm-up and measured apart: batches, images, wait, step and batch
  seconds, the shortest and longest batch, the first start and the last end, the first and
  last index.
- `batch_bins` per lane: measured batches counted by latency (wait plus step), wait and step,
  each rounded to the microsecond and cut to 4 significant digits (bins of 1 us below 10 ms, of
  10 us below 100 ms, ..., at most 0.1% wide). A latency histogram whose bin width is a multiple
  of the widest such bin below its overflow (`histogram_bin_us`) counts exactly what the raw
  latencies give; a percentile read from them is within half a bin (0.05%) and half a
  microsecond of the raw one.

Writers add rows through a staging table: the new rows' sums are added to their buckets (an
upsert), so a write costs what it adds. A write that replaces rows already stored (the same key
again) builds that table's rollups of the run again from its rows, so that the rollups always
equal what the raw rows give.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probe.metrics import GPU_METRICS

RESOLUTIONS_S = (1, 10, 60, 600)
COARSEST_S = RESOLUTIONS_S[-1]
SECOND_NS = 1_000_000_000
SIGNIFICANT_DIGITS = 4  # of a batch's durations in microseconds, in `batch_bins`
BIN_KINDS = ("latency", "wait", "step")


@dataclass(frozen=True)
class Samples:
    """A table of timed samples and its rollup, per run, resolution, `key` and bucket."""

    source: str  # the raw table
    table: str
    key: str  # what the samples are of: a GPU, a lane, a host
    metrics: tuple[str, ...]


GPU = Samples(
    "gpu_samples", "gpu_rollup", "gpu_uuid", tuple(m.name for m in GPU_METRICS if not m.integer)
)
LANE_CPU = Samples(
    "lane_cpu", "lane_cpu_rollup", "lane",
    ("cpu_pct", "main_cpu_pct", "main_thread_cpu_pct", "processes", "threads", "pss_mib",
     "worker_threads"),
)  # fmt: skip
HOST = Samples(
    "host_samples", "host_rollup", "hostname",
    ("cpu_pct", "iowait_pct", "steal_pct", "disk_read_mib_s", "memory_used_mib", "tree_cpu_pct",
     "tree_processes", "job_cpu_pct"),
)  # fmt: skip
SAMPLES = (GPU, LANE_CPU, HOST)
BATCH_SUMS = ("batches", "images", "wait_s", "step_s", "seconds")


def added_metric(kind: Samples, metric: str) -> list[str]:
    """The statements that add `metric`'s columns to `kind`'s rollup table of an older store
    (its buckets hold none of it: a count of 0)."""
    return [
        f"ALTER TABLE {kind.table} ADD COLUMN {metric}_{column}"
        for column in ("n INTEGER NOT NULL DEFAULT 0", "sum REAL NOT NULL DEFAULT 0", "min REAL",
                       "max REAL")
    ]  # fmt: skip


def tables() -> str:
    """The rollups' tables."""
    out = []
    for kind in SAMPLES:
        key_type = "INTEGER" if kind.key == "lane" else "TEXT"
        stats = "".join(
            f"    {m}_n INTEGER NOT NULL, {m}_sum REAL NOT NULL, {m}_min REAL, {m}_max REAL,\n"
            for m in kind.metrics
        )
        out.append(
            f"CREATE TABLE IF NOT EXISTS {kind.table} (\n"
            f"    run_id TEXT NOT NULL, res_s INTEGER NOT NULL, {kind.key} {key_type} NOT NULL,\n"
            "    bucket INTEGER NOT NULL, samples INTEGER NOT NULL, first_ns INTEGER NOT NULL,\n"
            f"    last_ns INTEGER NOT NULL,\n{stats}"
            f"    PRIMARY KEY (run_id, res_s, bucket, {kind.key})\n) WITHOUT ROWID;\n"
        )
    out.append(
        "CREATE TABLE IF NOT EXISTS batch_rollup (\n"
        "    run_id TEXT NOT NULL, res_s INTEGER NOT NULL, warmup INTEGER NOT NULL,\n"
        "    lane INTEGER NOT NULL, bucket INTEGER NOT NULL, batches INTEGER NOT NULL,\n"
        "    images INTEGER NOT NULL, wait_s REAL NOT NULL, step_s REAL NOT NULL,\n"
        "    seconds REAL NOT NULL, latency_min_s REAL NOT NULL, latency_max_s REAL NOT NULL,\n"
        "    first_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, first_idx INTEGER NOT NULL,\n"
        "    last_idx INTEGER NOT NULL,\n"
        "    PRIMARY KEY (run_id, res_s, warmup, bucket, lane)\n) WITHOUT ROWID;\n"
        "CREATE TABLE IF NOT EXISTS batch_bins (\n"
        "    run_id TEXT NOT NULL, kind TEXT NOT NULL, lane INTEGER NOT NULL,\n"
        "    key_us INTEGER NOT NULL, n INTEGER NOT NULL,\n"
        "    PRIMARY KEY (run_id, kind, lane, key_us)\n) WITHOUT ROWID;\n"
    )
    return "".join(out)


ROLLUP_TABLES = (*(kind.table for kind in SAMPLES), "batch_rollup", "batch_bins")


def floor_div(value: str, divisor: str) -> str:
    """SQL for `value` // `divisor` rounded down, as Python does (SQLite's `/` truncates)."""
    return f"(({value}) - ((({value}) % ({divisor})) + ({divisor})) % ({divisor})) / ({divisor})"


def bin_width_us(key_us: int) -> int:
    """The width of the `batch_bins` bin that starts at `key_us`."""
    return int(10 ** max(0, len(str(abs(key_us))) - SIGNIFICANT_DIGITS))


def histogram_bin_us(wanted_ms: float, bins: int) -> int:
    """A histogram's bin width (us): `wanted_ms` or just above, a whole number of every
    `batch_bins` bin below the histogram's overflow (`bins` such widths), so that each of its
    bins counts exactly the latencies, to the microsecond, that fall in it."""
    bin_us = max(1, math.ceil(round(wanted_ms * 1000, 6)))
    while bin_us % (width := bin_width_us(bins * bin_us)):
        bin_us += width - bin_us % width
    return bin_us


def add(
    db: sqlite3.Connection, source: str, run_id: str, columns: Sequence[str], rows: Sequence[Any]
) -> None:
    """Writes rows into `source` (a table of samples, or `batches`) and adds them to its
    rollups; inside the caller's transaction."""
    if not rows:
        return
    staged = f"temp.new_{source}"
    db.execute(f"CREATE TEMP TABLE IF NOT EXISTS new_{source} AS SELECT * FROM {source} WHERE 0")
    db.execute(f"DELETE FROM {staged}")
    marks = ", ".join("?" * len(columns))
    db.executemany(f"INSERT INTO {staged} ({', '.join(columns)}) VALUES ({marks})", rows)
    before = db.total_changes
    db.execute(f"INSERT OR IGNORE INTO {source} SELECT * FROM {staged}")
    if db.total_changes - before == len(rows):
        for statement in _from_raw(source, staged, "1", RESOLUTIONS_S):
            db.execute(statement)
        return
    # Some rows were stored already (or came twice): the last one written wins, as a replace
    # does, and the run's rollups of this table are built again from its rows.
    db.execute(f"INSERT OR REPLACE INTO {source} SELECT * FROM {staged}")
    rebuild(db, run_id, (source,))


def rebuild(
    db: sqlite3.Connection,
    run_id: str | None = None,
    sources: Sequence[str] = ("gpu_samples", "lane_cpu", "host_samples", "batches"),
) -> None:
    """Builds the rollups of one run (None: of every run) again from its rows."""
    where = "1" if run_id is None else "run_id = :run"
    raw_where = "1" if run_id is None else "s.run_id = :run"
    params = {} if run_id is None else {"run": run_id}
    for source in sources:
        targets = ("batch_rollup", "batch_bins") if source == "batches" else (_kind(source).table,)
        for table in targets:
            db.execute(f"DELETE FROM {table} WHERE {where}", params)
        for statement in _from_raw(source, source, raw_where, RESOLUTIONS_S[:1]):
            db.execute(statement, params)
        for finer, res in itertools.pairwise(RESOLUTIONS_S):
            db.execute(_from_finer(source, finer, res, where), params)


def _kind(source: str) -> Samples:
    return next(kind for kind in SAMPLES if kind.source == source)


def _bucket(time: str, res: str) -> str:
    return floor_div(f"{time} - COALESCE(r.started_ns, 0)", f"{res} * {SECOND_NS}")


def _from_raw(source: str, rows: str, where: str, levels: Sequence[int]) -> list[str]:
    """Upserts of the sums of raw rows (`rows`: a table or the staged new rows) into the
    rollups of `source`, at `levels`."""
    level = " UNION ALL ".join(f"SELECT {r} AS res_s" for r in levels)
    joined = (
        f"FROM {rows} AS s CROSS JOIN ({level}) AS l LEFT JOIN runs AS r ON r.run_id = s.run_id "
        f"WHERE {where}"
    )
    if source != "batches":
        kind = _kind(source)
        stats = ", ".join(
            f"COUNT(s.{m}), TOTAL(s.{m}), MIN(s.{m}), MAX(s.{m})" for m in kind.metrics
        )
        return [
            f"INSERT INTO {kind.table} SELECT s.run_id, l.res_s, s.{kind.key}, "
            f"{_bucket('s.t_ns', 'l.res_s')} AS slot, COUNT(*), MIN(s.t_ns), MAX(s.t_ns), "
            f"{stats} {joined} GROUP BY s.run_id, l.res_s, s.{kind.key}, slot "
            + _upsert_samples(kind)
        ]
    batch_rollup = (
        "INSERT INTO batch_rollup SELECT s.run_id, l.res_s, s.warmup, s.lane, "
        f"{_bucket('s.t_ns', 'l.res_s')} AS slot, COUNT(*), SUM(s.size), TOTAL(s.wait_s), "
        "TOTAL(s.step_s), TOTAL(s.wait_s + s.step_s), MIN(s.wait_s + s.step_s), "
        "MAX(s.wait_s + s.step_s), MIN(s.t_ns), "
        "MAX(s.t_ns + CAST((s.wait_s + s.step_s) * 1e9 AS INTEGER)), MIN(s.idx), MAX(s.idx) "
        f"{joined} GROUP BY s.run_id, l.res_s, s.warmup, s.lane, slot " + _UPSERT_BATCHES
    )
    kinds = " UNION ALL ".join(f"SELECT '{k}' AS kind" for k in BIN_KINDS)
    batch_bins = (
        "INSERT INTO batch_bins SELECT run_id, kind, lane, "
        f"{_significant('us')} AS key_us, COUNT(*) FROM ("
        " SELECT s.run_id AS run_id, k.kind AS kind, s.lane AS lane, CAST(ROUND(CASE k.kind"
        " WHEN 'latency' THEN s.wait_s + s.step_s WHEN 'wait' THEN s.wait_s ELSE s.step_s END"
        f" * 1e6) AS INTEGER) AS us FROM {rows} AS s CROSS JOIN ({kinds}) AS k"
        f" WHERE s.warmup = 0 AND {where}"
        ") WHERE 1 GROUP BY run_id, kind, lane, key_us "
        "ON CONFLICT (run_id, kind, lane, key_us) DO UPDATE SET n = n + excluded.n"
    )
    return [batch_rollup, batch_bins]


def _from_finer(source: str, finer: int, res: int, where: str) -> str:
    """The rollups of `source` at `res` from those at `finer` (buckets of whole finer ones)."""
    slot = floor_div("bucket", str(res // finer))
    if source == "batches":
        return (
            f"INSERT INTO batch_rollup SELECT run_id, {res}, warmup, lane, {slot} AS slot, "
            "SUM(batches), SUM(images), TOTAL(wait_s), TOTAL(step_s), TOTAL(seconds), "
            "MIN(latency_min_s), MAX(latency_max_s), MIN(first_ns), MAX(end_ns), "
            f"MIN(first_idx), MAX(last_idx) FROM batch_rollup WHERE res_s = {finer} AND {where} "
            "GROUP BY run_id, warmup, lane, slot " + _UPSERT_BATCHES
        )
    kind = _kind(source)
    stats = ", ".join(
        f"SUM({m}_n), TOTAL({m}_sum), MIN({m}_min), MAX({m}_max)" for m in kind.metrics
    )
    return (
        f"INSERT INTO {kind.table} SELECT run_id, {res}, {kind.key}, {slot} AS slot, "
        f"SUM(samples), MIN(first_ns), MAX(last_ns), {stats} FROM {kind.table} "
        f"WHERE res_s = {finer} AND {where} GROUP BY run_id, {kind.key}, slot "
        + _upsert_samples(kind)
    )


def _least(column: str, how: str = "MIN") -> str:
    """The smaller (or larger) of a bucket's value and the new one's, either of which may be
    NULL (SQLite's two-argument MIN is NULL if one is)."""
    return f"{column} = COALESCE({how}({column}, excluded.{column}), {column}, excluded.{column})"


def _upsert_samples(kind: Samples) -> str:
    sets = ["samples = samples + excluded.samples", _least("first_ns"), _least("last_ns", "MAX")]
    for m in kind.metrics:
        sets += [f"{m}_n = {m}_n + excluded.{m}_n", f"{m}_sum = {m}_sum + excluded.{m}_sum",
                 _least(f"{m}_min"), _least(f"{m}_max", "MAX")]  # fmt: skip
    return f"ON CONFLICT (run_id, res_s, bucket, {kind.key}) DO UPDATE SET {', '.join(sets)}"


_BATCH_EXTREMES = (
    ("latency_min_s", "MIN"), ("latency_max_s", "MAX"), ("first_ns", "MIN"), ("end_ns", "MAX"),
    ("first_idx", "MIN"), ("last_idx", "MAX"),
)  # fmt: skip
_BATCH_SETS = [
    *(f"{c} = {c} + excluded.{c}" for c in BATCH_SUMS),
    *(_least(c, how) for c, how in _BATCH_EXTREMES),
]
_UPSERT_BATCHES = "ON CONFLICT (run_id, res_s, warmup, bucket, lane) DO UPDATE SET " + ", ".join(
    _BATCH_SETS
)


def _significant(us: str) -> str:
    """SQL for `us` cut to SIGNIFICANT_DIGITS digits (`bin_width_us` wide)."""
    cases = " ".join(
        f"WHEN {us} < {10 ** (SIGNIFICANT_DIGITS + i)} THEN {us} - {us} % {10**i}"
        for i in range(16)
    )
    return f"CASE WHEN {us} < {10**SIGNIFICANT_DIGITS} THEN {us} {cases} ELSE {us} END"


@dataclass(frozen=True)
class Totals:
    """One metric over a time window: how many samples had it, their sum, minimum, maximum."""

    count: int = 0
    total: float = 0.0
    low: float | None = None
    high: float | None = None

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def __add__(self, other: Totals) -> Totals:
        lows = [v for v in (self.low, other.low) if v is not None]
        highs = [v for v in (self.high, other.high) if v is not None]
        return Totals(
            self.count + other.count,
            self.total + other.total,
            min(lows) if lows else None,
            max(highs) if highs else None,
        )


@dataclass(frozen=True)
class BatchTotals:
    """A lane's batches (measured, or warm-up) summed."""

    batches: int = 0
    images: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    seconds: float = 0.0  # wait plus step
    first_ns: int | None = None  # the first start
    end_ns: int | None = None  # the last end
    first_idx: int | None = None
    last_idx: int | None = None


def pieces(
    start_ns: int, end_ns: int, origin_ns: int, levels: Sequence[int] = RESOLUTIONS_S[::-1]
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The time range [start, end) as whole buckets, the coarsest that fit first:
    (resolution s, first bucket, last bucket) each, and the raw time ranges [from, to) left
    at its ends, shorter than a second."""
    if start_ns >= end_ns:
        return [], []
    if not levels:
        return [], [(start_ns, end_ns)]
    res = levels[0] * SECOND_NS
    first = -((origin_ns - start_ns) // res)  # the first bucket that starts in the range
    last = (end_ns - origin_ns) // res - 1  # the last that ends in it
    if first > last:
        return pieces(start_ns, end_ns, origin_ns, levels[1:])
    left = pieces(start_ns, origin_ns + first * res, origin_ns, levels[1:])
    right = pieces(origin_ns + (last + 1) * res, end_ns, origin_ns, levels[1:])
    return [(levels[0], first, last), *left[0], *right[0]], [*left[1], *right[1]]
