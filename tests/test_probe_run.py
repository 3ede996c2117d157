"""Real probe runs on the CPU: both pipelines, one and two lanes, every consumer kind; what the
JSON says is what the store holds; interrupted and failed runs keep their data; bad input is
refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from pipelines import Backend, DaliOptions, DataLoaderOptions, PipelineSpec
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.measure.config import ProbeConfig, plan_lanes
from probe.measure.consumers import parse_consumer
from probe.measure.runner import run_probe
from probe.records import RunStatus
from probe.store.db import Store

SMALL = [
    "--batch-size", "8", "--image-size", "64", "--warmup", "2", "--batches", "4",
    "--workers", "1", "--threads", "1", "--sample-hz", "20",
]  # fmt: skip
LANE_KEYS = {
    "lane", "gpu", "gpu_uuid", "shard_id", "num_shards", "batches", "images", "images_per_s",
    "data_wait_frac", "batch_latency_ms", "sm_active_pct", "sm_active_source",
}  # fmt: skip


def probe(*args: Any, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m probe ARGS` with CUDA's devices hidden: a machine without GPUs, on any machine
    (what the host records and what a refused `--gpus` lists are then the same everywhere)."""
    return probe_cli(*args, timeout=timeout, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=2))
    return root


@pytest.mark.parametrize(
    ("pipeline", "lanes", "consumer"),
    [
        ("torch", 1, "none"),
        ("torch", 2, "sleep:15"),
        ("torch", 1, "model:small-resnet"),
        ("dali", 2, "none"),
        ("dali", 1, "sleep:15"),
        ("dali", 2, "model:small-resnet"),
    ],
)
def test_a_cpu_run_is_stored_as_its_json_says(
    tmp_path: Path, photos: Path, pipeline: str, lanes: int, consumer: str
) -> None:
    db = tmp_path / "store.db"
    result = probe(
        "run", "--pipeline", pipeline, "--gpus", "none", "--num-shards", lanes,
        "--consumer", consumer, "--data", photos, "--db", db, "--json", *SMALL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "feedscope.run/1"
    assert document["status"] == "completed"
    assert document["pipeline"] == pipeline
    assert document["consumer"] == consumer
    assert document["host"]["cpus"] >= 1
    assert document["host"]["gpus"] == []
    assert document["samples"]["gpu"] == 0
    assert document["samples"]["host"] > 0
    assert [lane["shard_id"] for lane in document["lanes"]] == list(range(lanes))
    assert document["images_per_s"] == pytest.approx(
        sum(x["images_per_s"] for x in document["lanes"])
    )
    for lane in document["lanes"]:
        assert lane.keys() >= LANE_KEYS
        assert lane["status"] == "completed"
        assert (lane["gpu"], lane["gpu_uuid"], lane["sm_active_source"]) == (None, None, None)
        assert lane["num_shards"] == lanes
        assert lane["batches"] == 4
        assert lane["images"] == 32
        assert lane["images_per_s"] > 0
        assert 0 < lane["data_wait_frac"] <= 1
        latency = lane["batch_latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
        assert lane["cpu_pct"] is not None
        if consumer.startswith("sleep"):
            assert 15 <= lane["step_ms_p50"] < 60
        if consumer == "none":
            assert lane["data_wait_frac"] > 0.9  # the pipeline alone: all time is waiting

    shown = probe("show", document["run_id"], "--db", db, "--json")
    assert json.loads(shown.stdout) == document
    with Store(db) as store:
        run_id = document["run_id"]
        assert store.run(run_id).status is RunStatus.COMPLETED
        events = store.batches(run_id)
        assert store.sample_counts(run_id) == document["samples"]
        assert {s.lane for s in store.lane_cpu(run_id)} == set(range(lanes))
        for lane in document["lanes"]:
            mine = [e for e in events if e.lane == lane["lane"]]
            assert [e.warmup for e in mine] == [True] * 2 + [False] * 4
            assert sum(e.size for e in mine if not e.warmup) == lane["images"]
    listing = json.loads(probe("runs", "--db", db, "--json").stdout)
    assert [(r["run_id"], r["status"], r["pipeline"]) for r in listing] == [
        (document["run_id"], "completed", pipeline)
    ]
    assert listing[0]["created"] == document["created"]


def measured_batches(db: Path) -> int:
    try:
        with sqlite3.connect(db) as connection:
            (count,) = connection.execute(
                "SELECT COUNT(*) FROM batches WHERE warmup = 0"
            ).fetchone()
            return int(count)
    except sqlite3.Error:
        return 0


def test_ctrl_c_keeps_the_run_and_marks_it_interrupted(tmp_path: Path, photos: Path) -> None:
    db = tmp_path / "store.db"
    command = [
        sys.executable, "-m", "probe", "run", "--gpus", "none", "--num-shards", "2",
        "--data", str(photos), "--db", str(db), "--duration", "120", "--batch-size", "8",
        "--image-size", "64", "--workers", "1", "--warmup", "1", "--json",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while measured_batches(db) < 4 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    document = json.loads(stdout)
    assert document["status"] == "interrupted"
    assert {lane["status"] for lane in document["lanes"]} == {"interrupted"}
    assert sum(lane["batches"] for lane in document["lanes"]) >= 4
    with Store(db) as store:
        assert store.run(document["run_id"]).status is RunStatus.INTERRUPTED
        assert len(store.batches(document["run_id"])) >= 4


def config_for(root: Path, lanes: int, **changes: Any) -> ProbeConfig:
    spec = PipelineSpec(
        root, batch_size=8, image_size=64, shuffle=False,
        dataloader=DataLoaderOptions(num_workers=1), dali=DaliOptions(num_threads=1),
    )  # fmt: skip
    settings: dict[str, Any] = {
        "backend": Backend.TORCH, "spec": spec, "lanes": plan_lanes(None, lanes),
        "consumer": parse_consumer("none"), "warmup": 1, "batches": 3, "duration_s": None,
        "sample_hz": 10,
    }  # fmt: skip
    settings.update(changes)
    return ProbeConfig(**settings)


def test_a_failing_lane_fails_the_run_and_the_other_lane_keeps_its_data(
    tmp_path: Path, photos: Path
) -> None:
    root = tmp_path / "photos"
    shutil.copytree(photos, root)
    bad = root / "class_03" / "zz_truncated.jpg"  # last in sorted order: in shard 1 of 2
    bad.write_bytes((root / "class_03" / "img_000003.jpg").read_bytes()[:500])
    with Store(tmp_path / "store.db") as store:
        run_id = run_probe(config_for(root, 2, batches=8), store)
        run = store.run(run_id)
        lanes = store.lanes(run_id)
        assert run.status is RunStatus.FAILED
        assert run.reason is not None
        assert run.reason.startswith("lane 1 failed: corrupt or truncated image")
        assert lanes[1].status is RunStatus.FAILED
        assert str(bad) in (lanes[1].reason or "")
        assert lanes[0].status is RunStatus.COMPLETED
        assert lanes[0].summary is not None
        assert lanes[0].summary["batches"] == 8
        assert len(store.batches(run_id, 0)) == 9


def test_a_lane_killed_from_outside_fails_alone(tmp_path: Path, photos: Path) -> None:
    db = tmp_path / "store.db"

    def kill_lane_one(run_id: str) -> None:
        def kill() -> None:
            with Store(db) as reader:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    pid = reader.lanes(run_id)[1].pid
                    if pid is not None and measured_batches(db) >= 2:
                        os.kill(pid, signal.SIGKILL)
                        return
                    time.sleep(0.2)

        threading.Thread(target=kill, daemon=True).start()

    with Store(db) as store:
        config = config_for(photos, 2, batches=None, duration_s=8.0)
        run_id = run_probe(config, store, on_start=kill_lane_one)
        lanes = store.lanes(run_id)
        assert store.run(run_id).status is RunStatus.FAILED
        assert lanes[1].status is RunStatus.FAILED
        assert "died of signal SIGKILL" in (lanes[1].reason or "")
        assert lanes[0].status is RunStatus.COMPLETED
        assert lanes[0].summary is not None and lanes[0].summary["seconds"] >= 7.9


def store_digest(db: Path) -> str:
    with sqlite3.connect(db) as connection:
        rows = [
            connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()
            for table in ("runs", "lanes", "batches", "host_samples", "lane_cpu")
        ]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, photos: Path) -> Path:
    """A store holding one real run."""
    db = tmp_path_factory.mktemp("recorded") / "store.db"
    with Store(db) as store:
        run_probe(config_for(photos, 1), store)
    return db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "3"], "GPU 3 was asked for, but CUDA sees no GPU here; available: the CPU"),
        (["--gpus", "0,x"], "--gpus takes CUDA indices"),
        (["--consumer", "resnet50"], "unknown consumer 'resnet50'"),
        (["--batches", "0"], "--batches must be >= 1"),
        (["--duration", "0"], "--duration must be > 0"),
        (["--duration", "-5"], "--duration must be > 0"),
        (["--num-shards", "0"], "--num-shards must be >= 1"),
        (["--sample-hz", "-1"], "--sample-hz must be within 0..1000"),
        (["--stall-s", "0"], "--stall-s must be auto or > 0 seconds"),
        (["--stall-s", "soon"], "--stall-s takes auto or a number of seconds"),
        (["--workers", "-2"], "num_workers must be >= 0"),
        (["--data", "/no/such/folder"], "dataset folder not found"),
    ],
)
def test_bad_input_is_refused_and_the_store_is_unharmed(
    recorded: Path, photos: Path, args: list[str], message: str
) -> None:
    before = store_digest(recorded)
    data = [] if "--data" in args else ["--data", photos]
    result = probe("run", "--db", recorded, *data, *args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert store_digest(recorded) == before


def test_an_unwritable_store_path_is_refused(photos: Path) -> None:
    result = probe("run", "--db", "/proc/feedscope/store.db", "--data", photos, "--batches", "1")
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot use /proc/feedscope/store.db as the store")


def test_runs_and_show_read_the_store(recorded: Path) -> None:
    listing = json.loads(probe("runs", "--db", recorded, "--json").stdout)
    assert len(listing) == 1
    assert {"run_id", "status", "pipeline", "created"} <= listing[0].keys()
    table = probe("show", "last", "--db", recorded)
    assert table.returncode == 0
    assert listing[0]["run_id"] in table.stdout
    missing = probe("show", "nope", "--db", recorded)
    assert missing.returncode == 2
    assert "no run 'nope'" in missing.stderr


def test_the_env_var_chooses_the_store(tmp_path: Path, photos: Path) -> None:
    db = tmp_path / "from-env.db"
    result = probe_cli("run", "--gpus", "none", "--data", photos, *SMALL, timeout=300,
                       env={"FEEDSCOPE_DB": str(db)})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"store: {db}" in result.stderr
    with Store(db) as store:
        assert len(store.runs()) == 1


def test_lane_plans() -> None:
    assert [(p.shard_id, p.num_shards) for p in plan_lanes(None, 3)] == [(0, 3), (1, 3), (2, 3)]
    assert plan_lanes(None, None)[0].num_shards == 1
