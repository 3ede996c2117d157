"""Rollups: what a run's series, figures, diagnosis and reports read from them equals what its
raw rows give, while it records, once it ended, after a merge moved its start, and in a store
migrated from the schema before them.

Tolerances, and why: sums are added in another order (a bucket's, then the buckets'), so sums,
means and rates agree to 1e-9 (relative), not to the last bit. A running lane's percentiles come
from bins of 4 significant digits of microseconds: within half a bin (0.05%) and half a
microsecond. Its errors of images/s and data-wait come from blocks of whole seconds instead of
blocks of batches: two estimates of one 95% interval from the same batches, within a factor of 1.5.
Its CPU figures are its window's samples' mean, not over its batches' time as the figures a lane
stores are (the rollups keep no sample's overlap with the batches): they agree with that mean.
Everything else (counts, times, minima, maxima, histogram counts) is exact.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.judge.diagnosis import diagnose_run, judge_run
from probe.judge.facts import host_load, run_facts
from probe.lane_figures import LaneFigures, Reading, lane_figures
from probe.present.report import build_report, render
from probe.records import (
    BatchEvent,
    GpuSample,
    HostSample,
    LaneCpuSample,
    LaneRecord,
    RunExport,
    RunRecord,
    RunStatus,
)
from probe.store import rollups
from probe.store.db import Store
from probe.store.documents import lane_figures_from_rollups, lane_figures_of, read_run
from probe.store.merge import import_run
from probe.store.series import RunSeries, latency_histogram, run_series

START = 7_000_000_000  # the run's start, monotonic ns
GPUS = ("GPU-gpm", "GPU-old")  # the second has no GPM: its busy-ness is kernel-active
REL = 1e-9


def record(store: Store, run_id: str, first_s: float, last_s: float, chunk_s: float = 7.3) -> None:
    """Writes [first_s, last_s) of a synthetic two-lane run in chunks, as a recorder does:
    GPU, lane CPU and host samples at 10 Hz, batches at about 10 a second per lane (warm-up
    first, an epoch every 300 batches, a stall now and then), some metrics missing."""
    rng = random.Random(int(first_s * 1000))
    t = first_s
    while t < last_s:
        end = min(last_s, t + chunk_s)
        ticks = range(math.ceil(t * 10), math.ceil(end * 10))
        gpu, cpu, host, batches = [], [], [], []
        for tick in ticks:
            t_ns = START + tick * 100_000_000 + rng.randrange(1000)
            for lane, uuid in enumerate(GPUS):
                busy = 50 + 40 * math.sin(tick / 300 + lane) * (0.2 if rng.random() < 0.01 else 1)
                gpm = lane == 0
                gpu.append(GpuSample(
                    t_ns, uuid, busy + 5, busy if gpm else None, busy / 3 if gpm else None,
                    None if tick % 7 == 0 else rng.random() * 10, None, 1000.0 + tick % 500, 3.0,
                    4.0, 300.0, tick % 4,
                ))  # fmt: skip
                cpu.append(LaneCpuSample(
                    t_ns + 7, lane, 100 + rng.random() * 50, 60.0, 40 + rng.random(), 3, 20,
                    None if tick % 5 else 800.0 + tick % 97, None if tick % 3 else 2 + tick % 5,
                ))  # fmt: skip
                index = tick
                wait = 2.0 if rng.random() < 0.002 else rng.expovariate(1 / 0.02)
                batches.append(BatchEvent(
                    lane, index, t_ns + 13, wait, 0.07 + 0.01 * lane, 32, index < 15, index // 300
                ))  # fmt: skip
            cores = tuple(rng.random() * 100 for _ in range(4))
            host.append(HostSample(
                t_ns + 3, sum(cores) / 4, cores, rng.random(), 0.0, rng.random() * 9, 9000.0,
                150 + rng.random() * 10, 3, sum(cores[:2]) / 2,
            ))  # fmt: skip
        store.add_gpu_samples(run_id, gpu)
        store.add_lane_cpu(run_id, cpu)
        store.add_host_samples(run_id, "h", host)
        store.add_batches(run_id, batches)
        t = end


def new_run(store: Store, run_id: str, started_ns: int = START) -> RunRecord:
    host = {"cpus": 4, "gpus": [{"index": i, "uuid": u, "name": "G"} for i, u in enumerate(GPUS)]}
    config = {
        "spec": {"batch_size": 32, "dataloader": {"num_workers": 2}},
        "lanes": [{"lane": 0}, {"lane": 1}],
    }
    run = RunRecord(run_id, "watch", "2026-11-21T00:00:00Z", RunStatus.RUNNING, None, "torch",
                    "model:x", None, config, host, "h", None, started_ns, None)  # fmt: skip
    lanes = [LaneRecord(run_id, i, i, u, i, 2, "h", None, RunStatus.RUNNING, None, None)
             for i, u in enumerate(GPUS)]  # fmt: skip
    store.create_run(run, lanes)
    return run


def close(mine: Any, raw: Any, rel: float = REL, path: str = "") -> None:
    """Asserts that two JSON-like values agree: numbers within `rel`, the rest exactly."""
    if isinstance(raw, dict):
        assert isinstance(mine, dict) and mine.keys() == raw.keys(), path
        for key in raw:
            close(mine[key], raw[key], rel, f"{path}.{key}")
    elif isinstance(raw, list | tuple):
        assert isinstance(mine, list | tuple) and len(mine) == len(raw), path
        for i, (a, b) in enumerate(zip(mine, raw, strict=True)):
            close(a, b, rel, f"{path}[{i}]")
    elif isinstance(raw, float) and not isinstance(mine, bool):
        assert mine == pytest.approx(raw, rel=rel, abs=1e-12), path
    else:
        assert mine == raw, path


# What the raw rows give: the series, histogram and aggregates computed from every row.


def raw_series(store: Store, run_id: str, bucket_s: float) -> dict[str, Any]:
    """The charts' data computed from every raw row, bucket by bucket, as `run_series` draws
    it (the buckets `run_series` chose)."""
    start = store.run(run_id).started_ns
    bucket = round(bucket_s * 1e9)
    batch_bucket = max(1_000_000_000, bucket)
    lanes: dict[int, dict[int, list[BatchEvent]]] = {}
    for e in store.batches(run_id):
        if not e.warmup:
            lanes.setdefault(e.lane, {}).setdefault((e.t_ns - start) // batch_bucket, []).append(e)
    out: dict[str, Any] = {"lanes": {}, "cpu": {}, "gpus": {}}
    for lane, intervals in lanes.items():
        columns: dict[str, list[Any]] = {"t_s": [], "images_per_s": [], "data_wait_frac": [],
                                         "latency_mean_ms": [], "latency_max_ms": []}  # fmt: skip
        for slot, events in sorted(intervals.items()):
            wait, step = sum(e.wait_s for e in events), sum(e.step_s for e in events)
            latencies = [e.wait_s + e.step_s for e in events]
            columns["t_s"].append((slot + 0.5) * batch_bucket / 1e9)
            columns["images_per_s"].append(sum(e.size for e in events) / (batch_bucket / 1e9))
            columns["data_wait_frac"].append(wait / (wait + step))
            columns["latency_mean_ms"].append(1e3 * sum(latencies) / len(latencies))
            columns["latency_max_ms"].append(1e3 * max(latencies))
        out["lanes"][lane] = columns
    cpu: dict[int, dict[int, list[float]]] = {}
    for s in store.lane_cpu(run_id):
        cpu.setdefault(s.lane, {}).setdefault((s.t_ns - start) // bucket, []).append(s.cpu_pct)
    for lane, loads in cpu.items():
        means = [sum(values) / len(values) for _, values in sorted(loads.items())]
        out["cpu"][lane] = {"t_s": [k * bucket / 1e9 for k in sorted(loads)], "cpu_pct": means}
    for uuid in GPUS:
        sampled: dict[int, list[GpuSample]] = {}
        for g in store.gpu_samples(run_id, uuid):
            sampled.setdefault((g.t_ns - start) // bucket, []).append(g)
        busy = "sm_active_pct" if uuid == GPUS[0] else "kernel_active_pct"
        bands = {}
        shown = (("busy", busy), ("kernel_active", "kernel_active_pct"),
                 ("nvjpg", "nvjpg_pct"), ("memory_mib", "memory_used_mib"))  # fmt: skip
        for name, column in shown:
            band: dict[str, list[Any]] = {"t_s": [], "low": [], "mean": [], "high": []}
            for slot, samples in sorted(sampled.items()):
                values = [getattr(g, column) for g in samples if getattr(g, column) is not None]
                band["t_s"].append(slot * bucket / 1e9)
                band["low"].append(min(values) if values else None)
                band["mean"].append(sum(values) / len(values) if values else None)
                band["high"].append(max(values) if values else None)
            bands[name] = band
        out["gpus"][uuid] = bands
    first: dict[int, HostSample] = {}
    for h in store.host_samples(run_id):
        first.setdefault((h.t_ns - start) // bucket, h)
    rows = [first[k] for k in sorted(first)]
    out["strip"] = {"t_s": [(h.t_ns - start) / 1e9 for h in rows],
                    "per_core": [[h.per_core_pct[c] for h in rows] for c in range(4)],
                    "total": [h.cpu_pct for h in rows]}  # fmt: skip
    return out


def drawn(series: RunSeries) -> dict[str, Any]:
    """What `run_series` gave, in `raw_series`' shape."""
    lanes = {x.lane: {k: getattr(x, k) for k in ("t_s", "images_per_s", "data_wait_frac",
                                                 "latency_mean_ms", "latency_max_ms")}
             for x in series.lanes if x.t_s}  # fmt: skip
    cpu = {x.lane: {"t_s": x.cpu_t_s, "cpu_pct": x.cpu_pct} for x in series.lanes if x.cpu_t_s}
    gpus = {
        g.uuid: {name: dataclasses.asdict(getattr(g, name))
                 for name in ("busy", "kernel_active", "nvjpg", "memory_mib")}
        for g in series.gpus
    }  # fmt: skip
    assert series.cpu is not None
    strip = {"t_s": series.cpu.t_s, "per_core": series.cpu.per_core, "total": series.cpu.total}
    return {"lanes": lanes, "cpu": cpu, "gpus": gpus, "strip": strip}


