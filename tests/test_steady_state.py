"""The answer holds: a lane reads its shard as one stream (steady state), epoch reading shows
the epoch starts' stall and its verdict, DALI's epoch ends cost nothing, a busy host is said to
be busy, and inputs that cannot be read are one-line errors. Real probes on the CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli, skip_on_a_busy_host
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.judge.verdicts import VerdictKind
from probe.store.db import Store

# 64 images, batch 16: 4 batches an epoch; 2 workers; a step slower than the pipeline
SETTINGS = ["--gpus", "none", "--batch-size", "16", "--workers", "2", "--consumer", "sleep:100"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("steady") / "photos"
    make_sample_dataset(root, SampleParams(count=64, classes=4, seed=7))
    return root


def probe_json(*args: Any) -> dict[str, Any]:
    result = probe_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def stream(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("stream") / "s.db"
    return probe_json("run", "--data", photos, "--db", db, *SETTINGS)


def test_a_stream_keeps_a_consumer_slower_than_the_pipeline_fed(stream: dict[str, Any]) -> None:
    skip_on_a_busy_host(stream)  # another suite beside it read 5.5%, the host busy
    (lane,) = stream["lanes"]
    assert stream["config"]["read"] == "stream"
    assert stream["config"]["lanes"][0]["batches_per_epoch"] == 4
    assert lane["data_wait_frac"] < 0.05
    assert lane["epoch_start"] is None  # one endless reading: no epoch starts
    assert lane["blocks"] >= 10 and lane["images_per_s_error"] is not None
    assert lane["images_per_s_error"] <= 0.03 * lane["images_per_s"]  # measured until precise
    assert lane["warmup_batches"] >= 8  # until the rate settled, not a fixed handful
    assert stream["diagnosis"]["verdict"]["kind"] == VerdictKind.FED.value
    alone = lane["consumer_alone"]
    assert alone["images_per_s"] == pytest.approx(16 / 0.1, rel=0.1)  # 16 images a 100 ms step


def test_reading_epoch_by_epoch_shows_the_stall_and_its_verdict(
    photos: Path, tmp_path: Path, stream: dict[str, Any]
) -> None:
    document = probe_json("run", "--data", photos, "--db", tmp_path / "s.db", "--read",
                          "epochs", *SETTINGS)  # fmt: skip
    skip_on_a_busy_host(document)
    skip_on_a_busy_host(stream)
    (lane,) = document["lanes"]
    assert document["config"]["read"] == "epochs"
    start = lane["epoch_start"]
    assert start["starts"] >= 5 and start["batches_per_epoch"] == 4
    assert start["share"] >= 0.05
    assert lane["data_wait_frac"] > stream["lanes"][0]["data_wait_frac"] + 0.03
    # split into the loader's start (persistent workers: told to resume) and the refill
    assert start["loader_start_ms"] is not None and start["refill_ms"] > 0
    verdict = document["diagnosis"]["verdict"]
    assert verdict["kind"] == VerdictKind.EPOCH_START_STALL.value
    texts = [e["text"] for e in verdict["evidence"] if e["metric"] == "epoch_start_share"]
    assert texts and f"{start['share']:.1%} of the time" in texts[0]
    assert "4 batches per epoch" in texts[0]
    top = document["diagnosis"]["recommendations"][0]
    assert top["setting"] == "sampler=endless"
    # predicted from the rate between epoch starts; the stream measured it: they agree
    assert top["predicted_images_per_s"] == pytest.approx(stream["images_per_s"], rel=0.1)


def test_workers_started_anew_each_epoch_cost_more_and_keeping_them_is_advised(
    photos: Path, tmp_path: Path
) -> None:
    document = probe_json("run", "--data", photos, "--db", tmp_path / "s.db", "--read",
                          "epochs", "--no-persistent-workers", *SETTINGS)  # fmt: skip
    skip_on_a_busy_host(document)
    start = document["lanes"][0]["epoch_start"]
    assert start["loader_start_ms"] > 5  # two worker processes started at every epoch
    settings = [r["setting"] for r in document["diagnosis"]["recommendations"]]
    assert "persistent_workers=True" in settings
    assert "--no-persistent-workers" in probe_cli("report", "last", "--db", tmp_path / "s.db",
                                                  "--format", "json").stdout  # fmt: skip


def test_dali_costs_nothing_at_its_epoch_ends(photos: Path, tmp_path: Path) -> None:
    document = probe_json("run", "--pipeline", "dali", "--threads", "2", "--data", photos,
                          "--db", tmp_path / "s.db", "--read", "epochs", *SETTINGS)  # fmt: skip
    (lane,) = document["lanes"]
    start = lane["epoch_start"]  # DALI's iterator ends an epoch every 4 batches: measured
    assert start["starts"] >= 5
    assert start["share"] < 0.02
    assert lane["data_wait_frac"] < 0.05


def test_reading_epochs_of_a_shard_smaller_than_a_batch_is_refused(
    photos: Path, tmp_path: Path
) -> None:
    result = probe_cli("run", "--data", photos, "--db", tmp_path / "s.db", "--read", "epochs",
                       *SETTINGS, "--batch-size", "128")  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: --read epochs needs a whole batch per epoch")
    assert "64 images, fewer than the batch size 128" in lines[0]


def test_a_shard_that_yields_nothing_is_a_one_line_error_and_the_run_is_kept(
    photos: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    for path in sorted(photos.rglob("*.jpg"))[:6]:
        target = broken / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes()[:200])  # every image truncated
    db = tmp_path / "s.db"
    result = probe_cli("run", "--data", broken, "--db", db, "--skip-corrupt", *SETTINGS)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        "error: lane 0: every image of the shard was skipped as corrupt: nothing to read"
    ]
    assert "Traceback" not in result.stderr
    listing = json.loads(probe_cli("runs", "--db", db, "--json").stdout)
    assert [run["status"] for run in listing] == ["failed"]  # recorded, with its reason


@pytest.fixture
def busy_host() -> Iterator[None]:
    """A spinning process for every core."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.usefixtures("busy_host")
