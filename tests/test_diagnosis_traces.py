"""The diagnosis on real measurements: the H200 traces (tests/data/h200-traces), converted into
a store by tests/h200_traces.py, judged as the traces' README says they behave."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from h200_traces import TRACES, convert
from probe.diagnose import (
    STARVED,
    Severity,
    SweepPoint,
    VerdictKind,
    analyze_sweep,
    diagnose_run,
)
from probe.store import Store


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("traces") / "store.db"
    with Store(db) as store:
        return db, convert(store)


def verdict_of(traces: tuple[Path, dict[str, str]], name: str) -> dict:  # type: ignore[type-arg]
    db, run_ids = traces
    with Store(db) as store:
        return diagnose_run(store, run_ids[name]).as_dict()


def test_the_conversion_keeps_the_traces_figures(traces: tuple[Path, dict[str, str]]) -> None:
    db, run_ids = traces
    with Store(db) as store:
        for name, run_id in run_ids.items():
            folder = "two_gpu_rn50_gpu0_w14" if name == "two_gpu_rn50" else name
            meta = json.loads((TRACES / folder / "meta.json").read_text())
            lane = store.lanes(run_id)[0].summary
            assert lane is not None
            assert lane["images_per_s"] == pytest.approx(meta["img_s"], rel=0.02), name
            if meta["model"]:  # without one, the traces count loop overhead as not waiting
                assert lane["data_wait_frac"] == pytest.approx(meta["wait_frac"], abs=0.01), name


def test_rn50_with_4_workers_is_starved_with_cpu_headroom(
    traces: tuple[Path, dict[str, str]],
) -> None:
    diagnosis = verdict_of(traces, "rn50_w4")
    verdict = diagnosis["verdict"]
    assert verdict["kind"] == VerdictKind.STARVED_CPU_HEADROOM.value
    assert verdict["severity"] == Severity.HIGH.value
    assert verdict["data_wait_frac"] == pytest.approx(0.647, abs=0.01)
    metrics = {item["metric"] for item in verdict["evidence"]}
    assert {"data_wait_frac", "host_cpu_pct", "sm_active_pct", "kernel_active_pct"} <= metrics
    top = diagnosis["recommendations"][0]
    assert top["setting"].startswith("num_workers=")
    assert int(top["setting"].split("=")[1]) > 4
    assert top["basis"].startswith("estimated")


def test_rn50_with_16_workers_is_starved(traces: tuple[Path, dict[str, str]]) -> None:
    verdict = verdict_of(traces, "rn50_w16")["verdict"]
    assert VerdictKind(verdict["kind"]) in STARVED
    assert verdict["severity"] == Severity.HIGH.value
    texts = " ".join(item["text"] for item in verdict["evidence"])
    assert "SM activity 50% (GPM)" in texts  # busy-ness as GPM sees it ...
    assert "kernel-active 62% (NVML" in texts  # ... and as NVML overstates it


def test_rn50_fed_by_dali_is_fed(traces: tuple[Path, dict[str, str]]) -> None:
    diagnosis = verdict_of(traces, "rn50_mixed8_gpu0")
    assert diagnosis["verdict"]["kind"] == VerdictKind.FED.value
    assert diagnosis["verdict"]["severity"] == Severity.NONE.value
    assert diagnosis["recommendations"][0]["setting"] == "no change"


def test_the_pipeline_alone_is_judged_as_capacity(traces: tuple[Path, dict[str, str]]) -> None:
    for name in ("pipeline_only_mixed8_gpu0", "cpu_pipeline_only_w8"):
        assert verdict_of(traces, name)["verdict"]["kind"] == VerdictKind.PIPELINE_ONLY.value


def test_the_worker_sweep_has_its_knee_at_24_and_31_is_oversubscribed(
    traces: tuple[Path, dict[str, str]],
) -> None:
    db, run_ids = traces
    with Store(db) as store:
        points = []
        for name, run_id in run_ids.items():
            if name.startswith("cpu_pipeline_only_w"):
                lane = store.lanes(run_id)[0].summary
                assert lane is not None
                points.append(SweepPoint(int(name.rsplit("w", 1)[1]), lane["images_per_s"]))
    analysis = analyze_sweep(points)
    assert [p.setting for p in analysis.points] == [0, 2, 4, 8, 16, 24, 31]
    assert analysis.best.setting == 24
    assert analysis.knee.setting == 24  # 16 workers gave 4,303: more than 5% below 5,177
    assert [p.setting for p in analysis.oversubscribed] == [31]


def test_two_gpus_each_starved_and_balanced(traces: tuple[Path, dict[str, str]]) -> None:
    diagnosis = verdict_of(traces, "two_gpu_rn50")
    assert [VerdictKind(v["kind"]) in STARVED for v in diagnosis["lanes"]] == [True, True]
    assert diagnosis["findings"] == []  # 2,498 and 2,387 images/s: within 15% of each other


def test_the_converter_runs_as_a_script(tmp_path: Path) -> None:
    script = Path(__file__).with_name("h200_traces.py")
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s.db")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "rn50_w4: trace-rn50_w4" in result.stdout