def raw_histogram(store: Store, run_id: str, bin_ms: float, bins: int) -> dict[int, Counter[int]]:
    """Each lane's measured batches counted by latency (to the microsecond) in bins."""
    bin_us = round(bin_ms * 1000)
    out: dict[int, Counter[int]] = {}
    for e in store.batches(run_id):
        if not e.warmup:
            us = round((e.wait_s + e.step_s) * 1e6)
            out.setdefault(e.lane, Counter())[min(us // bin_us, bins)] += 1
    return out


def raw_lane_figures(store: Store, run: RunRecord, lane: int, uuid: str) -> LaneFigures:
    events = store.batches(run.run_id, lane)
    cpu = [s for s in store.lane_cpu(run.run_id) if s.lane == lane]
    return lane_figures(events, store.gpu_samples(run.run_id, uuid), cpu, reading=Reading.of(run))


def raw_aggregates(path: Path, run_id: str, hostname: str = "h") -> dict[str, Any]:
    """What the store's aggregates were computed from before rollups: every raw row."""
    db = sqlite3.connect(path)
    count = "SELECT COUNT(*) FROM {} WHERE run_id = ?"
    out: dict[str, Any] = {
        "gpu": db.execute(count.format("gpu_samples"), (run_id,)).fetchone()[0],
        "host": db.execute(count.format("host_samples"), (run_id,)).fetchone()[0],
        "span": db.execute(
            "SELECT MIN(t), MAX(t) FROM (SELECT MIN(t_ns) AS t FROM batches WHERE run_id = :r"
            " UNION ALL SELECT MAX(t_ns + CAST((wait_s + step_s) * 1e9 AS INTEGER)) FROM batches"
            " WHERE run_id = :r UNION ALL SELECT MIN(t_ns) FROM gpu_samples WHERE run_id = :r"
            " UNION ALL SELECT MAX(t_ns) FROM gpu_samples WHERE run_id = :r"
            " UNION ALL SELECT MIN(t_ns) FROM host_samples WHERE run_id = :r"
            " UNION ALL SELECT MAX(t_ns) FROM host_samples WHERE run_id = :r)", {"r": run_id}
        ).fetchone(),
    }  # fmt: skip
    for lane in (0, 1):
        n, start, end, step = db.execute(
            "SELECT COUNT(*), MIN(t_ns), MAX(t_ns + CAST((wait_s + step_s) * 1e9 AS INTEGER)), "
            "AVG(step_s) FROM batches WHERE run_id = ? AND lane = ? AND warmup = 0", (run_id, lane)
        ).fetchone()  # fmt: skip
        out[f"stats{lane}"] = {"n": n, "start_ns": start, "end_ns": end, "step_mean_s": step}
        if n:
            row = db.execute(
                "SELECT AVG(cpu_pct), AVG(iowait_pct), AVG(steal_pct), AVG(disk_read_mib_s), "
                "AVG(tree_cpu_pct), AVG(job_cpu_pct) FROM host_samples WHERE run_id = ? "
                "AND hostname = ? AND t_ns BETWEEN ? AND ?", (run_id, hostname, start, end)
            ).fetchone()  # fmt: skip
            names = (
                "cpu_pct", "iowait_pct", "steal_pct", "disk_read_mib_s", "tree_cpu_pct",
                "job_cpu_pct",
            )  # fmt: skip
            out[f"host{lane}"] = dict(zip(names, row, strict=True))
    db.close()
    return out


def assert_reads_agree(store: Store, run_id: str) -> None:
    """The series (at several widths: raw rows and three resolutions), the histogram, the
    counts, span and lane aggregates of `run_id` agree with what its raw rows give."""
    for points in (600, 60, 5, 4000):
        series = run_series(store, run_id, points=points)
        assert series is not None
        assert series.bucket_s < 1 or series.bucket_s == int(series.bucket_s)  # raw, or whole
        close(drawn(series), raw_series(store, run_id, series.bucket_s), path=f"points {points}")
    histogram = latency_histogram(store, run_id, bins=40)
    assert histogram is not None
    raw = raw_histogram(store, run_id, histogram.bin_ms, 40)
    for lane, (starts, counts) in histogram.lanes.items():
        bins = {round(s / histogram.bin_ms): n for s, n in zip(starts, counts, strict=True)}
        assert bins == dict(raw[lane])
    expected = raw_aggregates(store.path, run_id)
    assert store.sample_counts(run_id) == {"gpu": expected["gpu"], "host": expected["host"]}
    assert store.time_span(run_id) == tuple(expected["span"])
    for lane in (0, 1):
        close(store.batch_stats(run_id, lane), expected[f"stats{lane}"])
        stats = expected[f"stats{lane}"]
        if stats["n"]:
            means = store.host_means(run_id, "h", stats["start_ns"], stats["end_ns"])
            close(means, expected[f"host{lane}"])


def rollup_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(path)
    out = {t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3, 4, 5").fetchall()
           for t in rollups.ROLLUP_TABLES}  # fmt: skip
    db.close()
    return out


# The tests


def test_a_run_still_recording_reads_what_its_raw_rows_give(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        run = new_run(store, "live")
        record(store, "live", -0.35, 95.0)  # a few samples before its start, too
        assert_reads_agree(store, "live")  # a minute and a half in: raw rows and 1 s buckets
        record(store, "live", 95.0, 1300.0)
        assert_reads_agree(store, "live")
        for lane, uuid in enumerate(GPUS):  # no stored figures: read from the rollups
            record_ = store.lanes("live")[lane]
            mine = lane_figures_of(store, run, record_)
            assert mine == lane_figures_from_rollups(store, run, record_)
            raw = raw_lane_figures(store, run, lane, uuid)
            assert_figures_agree(mine, raw)
            totals = store.batch_totals("live", lane)
            assert totals.first_ns is not None and totals.end_ns is not None
            window = store.lane_cpu("live", lane, (totals.first_ns, totals.end_ns))
            for name in ("cpu_pct", "main_thread_cpu_pct"):
                values = [getattr(s, name) for s in window]
                close(getattr(mine, name), sum(values) / len(values), path=name)


def assert_figures_agree(mine: LaneFigures, raw: LaneFigures) -> None:
    exact = ("warmup_batches", "batches", "images", "sm_active_source", "memory_used_mib",
             "pss_mib", "worker_threads")  # fmt: skip
    for name in exact:
        assert getattr(mine, name) == getattr(raw, name), name
    for name in ("warmup_s", "seconds", "wall_s", "images_per_s", "data_wait_frac",
                 "sm_active_pct", "kernel_active_pct", "sm_occupancy_pct",
                 "nvjpg_pct"):  # fmt: skip
        close(getattr(mine, name), getattr(raw, name), path=name)
    binned = [(mine.wait_ms_p50, raw.wait_ms_p50), (mine.step_ms_p50, raw.step_ms_p50)]
    binned += list(zip(dataclasses.astuple(mine.batch_latency_ms),
                       dataclasses.astuple(raw.batch_latency_ms), strict=True))  # fmt: skip
    for value, expected in binned:
        assert value == pytest.approx(expected, rel=5e-4, abs=5e-4)  # half a bin, half a us
    for error, expected in ((mine.images_per_s_error, raw.images_per_s_error),
                            (mine.data_wait_frac_error, raw.data_wait_frac_error)):  # fmt: skip
        assert error is not None and expected is not None
        assert expected / 1.5 <= error <= expected * 1.5
    assert mine.blocks == raw.blocks
    assert mine.epoch_start is None  # needs the batches one by one: stored at the lane's end


def test_an_ended_run_reads_its_diagnosis_and_report_as_its_raw_rows_give(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        run = new_run(store, "done")
        record(store, "done", 0.0, 900.0, chunk_s=31.0)
        for lane, uuid in enumerate(GPUS):  # the figures a lane stores when it ends
            store.update_lane("done", lane, status=RunStatus.COMPLETED,
                              summary=raw_lane_figures(store, run, lane, uuid))  # fmt: skip
        store.finish_run("done", RunStatus.COMPLETED, None, START + 900 * 10**9)
        assert_reads_agree(store, "done")
        document = read_run(store, "done")
        expected = raw_aggregates(store.path, "done")
        assert document.samples == {"gpu": expected["gpu"], "host": expected["host"]}
        # the diagnosis: the facts with the host's load and the mean step from the raw rows
        facts = [
            dataclasses.replace(
                f,
                host=host_load(expected[f"host{f.lane}"], run.host),
                step_ms_mean=expected[f"stats{f.lane}"]["step_mean_s"] * 1e3,
            )
            for f in run_facts(store, "done")
        ]
        close(
            diagnose_run(store, "done").to_json(),
            judge_run("done", RunStatus.COMPLETED, facts).to_json(),
        )
        report = build_report(store, "done").to_json()
        close(report["run"], document.to_json())
        series = run_series(store, "done")
        assert series is not None
        close(drawn(series), raw_series(store, "done", report["series"]["bucket_s"]))
        assert "data-wait" in render(build_report(store, "done"), "md")


def test_a_store_of_the_schema_before_gains_rollups_from_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Store(path) as store:
        new_run(store, "old")
        record(store, "old", 0.0, 400.0)
    written = rollup_rows(path)
    old = sqlite3.connect(path)  # as schema 6 had it: no rollups
    for table in rollups.ROLLUP_TABLES:
        old.execute(f"DROP TABLE {table}")
    old.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    old.commit()
    old.close()
    with Store(path) as store:
        close(rollup_rows(path), written)
        assert_reads_agree(store, "old")


def test_rows_written_again_leave_the_rollups_as_the_rows_give_them(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        new_run(store, "again")
        record(store, "again", 0.0, 60.0)
        record(store, "again", 30.0, 90.0)  # half of it again, and different: the last wins
        store.add_gpu_samples("again", [GpuSample(START, GPUS[0], 1.0, 2.0, *[None] * 8)] * 2)
        assert_reads_agree(store, "again")
        written = rollup_rows(store.path)
        with store.transaction() as db:
            rollups.rebuild(db, "again")
        close(rollup_rows(store.path), written)


def test_a_merge_that_moves_the_start_builds_the_rollups_again(tmp_path: Path) -> None:
    with Store(tmp_path / "here.db") as here, Store(tmp_path / "there.db") as there:
        new_run(here, "joined", started_ns=START + 40 * 10**9)
        record(here, "joined", 40.0, 300.0)
        run = new_run(there, "joined")  # lanes 2 and 3, started 40 s before
        run = dataclasses.replace(run, config={**run.config, "lanes": [{"lane": 2}, {"lane": 3}]})
        lanes = [dataclasses.replace(lane, lane=lane.lane + 2) for lane in there.lanes("joined")]
        export = RunExport(run, lanes, [], [], {}, [], [])
        import_run(here, export)
        assert here.run("joined").started_ns == START
        assert_reads_agree(here, "joined")


def test_a_real_probe_run_reads_as_its_rows_give(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    make_sample_dataset(photos, SampleParams(count=32, classes=2, seed=3))
    db = tmp_path / "s.db"
    result = probe_cli("run", "--data", photos, "--db", db, "--json", "--gpus", "none",
                       "--batch-size", "8", "--image-size", "64", "--warmup", "2",
                       "--num-shards", "2", "--batches", "12", "--workers", "1",
                       "--consumer", "sleep:5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["run_id"]
    with Store(db) as store:
        run = store.run(run_id)
        expected = raw_aggregates(db, run_id, run.hostname)
        assert store.sample_counts(run_id) == {"gpu": expected["gpu"], "host": expected["host"]}
        assert store.time_span(run_id) == tuple(expected["span"])
        for lane in store.lanes(run_id):
            close(store.batch_stats(run_id, lane.lane), expected[f"stats{lane.lane}"])
            stats = expected[f"stats{lane.lane}"]
            means = store.host_means(run_id, lane.hostname, stats["start_ns"], stats["end_ns"])
            close(means, expected[f"host{lane.lane}"])
            stored = LaneFigures.from_json(lane.summary or {})
            raw = lane_figures(store.batches(run_id, lane.lane), [],
                               [s for s in store.lane_cpu(run_id) if s.lane == lane.lane],
                               reading=Reading.of(run))  # fmt: skip
            for name in ("batches", "images_per_s", "data_wait_frac", "cpu_pct", "pss_mib"):
                assert getattr(stored, name) == getattr(raw, name), name
        series = run_series(store, run_id)
        assert series is not None and series.cpu is not None
        assert all(lane.t_s for lane in series.lanes)


def test_a_time_window_is_whole_buckets_and_raw_seconds_at_its_ends() -> None:
    second = rollups.SECOND_NS
    whole, raw = rollups.pieces(5 * second + 1, 1234 * second + 7, 0)
    assert raw == [(5 * second + 1, 6 * second), (1234 * second, 1234 * second + 7)]
    covered = sorted((first * r, (last + 1) * r) for r, first, last in whole)
    assert covered[0][0] == 6 and covered[-1][1] == 1234
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    assert (600, 1, 1) in whole  # 600 s to 1200 s in one bucket
    assert len(whole) <= 7


@pytest.mark.parametrize("wanted_ms", [0.05, 0.25, 1.0, 3.14159, 47.3, 812.0, 12345.6])
def test_histogram_bins_hold_whole_stored_bins(wanted_ms: float) -> None:
    bin_us = rollups.histogram_bin_us(wanted_ms, 60)
    assert wanted_ms * 1000 <= bin_us <= wanted_ms * 1000 * 1.07 + 1
    assert bin_us % rollups.bin_width_us(60 * bin_us) == 0
