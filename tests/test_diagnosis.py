"""The diagnosis rules one by one, sweeps, the budget, and `probe sweep` / `probe doctor`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipelines import Backend, DaliOptions, DataLoaderOptions, InputError, PipelineSpec
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.consumers import parse_consumer
from probe.diagnose import (
    LaneFacts,
    Severity,
    SweepPoint,
    VerdictKind,
    analyze_sweep,
    diagnose_run,
    judge_lane,
    judge_run,
    ladder,
    past_the_peak,
)
from probe.runner import ProbeConfig, plan_lanes, run_probe
from probe.store import RunStatus, Store
from probe.sweep import POINT_GUESS_S, Budget, check_budget

STARVED_LANE = LaneFacts(
    lane=0, status="completed", backend="torch", consumer="model:resnet50", batch_size=128,
    batches=100, images_per_s=1500.0, data_wait_frac=0.40, step_ms_p50=30.0, step_ms_mean=31.0,
    num_workers=4, pin_memory=True, output_dtype="uint8", num_threads=None, decoder=None,
    on_gpu=True, hostname="node0", host_cpus=32, lanes_on_host=1, host_cpu_pct=15.0, iowait_pct=0.0,
    steal_pct=0.0, disk_read_mib_s=0.0, lane_cpu_pct=400.0, main_thread_cpu_pct=30.0,
    sm_active_pct=25.0, sm_active_source="gpm", kernel_active_pct=35.0, nvjpg_pct=0.0,
    memory_used_mib=8000.0,
)  # fmt: skip


def kind_of(**changes: Any) -> VerdictKind:
    return judge_lane(replace(STARVED_LANE, **changes)).kind


@pytest.mark.parametrize(
    ("wait", "severity", "kind"),
    [
        (0.0490, Severity.NONE, VerdictKind.FED),
        (0.0500, Severity.MODERATE, VerdictKind.STARVED_CPU_HEADROOM),
        (0.1999, Severity.MODERATE, VerdictKind.STARVED_CPU_HEADROOM),
        (0.2000, Severity.HIGH, VerdictKind.STARVED_CPU_HEADROOM),
    ],
)
def test_severity_follows_the_20_and_5_percent_anchors(
    wait: float, severity: Severity, kind: VerdictKind
) -> None:
    verdict = judge_lane(replace(STARVED_LANE, data_wait_frac=wait))
    assert (verdict.severity, verdict.kind) == (severity, kind)


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({}, VerdictKind.STARVED_CPU_HEADROOM),
        ({"host_cpu_pct": 95.0}, VerdictKind.STARVED_CPU_SATURATED),
        ({"lane_cpu_pct": 3000.0}, VerdictKind.STARVED_CPU_SATURATED),
        ({"num_workers": 32, "host_cpu_pct": 40.0}, VerdictKind.STARVED_LOADER_LIMIT),
        ({"main_thread_cpu_pct": 99.0}, VerdictKind.MAIN_PROCESS_BOUND),
        ({"iowait_pct": 25.0, "disk_read_mib_s": 900.0}, VerdictKind.IO_BOUND),
        (
            {"backend": "dali", "num_workers": None, "num_threads": 4, "decoder": "mixed",
             "nvjpg_pct": 97.0},
            VerdictKind.DALI_DECODER_SATURATED,
        ),
        (
            {"backend": "dali", "num_workers": None, "num_threads": 4, "decoder": "cpu",
             "lane_cpu_pct": 395.0},
            VerdictKind.DALI_THREADS_SATURATED,
        ),
        ({"consumer": "none", "data_wait_frac": 1.0}, VerdictKind.PIPELINE_ONLY),
        ({"batches": 0}, VerdictKind.UNKNOWN),
    ],
)  # fmt: skip
def test_each_cause_has_its_rule(changes: dict[str, Any], kind: VerdictKind) -> None:
    assert kind_of(**changes) is kind


def test_evidence_names_the_metrics_and_their_numbers() -> None:
    verdict = judge_lane(replace(STARVED_LANE, main_thread_cpu_pct=99.0, pin_memory=False,
                                 output_dtype="float32"))  # fmt: skip
    by_metric = {item.metric: item for item in verdict.evidence}
    assert by_metric["data_wait_frac"].text == "data-wait 40.0% of wall time (>= 20%: high)"
    assert by_metric["sm_active_pct"].text == "SM activity 25% (GPM)"
    assert "kernel-active 35% (NVML" in by_metric["kernel_active_pct"].text
    assert by_metric["main_thread_cpu_pct"].value == 99.0
    assert "pin_memory is off" in by_metric["pin_memory"].text
    assert "float32" in by_metric["output_dtype"].text


def test_a_stalling_step_is_shown() -> None:
    verdict = judge_lane(replace(STARVED_LANE, step_ms_p50=30.0, step_ms_mean=77.0))
    assert any(e.metric == "step_ms_mean" and "steps stall" in e.text for e in verdict.evidence)


def test_recommendations_follow_the_verdict() -> None:
    def first(**changes: Any) -> str:
        facts = replace(STARVED_LANE, **changes)
        return judge_run("r", RunStatus.COMPLETED, [facts]).recommendations[0].setting

    assert first() == "num_workers=12"  # 375 images/s per worker; the consumer takes 4,267
    assert first(data_wait_frac=0.01) == "no change"
    saturated = judge_run("r", RunStatus.COMPLETED, [replace(STARVED_LANE, host_cpu_pct=95.0,
                                                             pin_memory=False)])  # fmt: skip
    settings = [r.setting for r in saturated.recommendations]
    assert settings[0].startswith("DALI decoder=mixed")
    assert "pin_memory=True" in settings


def test_lanes_far_apart_are_imbalanced_and_starved_lanes_on_a_full_host_share_cores() -> None:
    fast = replace(STARVED_LANE, lanes_on_host=2, host_cpu_pct=96.0, images_per_s=2000.0)
    slow = replace(fast, lane=1, images_per_s=1200.0, data_wait_frac=0.55)
    diagnosis = judge_run("r", RunStatus.COMPLETED, [fast, slow])
    kinds = [v.kind for v in diagnosis.findings]
    assert kinds == [VerdictKind.SHARD_IMBALANCE, VerdictKind.SHARED_CORES]
    assert diagnosis.findings[0].lane == 1
    assert diagnosis.verdict.data_wait_frac == 0.55


def test_a_run_that_did_not_complete_is_judged_partial() -> None:
    diagnosis = judge_run("r", RunStatus.INTERRUPTED, [STARVED_LANE])
    assert diagnosis.partial
    assert diagnosis.verdict.partial
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_HEADROOM


def test_sweep_knee_best_and_oversubscription() -> None:
    points = [SweepPoint(s, r) for s, r in [(1, 500), (2, 900), (4, 1710), (8, 1790), (16, 1500)]]
    analysis = analyze_sweep(points)
    assert (analysis.best.setting, analysis.knee.setting) == (8, 4)  # 1,710 >= 95% of 1,790
    assert [p.setting for p in analysis.oversubscribed] == [16]
    assert not past_the_peak(points[:4])
    assert past_the_peak(points)  # 1,500 < 90% of 1,790, past the best
    with pytest.raises(ValueError, match="no sweep point measured"):
        analyze_sweep([SweepPoint(1, 0.0)])


@pytest.mark.parametrize(
    ("cores", "expected"),
    [(1, [1, 2]), (2, [1, 2, 4]), (12, [1, 2, 4, 8, 12, 16]), (16, [1, 2, 4, 8, 16, 32])],
)
def test_the_worker_ladder_goes_one_step_past_the_cores(cores: int, expected: list[int]) -> None:
    assert ladder(cores) == expected


def test_the_budget_drops_points_it_cannot_fit_and_refuses_too_little() -> None:
    budget = Budget(60.0)
    assert budget.point_cost() == POINT_GUESS_S  # before any point was timed
    assert budget.fits(reserve=2)
    budget.ran(20.0)
    budget.ran(30.0)
    assert budget.point_cost() == 25.0  # the median of those timed
    assert budget.fits(reserve=1)
    assert not budget.fits(reserve=2)  # three points of 25 s do not fit in 60
    config = ProbeConfig(
        backend=Backend.TORCH, spec=PipelineSpec("."), lanes=plan_lanes(None, 1),
        consumer=parse_consumer("sleep:30"),
    )  # fmt: skip
    check_budget(15.0, 1, config, "a diagnosis")
    with pytest.raises(InputError, match="cannot fit one trustworthy point") as caught:
        check_budget(5.0, 1, config, "a diagnosis")
    assert "give --budget 11 or more" in str(caught.value)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diagnosis") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=4))
    return root


def probe(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *map(str, args)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


SMALL = ["--gpus", "none", "--batch-size", "16", "--image-size", "64", "--warmup", "2"]


def test_doctor_on_a_small_budget(tmp_path: Path, photos: Path) -> None:
    db = tmp_path / "s.db"
    result = probe("doctor", "--data", photos, "--db", db, "--budget", "50", "--json", *SMALL)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "feedscope.doctor/1"
    verdict = document["verdict"]
    assert {"kind", "severity", "data_wait_frac", "evidence"} <= verdict.keys()
    assert VerdictKind(verdict["kind"])  # a known kind
    assert document["recommendations"]
    for item in document["recommendations"]:
        keys = {"action", "setting", "predicted_images_per_s", "measured_images_per_s", "basis"}
        assert keys <= item.keys()
    assert [p["num_workers"] for p in document["sweep"]][:2] == [1, 2]
    assert all(p["images_per_s"] > 0 for p in document["sweep"])
    assert document["knee"]["num_workers"] in {p["num_workers"] for p in document["sweep"]}
    assert document["dali"]["images_per_s"] is not None or document["dali"]["reason"]
    assert document["elapsed_s"] < 50 + 15  # the budget holds, give or take the last run
    with Store(db) as store:
        assert {r.run_id for r in store.runs()} == set(document["run_ids"])
        assert {r.session_id for r in store.runs()} == {document["session_id"]}
        assert store.session(document["session_id"]).document == document
    if document["verify"] is not None:
        top = document["recommendations"][0]
        assert top["measured_images_per_s"] == document["verify"]["measured_images_per_s"]
        assert document["verify"]["predicted_images_per_s"] == top["predicted_images_per_s"]
    shown = probe("show", document["session_id"], "--db", db)
    assert shown.returncode == 0
    assert "verdict:" in shown.stdout


def test_sweep_finds_a_knee_and_show_has_the_diagnosis(tmp_path: Path, photos: Path) -> None:
    db = tmp_path / "s.db"
    result = probe("sweep", "--data", photos, "--db", db, "--values", "0,1,2", "--budget", "40",
                   "--json", *SMALL)  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "feedscope.sweep/1"
    settings = [p["num_workers"] for p in document["points"]]
    assert settings and set(settings) <= {0, 1, 2}
    assert document["knee"]["num_workers"] in settings
    shown = json.loads(probe("show", document["run_ids"][0], "--db", db, "--json").stdout)
    assert shown["diagnosis"]["verdict"]["kind"] == VerdictKind.PIPELINE_ONLY.value


@pytest.mark.parametrize(("command", "least"), [("doctor", 11), ("sweep", 16)])
def test_a_budget_too_small_for_one_trustworthy_point_is_refused(
    tmp_path: Path, photos: Path, command: str, least: int
) -> None:
    result = probe(command, "--data", photos, "--db", tmp_path / "s.db", "--budget", "3", *SMALL)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --budget 3 s cannot fit ")
    assert f"give --budget {least} or more" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()  # refused before anything was written


def test_an_interrupted_run_is_diagnosed_partial(tmp_path: Path, photos: Path) -> None:
    spec = PipelineSpec(
        photos,
        batch_size=8,
        image_size=64,
        dataloader=DataLoaderOptions(num_workers=1),
        dali=DaliOptions(num_threads=1),
    )
    config = ProbeConfig(
        backend=Backend.TORCH, spec=spec, lanes=plan_lanes(None, 1),
        consumer=parse_consumer("sleep:10"), warmup=1, batches=None, duration_s=60.0,
    )  # fmt: skip
    stop = threading.Event()
    with Store(tmp_path / "s.db") as store:

        def stop_when_measuring(run_id: str) -> None:
            def wait_then_stop() -> None:
                with Store(tmp_path / "s.db") as reader:
                    while len(reader.batches(run_id)) < 6:
                        time.sleep(0.2)
                stop.set()

            threading.Thread(target=wait_then_stop, daemon=True).start()

        run_id = run_probe(config, store, stop=stop, on_start=stop_when_measuring)
        diagnosis = diagnose_run(store, run_id)
    assert store_status(tmp_path / "s.db", run_id) is RunStatus.INTERRUPTED
    assert diagnosis.partial
    assert diagnosis.verdict.partial
    assert diagnosis.verdict.kind is not VerdictKind.UNKNOWN  # it says what it can


def store_status(db: Path, run_id: str) -> RunStatus:
    with Store(db) as store:
        return store.run(run_id).status
