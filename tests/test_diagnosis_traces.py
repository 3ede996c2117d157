"""The diagnosis on real measurements: the H200 traces (tests/data/h200-traces), converted into
a store by tests/h200_traces.py, judged as the traces' README says they behave.

The cpu_pipeline_only_wN traces are a measured num_workers sweep of the same pipeline on the same
host (0 to 31 workers on 32 cores): what more workers give is checked against it. Its runs are
short: from 16 workers on, their errors rest on 1 to 3 blocks, too few to judge on (README: the
curve's shape is the evidence), so the sweep is read by its values, as the README reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from h200_traces import TRACES, convert, convert_run, names
from probe.judge.changes import Knob
from probe.judge.dali_run import DaliRun
from probe.judge.diagnosis import diagnose_run
from probe.judge.doctor import dali_trade
from probe.judge.facts import LaneFacts, run_facts
from probe.judge.knee import SweepAnalysis, SweepPoint, analyze_sweep
from probe.judge.recommend import recommend, recommend_measured
from probe.judge.results import Session, SessionKind
from probe.judge.thresholds import KNEE_WITHIN, Severity
from probe.judge.verdicts import Verdict, VerdictKind, judge_lane
from probe.records import RunStatus, SessionRecord
from probe.steady import FEW_BLOCKS, MIN_BLOCKS, Estimate, at_least, block_batches
from probe.store.db import Store
from probe.store.documents import lane_figures_of, read_run

Traces = tuple[Path, dict[str, str]]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    db = tmp_path_factory.mktemp("traces") / "store.db"
    with Store(db) as store:
        return db, convert(store)


@pytest.fixture(scope="module")
def sweep(traces: Traces) -> SweepAnalysis:
    """The traced num_workers sweep, by its values."""
    db, run_ids = traces
    with Store(db) as store:
        points = [
            SweepPoint(int(name.rsplit("w", 1)[1]), read_run(store, run_id).images_per_s,
                       run_id=run_id)
            for name, run_id in run_ids.items()
            if name.startswith("cpu_pipeline_only_w")
        ]  # fmt: skip
    return analyze_sweep(points)


def diagnosis_of(traces: Traces, name: str) -> dict[str, Any]:
    db, run_ids = traces
    with Store(db) as store:
        return diagnose_run(store, run_ids[name]).to_json()


def facts_of(traces: Traces, name: str) -> list[LaneFacts]:
    db, run_ids = traces
    with Store(db) as store:
        return run_facts(store, run_ids[name])


def as_one_stream(facts: LaneFacts) -> LaneFacts:
    """The lane with its epoch starts unseen, as a reading of one stream (or a store that did
    not split them out) shows it: its wait is then all steady-state."""
    return replace(facts, figures=replace(facts.figures, epoch_start=None))


EXPECTED = {
    **{f"cpu_pipeline_only_w{n}": (VerdictKind.PIPELINE_ONLY, Severity.NONE)
       for n in (0, 2, 4, 8, 16, 24, 31)},
    "pipeline_only_mixed8_gpu0": (VerdictKind.PIPELINE_ONLY, Severity.NONE),
    "rn50_mixed8_gpu0": (VerdictKind.FED, Severity.NONE),  # DALI feeds ResNet-50: wait 0.7%
    "rn50_w16": (VerdictKind.EPOCH_START_STALL, Severity.HIGH),  # ~95% of its wait: epoch starts
    "rn50_w4": (VerdictKind.STARVED_CPU_HEADROOM, Severity.HIGH),  # 4 of 32 cores busy
    "two_gpu_rn50": (VerdictKind.EPOCH_START_STALL, Severity.HIGH),  # rn50_w16's, on two GPUs
}  # fmt: skip


def test_every_trace_has_an_expected_verdict() -> None:
    assert sorted(EXPECTED) == names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_trace_gets_its_exact_verdict(traces: Traces, name: str) -> None:
    kind, severity = EXPECTED[name]
    diagnosis = diagnosis_of(traces, name)
    assert (diagnosis["verdict"]["kind"], diagnosis["verdict"]["severity"]) == (
        kind.value,
        severity.value,
    )
    assert [v["kind"] for v in diagnosis["lanes"]] == [kind.value] * len(diagnosis["lanes"])
    assert diagnosis["findings"] == []  # two_gpu_rn50: 2,498 and 2,387 images/s, balanced
    assert not diagnosis["partial"]


def test_the_conversion_keeps_the_traces_figures(traces: Traces) -> None:
    db, run_ids = traces
    with Store(db) as store:
        for name, run_id in run_ids.items():
            folder = "two_gpu_rn50_gpu0_w14" if name == "two_gpu_rn50" else name
            meta = json.loads((TRACES / folder / "meta.json").read_text())
            run = store.run(run_id)
            figures = lane_figures_of(store, run, store.lanes(run_id)[0])
            assert figures.images_per_s == pytest.approx(meta["img_s"], rel=0.02), name
            if meta["model"]:  # without one, the traces count loop overhead as not waiting
                assert figures.data_wait_frac == pytest.approx(meta["wait_frac"], abs=0.01), name


def test_the_traced_sweep_is_read_by_its_values(traces: Traces) -> None:
    """From 16 workers on, the traced runs hold too few batches for FEW_BLOCKS blocks of a batch
    per worker: they are read on smaller blocks, judged with the wider error those give, not
    dropped."""
    db, run_ids = traces
    with Store(db) as store:
        for workers in (16, 24, 31):
            figures = read_run(store, run_ids[f"cpu_pipeline_only_w{workers}"]).lanes[0].figures
            assert figures.batches < MIN_BLOCKS * workers
            assert block_batches(workers, figures.batches) < workers
            assert figures.blocks >= FEW_BLOCKS and figures.images_per_s_error is not None


def test_the_worker_sweep_has_its_knee_at_24_and_31_is_oversubscribed(
    sweep: SweepAnalysis,
) -> None:
    assert [p.setting for p in sweep.points] == [0, 2, 4, 8, 16, 24, 31]
    assert sweep.best.setting == 24
    assert sweep.knee.setting == 24  # 16 workers gave 4,305: more than 5% below 5,179
    assert [p.setting for p in sweep.oversubscribed] == [31]


def test_rn50_with_4_workers_is_starved_with_cpu_headroom(traces: Traces) -> None:
    diagnosis = diagnosis_of(traces, "rn50_w4")
    verdict = diagnosis["verdict"]
    assert verdict["data_wait_frac"] == pytest.approx(0.647, abs=0.01)
    metrics = {item["metric"] for item in verdict["evidence"]}
    assert {"data_wait_frac", "host_cpu_pct", "sm_active_pct", "kernel_active_pct"} <= metrics
    top = diagnosis["recommendations"][0]
    # read epoch by epoch, 32 batches an epoch: 4 workers make them in 8 rounds, 8 in 4; with
    # no CPU cost an image measured, no more than twice the workers are predicted (16 workers,
    # traced too, gave 2,592 images/s, not the 4,142 the consumer would take)
    assert top["change"] == {"knob": "num_workers", "value": 8}
    assert top["setting"] == "num_workers=8"
    assert top["basis"].startswith(
        "estimated, not measured: read epoch by epoch, 32 batches an epoch made in rounds"
    )
    epoch = 32 * 128  # images: 8 rounds at 4 workers after a start of 163 ms, 4 at 8
    (lane,) = facts_of(traces, "rn50_w4")
    round_s = (epoch / lane.figures.images_per_s - 0.163) / 8
    assert top["predicted_images_per_s"] == pytest.approx(epoch / (0.163 + 4 * round_s), rel=0.01)


def test_more_workers_for_rn50_w4_are_what_the_sweep_measured_to_feed_its_consumer(
    traces: Traces, sweep: SweepAnalysis
) -> None:
    """The consumer takes 4,142 images/s (a step of 30.9 ms for 128 images): the sweep gave
    3,186 at 8 workers and 4,305 at 16, so 16, and no more. The run reads epoch by epoch (32
    batches an epoch, each start stalling 163 ms): the prediction pays those starts too."""
    (lane,) = facts_of(traces, "rn50_w4")
    verdict = judge_lane(lane)
    (workers,) = [r for r in recommend([lane], [verdict], (), sweep)
                  if r.change.knob is Knob.NUM_WORKERS]  # fmt: skip
    assert workers.change.value == 16
    start, consumer = lane.figures.epoch_start, lane.consumer_images_per_s
    assert start is not None and consumer is not None
    epoch = start.batches_per_epoch * lane.batch_size
    assert workers.predicted_images_per_s == pytest.approx(
        epoch / (epoch / consumer + start.stall_ms / 1000)
    )
    assert workers.basis.startswith("measured in a sweep: num_workers=16 gave 4,305 images/s")
    assert "read epoch by epoch" in workers.basis


def test_rn50_w16_is_never_told_to_go_past_the_measured_peak(
    traces: Traces, sweep: SweepAnalysis
) -> None:
    """Read as one stream (its epoch starts unseen), rn50_w16 looks starved with CPU headroom.
    From that run alone, 162 images/s per worker for a consumer taking 4,142 make 26 workers:
    past the sweep's peak at 24 (31 fell to 3,977). So the estimate says it is one, bounded
    only by the cores; and where the sweep is known, no more workers are recommended at all:
    16 already gave the pipeline 4,305 images/s, more than the consumer takes."""
    lane = as_one_stream(facts_of(traces, "rn50_w16")[0])
    verdict = judge_lane(lane)
    assert verdict.kind is VerdictKind.STARVED_CPU_HEADROOM

    (alone,) = [r for r in recommend([lane], [verdict]) if r.change.knob is Knob.NUM_WORKERS]
    assert alone.change.value == 26
    assert alone.basis.startswith("estimated, not measured: 162 images/s per worker")
    assert "bounded by the 32 cores per GPU" in alone.basis

    consumer = lane.consumer_images_per_s
    assert consumer is not None
    assert consumer == pytest.approx(4142, abs=1)
    sixteen = next(p for p in sweep.points if p.setting == 16)
    assert sweep.gives(sixteen, Estimate(consumer, None, 0))
    measured = recommend([lane], [verdict], (), sweep)
    assert [r for r in measured if r.change.knob is Knob.NUM_WORKERS] == []


def test_a_run_of_a_stored_sweep_is_told_the_sweep_s_measured_setting(
    tmp_path: Path, sweep: SweepAnalysis
) -> None:
    """`diagnose_run` reads the sweep of the session its run belongs to."""
    with Store(tmp_path / "s.db") as store:
        run_id = convert_run(store, "rn50_w4", session_id="sweep-trace")
        session = Session(
            kind=SessionKind.SWEEP, session_id="sweep-trace", status=RunStatus.COMPLETED,
            reason=None, created="2026-11-21T00:00:00Z", consumer="model:resnet50",
            budget_s=300.0, elapsed_s=200.0, points=sweep.points, best=sweep.best,
            knee=sweep.knee, oversubscribed=(31,),
        )  # fmt: skip
        store.save_session(
            SessionRecord("sweep-trace", "sweep", session.created, RunStatus.COMPLETED, None,
                          "h200-trace-host", None, session.to_json())
        )  # fmt: skip
        settings = [r.setting for r in diagnose_run(store, run_id).recommendations]
    assert settings[0] == "num_workers=16"


@pytest.mark.parametrize(("baseline", "advice"), [(16, "raise"), (24, "no change"), (31, "lower")])
def test_the_doctor_recommends_the_knee_within_5_percent_of_the_best(
    sweep: SweepAnalysis, baseline: int, advice: str
) -> None:
    mine = next(p for p in sweep.points if p.setting == baseline)
    starved = Verdict(VerdictKind.STARVED_CPU_HEADROOM, Severity.HIGH, 0.3, ())
    (top,) = recommend_measured(sweep, mine, starved)
    assert top.action.startswith(advice)
    assert top.change.knob is Knob.NUM_WORKERS
    assert isinstance(top.change.value, int)
    assert top.change.value <= sweep.best.setting
    chosen = next(p for p in sweep.points if p.setting == top.change.value)
    assert at_least(chosen.estimate, 1 - KNEE_WITHIN, sweep.best.estimate)
    assert top.predicted_images_per_s == chosen.images_per_s


def test_rn50_with_16_and_14_workers_waits_at_epoch_starts_not_for_more_workers(
    traces: Traces,
) -> None:
    """The traces read 32 batches an epoch (their README): ~95% of the wait sits in the batches
    that open an epoch, so the answer is the epoch starts, not more workers."""
    for name in ("rn50_w16", "two_gpu_rn50"):
        diagnosis = diagnosis_of(traces, name)
        for lane in diagnosis["lanes"]:
            (start,) = [e for e in lane["evidence"] if e["metric"] == "epoch_start_share"]
            assert start["value"] / lane["data_wait_frac"] > 0.8  # most of the wait
            assert "batches per epoch" in start["text"]
        settings = [r["setting"] for r in diagnosis["recommendations"]]
        assert settings == ["sampler=endless", "epoch_length=4x"]
        facts = facts_of(traces, name)
        top = diagnosis["recommendations"][0]["predicted_images_per_s"]
        assert top > 1.3 * sum(f.figures.images_per_s for f in facts)  # the stalls cost > 30%


def test_rn50_with_16_workers_shows_busy_ness_as_each_metric_sees_it(traces: Traces) -> None:
    verdict = diagnosis_of(traces, "rn50_w16")["verdict"]
    texts = [item["text"] for item in verdict["evidence"]]
    assert "SM activity 50% (GPM)" in texts  # busy-ness as GPM sees it ...
    assert "kernel-active 62% (NVML utilization.gpu, overstates)" in texts  # ... and NVML


@pytest.mark.parametrize(
    ("gpm", "shown"),
    [(True, "SM activity 82% (GPM), against 50% with the DataLoader"),
     (False, "kernel-active 97% (NVML utilization.gpu, overstates), against 62% with the "
             "DataLoader")],
)  # fmt: skip
def test_what_dali_costs_in_gpu_time_names_the_metric_it_is(
    tmp_path: Path, gpm: bool, shown: str
) -> None:
    """Without GPM the GPU's busy-ness is NVML's kernel-active, and is named so (it was once
    called 'SM activity 97% (NVML kernel-active)')."""
    with Store(tmp_path / "s.db") as store:
        torch_run = convert_run(store, "rn50_w16", gpm=gpm)
        dali_run = convert_run(store, "rn50_mixed8_gpu0", gpm=gpm)
        best = SweepPoint(16, 2592.0, run_id=torch_run)
        dali = DaliRun("mixed", 8, images_per_s=4151.0, run_id=dali_run)
        (gpu_time,) = [note for note in dali_trade(store, best, dali) if "GPU time" in note]
    assert gpu_time == (
        f"costs GPU time: decoding runs on the GPU (the hardware JPEG decoder 12% busy; {shown})"
    )


def test_rn50_fed_by_dali_is_fed(traces: Traces) -> None:
    diagnosis = diagnosis_of(traces, "rn50_mixed8_gpu0")
    assert diagnosis["recommendations"][0]["setting"] == "no change"
    assert diagnosis["recommendations"][0]["change"] == {"knob": None, "value": "no change"}


def test_rn50_with_4_workers_starves_between_epoch_starts_too(traces: Traces) -> None:
    """4 workers cannot keep up at any time: the epoch starts are a small part of its wait."""
    (lane,) = facts_of(traces, "rn50_w4")
    assert lane.epoch_share < 0.25 * (lane.figures.data_wait_frac or 0.0)


def test_the_converter_runs_as_a_script(tmp_path: Path) -> None:
    script = Path(__file__).with_name("h200_traces.py")
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s.db")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "rn50_w4: trace-rn50_w4" in result.stdout