def test_a_doctor_on_a_busy_host_says_so_and_recommends_nothing_on_it(
    photos: Path, tmp_path: Path
) -> None:
    document = probe_json("doctor", "--data", photos, "--db", tmp_path / "s.db", "--budget", "40",
                          "--gpus", "none", "--batch-size", "16", "--image-size", "64")  # fmt: skip
    verdict = document["verdict"]
    assert verdict["reliable"] is False
    assert verdict["kind"] == VerdictKind.HOST_BUSY.value
    texts = " ".join(e["text"] for e in verdict["evidence"])
    assert "other processes used" in texts
    assert document["host_busy"]  # the points measured while it was busy
    assert [r["setting"] for r in document["recommendations"]] == ["measure again"]


def test_a_doctor_stopped_while_it_measures_keeps_what_it_recorded(
    photos: Path, tmp_path: Path
) -> None:
    """Ctrl-C in the middle of a point: exit 130, one line, the session kept as interrupted."""
    db = tmp_path / "s.db"
    doctor = subprocess.Popen(
        [sys.executable, "-m", "probe", "doctor", "--data", str(photos), "--db", str(db),
         "--gpus", "none", "--batch-size", "16", "--image-size", "64"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert doctor.stderr is not None
    for line in doctor.stderr:
        if line.startswith("measuring num_workers="):
            break
    time.sleep(2.0)
    doctor.send_signal(signal.SIGINT)
    rest = doctor.stderr.read()
    assert doctor.wait(timeout=120) == 130, rest
    assert "Traceback" not in rest
    runs = json.loads(probe_cli("runs", "--db", db, "--json").stdout)
    assert runs and {run["status"] for run in runs} == {"interrupted"}
    with Store(db) as store:
        (session,) = store.sessions()
    assert session.status.value == "interrupted"
    assert session.document["run_ids"] == [run["run_id"] for run in reversed(runs)]
