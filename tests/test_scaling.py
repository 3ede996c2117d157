"""Several lanes on one host: one unit per figure (per GPU or the job's), one answer (a change
once, no losing change among the recommendations), and the job on 1 to N GPUs predicted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from probe.judge.changes import NO_CHANGE, Recommendation, to_dali, workers
from probe.judge.dali_run import DaliRun
from probe.judge.diagnosis import judge_run
from probe.judge.facts import HostLoad, LaneFacts
from probe.judge.model import Curve
from probe.judge.recommend import set_aside
from probe.judge.results import DALI, TORCH, Session, SessionKind
from probe.judge.scaling import checked_counts, dali_at, predict, torch_at
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import LaneFigures
from probe.metrics import job_scope
from probe.present.doctor_tables import scaling_grid, scaling_lines
from probe.present.tables import diagnosis_lines
from probe.records import RunStatus
from probe.steady import Estimate

# One of 4 lanes on a 16-core host: each has 4 cores; a worker makes an image in 4 ms of CPU.
CURVE = Curve(
    run_id="r", workers=4, batch_size=128, worker_ms=4.0, cores=4.0, main_ms=0.5,
    other_cores=0.0, handoff_ms=5.0, step_ms=40.0, step_alone_ms=40.0, lanes=4,
    measured_images_per_s=3200.0, serial_ms=4.0,
)  # fmt: skip


def test_the_dataloader_on_fewer_gpus_gets_more_cores_each() -> None:
    """On 4 lanes the cores bind (4 cores a lane, 4.5 ms of CPU an image: under 900 images/s a
    lane); on one lane the 16 cores feed the consumer (128 images in 45 ms: 2,844 images/s)."""
    knee_1, one = torch_at(CURVE, 1)
    knee_4, four = torch_at(CURVE, 4)
    assert four == pytest.approx(CURVE.images_per_s(knee_4))
    assert four / 4 < 4 * 1000 / 4.5 * 1.01  # bound by its cores
    assert one > four / 4 * 2.5  # a GPU alone is fed far better
    assert one <= 128 * 1000 / 45 * 1.001  # never past the consumer
    assert knee_1 > knee_4  # more workers where there are more cores


def test_dali_keeps_its_rate_per_lane_where_its_cpu_had_room() -> None:
    """4 lanes on 16 cores making 8,000 images/s: at 0.5 ms of CPU an image, 2 threads (and
    mixed's GPU-stage thread) could make 6,000 a lane: the CPU had room, and each GPU keeps its
    2,000 on fewer GPUs."""
    room = DaliRun("mixed", 2, images_per_s=8000.0, images_per_s_error=80.0, cpu_pct=400.0)
    assert dali_at(room, 4, 16.0, None, 1) == pytest.approx(2000.0)
    assert dali_at(room, 4, 16.0, None, 2) == pytest.approx(4000.0)
    # 15.5 cores at 1.94 ms an image: 3 threads make 1,548 a lane, short of what they made:
    # held by the CPU, they have no more cores on one lane, and it stays 2,000
    busy = replace(room, cpu_pct=1550.0)
    assert dali_at(busy, 4, 16.0, None, 1) == pytest.approx(2000.0)
    # 9 threads held by the 4 cores each lane had; on one lane they get 9 of the 16
    tight = replace(room, num_threads=8, cpu_pct=1550.0)
    assert dali_at(tight, 4, 16.0, None, 1) == pytest.approx(9 * 1000 / 1.9375)
    assert dali_at(tight, 4, 16.0, 2500.0, 1) == pytest.approx(2500.0)  # the consumer alone
    assert dali_at(tight, 4, 16.0, None, 4) == pytest.approx(8000.0)  # as measured on 4
    cpu = DaliRun("cpu", 1, images_per_s=788.0, images_per_s_error=14.0, cpu_pct=200.0)
    assert dali_at(cpu, 2, 2.0, None, 1) == pytest.approx(394.0)  # one thread decodes


def test_scaling_predicted_for_each_count_of_gpus() -> None:
    dali = DaliRun("mixed", 4, images_per_s=9000.0, images_per_s_error=90.0, cpu_pct=600.0)
    scaling = predict(CURVE, dali, 2844.0, 4, 16.0, on_gpu=True)
    assert scaling is not None
    assert [p.gpus for p in scaling.points if p.pipeline == TORCH] == [1, 2, 3, 4]
    assert scaling.at(DALI, 4).predicted_images_per_s == pytest.approx(9000.0)  # type: ignore[union-attr]
    # the DataLoader's CPU per image, 4.5 ms, at 2,844 images/s: 12.8 cores per GPU
    assert scaling.cores_needed(TORCH) == pytest.approx(2844 * 4.5 / 1000)
    assert scaling.gpus_fed(TORCH) == 1
    assert scaling.cores_needed(DALI) == pytest.approx(2844 * (6.0 / 9000 * 1000) / 1000)
    assert scaling.gpus_fed(DALI) == 8
    again = Session.from_json(
        Session(
            SessionKind.DOCTOR,
            "doctor-x",
            RunStatus.COMPLETED,
            None,
            "now",
            "sleep:40",
            180.0,
            100.0,
            verdict=Verdict(VerdictKind.FED, Severity.NONE, 0.01, ()),
            scaling=scaling,
        ).to_json()
    )
    assert again.scaling == scaling
    measured = scaling.with_measured(TORCH, 1, 2600.0, 50.0, "run-1")
    point = measured.at(TORCH, 1)
    assert point is not None and point.run_id == "run-1"
    assert point.error_frac == pytest.approx(2600.0 / point.predicted_images_per_s - 1)  # type: ignore[operator]
    grid = scaling_grid(measured)
    assert grid.header[:5] == ("GPUs", "workers", "DataLoader predicted", "DataLoader measured",
                               "DataLoader per GPU")  # fmt: skip
    assert len(grid.rows) == 4
    assert grid.rows[0][3].startswith("2,600 ±")  # the DataLoader's measured on 1 GPU
    assert grid.rows[0][3].endswith(f"({point.error_frac:+.1%})")
    lines = scaling_lines(measured)
    assert "needs 12.8 cores per GPU" in lines[1] and "feed 1 GPU at that rate" in lines[1]
    assert any(line.startswith("checked on 1 GPU: num_workers=") for line in lines)


def test_one_lane_has_no_scaling_and_the_counts_checked() -> None:
    assert predict(CURVE, None, None, 1, 16.0, on_gpu=True) is None
    assert predict(None, None, None, 4, 16.0, on_gpu=True) is None
    assert checked_counts(4) == [1, 2]
    assert checked_counts(2) == [1]
    assert checked_counts(8) == [1, 2, 4]


def lane(number: int, rate: float) -> LaneFacts:
    """A DataLoader lane of a 4-GPU run, starved with the host's CPU saturated."""
    return LaneFacts(
        lane=number, status="completed", backend="torch", consumer="model:resnet50",
        batch_size=128,
        figures=LaneFigures(
            batches=200, images_per_s=rate, images_per_s_error=rate * 0.02, blocks=20,
            data_wait_frac=0.6, data_wait_frac_error=0.01, step_ms_p50=36.0, cpu_pct=1500.0,
            main_thread_cpu_pct=40.0, consumer_alone={"images_per_s": 3500.0},
        ),
        hostname="node0", host_cpus=64, lanes_on_host=4, on_gpu=True, num_workers=16,
        pin_memory=True, output_dtype="uint8",
        host=HostLoad(cpu_pct=99.0, iowait_pct=0.0, steal_pct=0.0, machine_cores=64),
        step_ms_mean=37.0, run_lanes=4,
    )  # fmt: skip


def test_a_runs_recommendations_are_for_the_job_once_each() -> None:
    """Four lanes starved on saturated cores: DALI once, predicted for all four GPUs (the
    consumer alone's rate on each), and the evidence says which figures are per GPU."""
    facts = [lane(i, 1000.0 + i) for i in range(4)]
    diagnosis = judge_run("r", RunStatus.COMPLETED, facts)
    settings = [r.setting for r in diagnosis.recommendations]
    assert len(settings) == len(set(settings))
    (dali,) = [r for r in diagnosis.recommendations if r.setting.startswith("DALI")]
    assert dali.predicted_images_per_s == pytest.approx(4 * 3500.0)
    texts = [e.text for e in diagnosis.verdict.evidence]
    assert any("3,500 images/s per GPU (14,000 for all 4 GPUs)" in t for t in texts), texts
    lines = diagnosis_lines(
        diagnosis.verdict, diagnosis.recommendations, scope=job_scope(["cuda:0"] * 4)
    )
    assert any("predicted 14,000 images/s for all 4 GPUs" in line for line in lines)


def test_a_change_below_yours_is_set_aside_with_its_cost() -> None:
    yours = Estimate(2743.0, 40.0, 20)
    fewer = Recommendation("lower num_workers", workers(11), 1945.0, "predicted by the model")
    close = Recommendation("lower num_workers", workers(12), 2700.0, "measured", predicted_error=60)
    keep = Recommendation("no change", workers(16), 2743.0, "measured")
    dali = Recommendation("move to DALI", to_dali("mixed", 8), 4000.0, "estimated")
    verified_low = replace(dali, change=to_dali("mixed", 4), measured_images_per_s=2000.0)
    kept, aside = set_aside([dali, keep, close, fewer, verified_low], yours, workers(16))
    assert kept == [dali, keep, close]
    assert [a.setting for a in aside] == ["num_workers=11", "DALI decoder=mixed num_threads=4"]
    assert aside[0].notes[-1] == (
        "not recommended: 1,945 images/s, -29% against yours (2,743 ± 40 images/s, num_workers=16)"
    )
    kept, aside = set_aside([replace(fewer, change=NO_CHANGE)], yours, workers(16))
    assert aside == []  # no change is never set aside
