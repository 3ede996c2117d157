"""Several lanes sharing one host's cores, for real on the CPU (torchrun ranks, and the doctor's
own lanes): the lanes' CPU adds up to at most what the host allows, no thread above 100%, the
job's images/s is its lanes' sum, each change is recommended once in the job's unit, and the
doctor predicts (and with --scaling measures) the job on fewer lanes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from helpers import probe_cli, run_captured
from pipelines import available_cpus
from probe.judge.results import DALI, TORCH, Session

APP = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"
SMALL = ["--gpus", "none", "--batch-size", "8", "--image-size", "64", "--warmup", "2"]
SLACK = 1.05  # lanes' means over windows that differ a little at their ends


def lane_cores(document: dict[str, Any]) -> list[float]:
    return [lane["cpu_pct"] / 100 for lane in document["lanes"] if lane["cpu_pct"] is not None]


def test_torchrun_ranks_on_too_few_cores_add_up(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    """Two ranks of three workers each on this host's cores: more work than cores. Each
    rank samples its own lane; together they use no more than the host allows, the training
    loop's thread no more than one core, and the run's images/s is its lanes'. Each lane's mean
    is over its own batches, whose ends differ from the other's by up to a second: 12 s of them
    keep that within SLACK (over 6 s, one run in four read 2.14 cores of 2)."""
    db = tmp_path / "ranks.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "probe", "run", *SMALL, "--data", str(filled_store["photos"]), "--workers", "3",
         "--consumer", "sleep:5", "--duration", "12", "--db", str(db), "--json"],
        timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    cores = lane_cores(document)
    assert len(cores) == 2 and all(c > 0.1 for c in cores)
    assert sum(cores) <= available_cpus() * SLACK, cores
    assert all(lane["main_thread_cpu_pct"] <= 100.0 + 1e-6 for lane in document["lanes"])
    rates = [lane["images_per_s"] for lane in document["lanes"]]
    assert document["images_per_s"] == pytest.approx(sum(rates))
    settings = [r["setting"] for r in document["diagnosis"]["recommendations"]]
    assert len(settings) == len(set(settings)), settings


def test_the_doctor_on_two_lanes_answers_once_per_change_in_the_jobs_unit(
    filled_store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doctor on two CPU lanes with --scaling: every point's lanes within the host's
    cores, DALI's cores freed within them, each change once and none below yours among the
    recommendations, the consumer alone said per lane and for the job, and the job on one lane
    predicted and measured."""
    db = tmp_path / "doctor.db"
    result = probe_cli(
        "doctor", *SMALL, "--data", filled_store["photos"], "--num-shards", "2", "--scaling",
        "--budget", "75", "--db", db, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    session = Session.from_json(json.loads(result.stdout))
    assert session.lanes == 2 and session.verdict is not None
    allowed = available_cpus() * SLACK
    for point in session.points:
        assert point.cpu_pct is not None and point.cpu_pct / 100 <= allowed, point
    if session.dali is not None and session.dali.freed is not None:
        freed = session.dali.freed
        assert freed.dataloader_cores <= allowed and freed.dali_cores <= allowed
    settings = [r.setting for r in session.recommendations]
    assert len(settings) == len(set(settings)), settings
    for aside in session.asides:
        assert aside.notes[-1].startswith("not recommended: "), aside
    evidence = " ".join(item.text for item in session.verdict.evidence)
    assert "per lane (" in evidence and "for all 2 lanes)" in evidence
    scaling = session.scaling
    assert scaling is not None and scaling.lanes == 2 and scaling.device == "lane"
    one = scaling.at(TORCH, 1)
    assert one is not None and one.predicted_images_per_s
    if scaling.unchecked is None:  # the budget fitted the check
        assert one.measured_images_per_s and one.run_id in session.run_ids
        dali_one = scaling.at(DALI, 1)
        assert dali_one is None or dali_one.measured_images_per_s
    show = probe_cli("show", session.session_id, "--db", db)
    assert show.returncode == 0, show.stderr
    assert "from 1 lane to 2" in show.stdout
    html = probe_cli("report", session.session_id, "--db", db, "--format", "html")
    assert html.returncode == 0, html.stderr
    assert "From 1 lane to 2" in html.stdout
    page = session_page(monkeypatch, db, session.session_id)
    assert not page.exception, page.exception
    drawn = [json.loads(chart.proto.spec) for chart in page.get("plotly_chart")]
    per_lane = [c for c in drawn if "per lane" in c["layout"]["yaxis"]["title"]["text"]]
    assert per_lane, "the scaling chart"
    assert {"DataLoader, predicted"} <= {trace.get("name") for trace in per_lane[0]["data"]}


def session_page(monkeypatch: pytest.MonkeyPatch, db: Path, session_id: str) -> AppTest:
    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.switch_page("views/session.py")
    at.query_params["session"] = session_id
    return at.run()
