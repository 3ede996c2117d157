"""The diagnosis rules one by one, sweeps, the budget, and `probe sweep` / `probe doctor`."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from pipelines import Backend, DaliOptions, DataLoaderOptions, InputError, PipelineSpec
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.judge.changes import (
    MEASURE_AGAIN,
    NO_CHANGE,
    STORAGE,
    Change,
    Knob,
    Recommendation,
    to_dali,
    workers,
)
from probe.judge.dali_run import CoresFreed, DaliRun
from probe.judge.diagnosis import diagnose_run, judge_run
from probe.judge.facts import HostLoad, LaneFacts
from probe.judge.knee import SweepPoint, analyze_sweep, ladder, past_the_peak
from probe.judge.results import (
    EpochsRun,
    InTurn,
    Session,
    SessionKind,
    Skipped,
    Verification,
    in_alternation,
)
from probe.judge.session import (
    MIN_POINT_BATCHES,
    POINT_GUESS_S,
    Budget,
    check_budget,
    with_change,
)
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind, judge_lane
from probe.lane_figures import EpochStartCost, LaneFigures
from probe.measure.config import ProbeConfig, plan_lanes
from probe.measure.consumers import parse_consumer
from probe.measure.runner import run_probe
from probe.records import RunStatus
from probe.steady import MIN_MEASURE_S
from probe.store.db import Store

STARVED_LANE = LaneFacts(
    lane=0, status="completed", backend="torch", consumer="model:resnet50", batch_size=128,
    figures=LaneFigures(
        batches=100, images_per_s=1500.0, data_wait_frac=0.40, step_ms_p50=30.0, blocks=20,
        data_wait_frac_error=0.02,
        sm_active_pct=25.0, sm_active_source="gpm", kernel_active_pct=35.0, nvjpg_pct=0.0,
        memory_used_mib=8000.0, cpu_pct=400.0, main_thread_cpu_pct=30.0,
    ),
    hostname="node0", host_cpus=32, lanes_on_host=1, on_gpu=True, num_workers=4,
    pin_memory=True, output_dtype="uint8",
    host=HostLoad(cpu_pct=15.0, iowait_pct=0.0, steal_pct=0.0, disk_read_mib_s=0.0),
    step_ms_mean=31.0,
)  # fmt: skip


def lane(base: LaneFacts = STARVED_LANE, **changes: Any) -> LaneFacts:
    """`base` with some fields changed, its figures' (first: `cpu_pct` is the lane's) and its
    host's included."""
    figures = {k: changes.pop(k) for k in list(changes) if hasattr(base.figures, k)}
    host = changes.pop("host", base.host)
    loads = {k: changes.pop(k) for k in list(changes) if hasattr(host, k)}
    return replace(
        base, figures=replace(base.figures, **figures), host=replace(host, **loads), **changes
    )


def kind_of(**changes: Any) -> VerdictKind:
    return judge_lane(lane(**changes)).kind


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
    verdict = judge_lane(lane(data_wait_frac=wait))
    assert (verdict.severity, verdict.kind) == (severity, kind)


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({}, VerdictKind.STARVED_CPU_HEADROOM),
        ({"host": HostLoad(cpu_pct=95.0)}, VerdictKind.STARVED_CPU_SATURATED),
        ({"cpu_pct": 3000.0}, VerdictKind.STARVED_CPU_SATURATED),
        ({"num_workers": 32, "host": HostLoad(cpu_pct=40.0)}, VerdictKind.STARVED_LOADER_LIMIT),
        ({"main_thread_cpu_pct": 99.0}, VerdictKind.MAIN_PROCESS_BOUND),
        ({"iowait_pct": 25.0, "disk_read_mib_s": 900.0}, VerdictKind.IO_BOUND),
        ({"host": HostLoad(cpu_pct=40.0, other_cores=8.0, machine_cores=32)},
         VerdictKind.HOST_BUSY),
        (
            {"backend": "dali", "num_workers": None, "num_threads": 4, "decoder": "mixed",
             "nvjpg_pct": 97.0},
            VerdictKind.DALI_DECODER_SATURATED,
        ),
        (
            {"backend": "dali", "num_workers": None, "num_threads": 4, "decoder": "cpu",
             "cpu_pct": 395.0},
            VerdictKind.DALI_THREADS_SATURATED,
        ),
        ({"consumer": "none", "data_wait_frac": 1.0}, VerdictKind.PIPELINE_ONLY),
        ({"batches": 0}, VerdictKind.UNKNOWN),
    ],
)  # fmt: skip
def test_each_cause_has_its_rule(changes: dict[str, Any], kind: VerdictKind) -> None:
    assert kind_of(**changes) is kind


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        # a validation pass of 4 batches: 2 blocks, no error
        ({"batches": 4, "blocks": 2, "data_wait_frac_error": None}, "needs 3 blocks"),
        # an error three times the figure: fed cannot be told from starved
        ({"batches": 12, "blocks": 4, "data_wait_frac": 0.151, "data_wait_frac_error": 0.461},
         "as large as the figure"),
        # an interval that straddles 20%
        ({"batches": 40, "blocks": 10, "data_wait_frac": 0.10, "data_wait_frac_error": 0.12},
         "its interval reaching 20%"),
    ],
)  # fmt: skip
def test_a_short_loader_is_not_judged(changes: dict[str, Any], why: str) -> None:
    verdict = judge_lane(lane(**changes))
    assert verdict.kind is VerdictKind.UNKNOWN and verdict.title == "too few batches to judge"
    (evidence,) = verdict.evidence
    assert evidence.text.startswith(f"{changes['batches']} batches measured on ")
    assert why in evidence.text
    diagnosis = judge_run("r", RunStatus.COMPLETED, [lane(**changes)])
    assert diagnosis.verdict.kind is VerdictKind.UNKNOWN and not diagnosis.recommendations


@pytest.mark.parametrize(
    ("wait", "error", "kind"),
    [
        (0.03, 0.035, VerdictKind.FED_WITHIN_ERROR),  # about 100 batches of a GPU-bound job
        (0.08, 0.09, VerdictKind.FED_WITHIN_ERROR),
        (0.02, 0.02, VerdictKind.FED),  # its interval below 5%: fed outright
        (0.01, 0.005, VerdictKind.FED),
    ],
)
def test_an_interval_below_20_percent_throughout_is_fed(
    wait: float, error: float, kind: VerdictKind
) -> None:
    """Fed is a verdict: an interval wholly below 20% tells a lane fed, or at most moderately
    input-bound, though its error is as large as its figure; no loader change, with what holds
    the job instead and the most a loader could gain."""
    fed = lane(batches=100, blocks=10, data_wait_frac=wait, data_wait_frac_error=error,
               step_ms_p50=30.0)  # fmt: skip
    diagnosis = judge_run("r", RunStatus.COMPLETED, [fed])
    assert diagnosis.verdict.kind is kind and diagnosis.verdict.severity is Severity.NONE
    (change,) = diagnosis.recommendations
    assert change.setting == "no change"
    assert change.predicted_images_per_s == fed.figures.images_per_s
    if kind is VerdictKind.FED_WITHIN_ERROR:
        assert "below 20% throughout" in diagnosis.verdict.evidence[0].text
        gain = 1 / (1 - wait - error) - 1
        assert change.action.startswith("no loader change: fed, or at most moderately")
        assert f"would gain at most {gain:.0%}" in change.action
        assert "the training step holds the job" in change.action


def test_an_epoch_start_is_judged_as_measured_not_as_noise_in_its_block() -> None:
    """On one H100 (tests/benchmarks/results/2026-11-28-fed-like): a job fed between its epoch
    starts, whose one measured start (1,007 ms) fell in one of 16 blocks: 6.4% ± 13.9% by the
    blocks, ± 0.02% with the start counted as measured. It is judged: starved at its epoch
    starts (6.3% of the time), moderately; the blocks' own error is said beside it."""
    start = EpochStartCost(starts=1, batches_per_epoch=100, opening_batches=12, stall_ms=1007.0,
                           share=0.063, steady_images_per_s=1661.5, wait_error=0.0002)  # fmt: skip
    spread = lane(batches=195, blocks=16, data_wait_frac=0.064, data_wait_frac_error=0.139,
                  epoch_start=start)  # fmt: skip
    verdict = judge_lane(spread)
    assert verdict.kind is VerdictKind.EPOCH_START_STALL and verdict.severity is Severity.MODERATE
    assert "data-wait 6.4% ± 0.0% of wall time" in verdict.evidence[0].text
    assert "(the blocks' own: ± 13.9%)" in verdict.evidence[0].text
    before = replace(start, wait_error=None)  # a document stored before: the blocks' error
    assert (
        judge_lane(replace(spread, figures=replace(spread.figures, epoch_start=before))).kind
        is VerdictKind.UNKNOWN
    )


def test_a_loader_in_the_training_process_is_told_from_0_workers() -> None:
    diagnosis = judge_run("r", RunStatus.COMPLETED, [lane(num_workers=0)])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_HEADROOM
    first = diagnosis.recommendations[0]
    assert first.action.startswith("raise num_workers from 0 to "), first.action


@pytest.mark.parametrize(
    ("wait", "error", "kind"),
    [
        (0.005, 0.006, VerdictKind.FED),  # the error passes the figure, but fed at its top
        (0.30, 0.25, VerdictKind.STARVED_CPU_HEADROOM),  # wide, but starved at its bottom
    ],
)
def test_a_wide_error_that_still_tells_fed_from_starved_is_judged(
    wait: float, error: float, kind: VerdictKind
) -> None:
    assert kind_of(data_wait_frac=wait, data_wait_frac_error=error, blocks=4) is kind


def test_evidence_names_the_metrics_and_their_numbers() -> None:
    verdict = judge_lane(lane(main_thread_cpu_pct=99.0, pin_memory=False, output_dtype="float32"))
    by_metric = {item.metric: item for item in verdict.evidence}
    assert by_metric["data_wait_frac"].text == "data-wait 40.0% ± 2.0% of wall time (>= 20%: high)"
    assert by_metric["sm_active_pct"].text == "SM activity 25% (GPM)"
    assert by_metric["kernel_active_pct"].text == (
        "kernel-active 35% (NVML utilization.gpu, overstates)"
    )
    assert by_metric["cpu_pct"].text == (
        "the lane's processes use 4.0 cores (4 workers; 32 cores per GPU)"
    )
    assert by_metric["main_thread_cpu_pct"].text == "training loop thread 99% busy"
    assert by_metric["main_thread_cpu_pct"].value == 99.0
    assert "pin_memory is off" in by_metric["pin_memory"].text
    assert "float32" in by_metric["output_dtype"].text


def test_a_stalling_step_is_shown() -> None:
    verdict = judge_lane(lane(step_ms_p50=30.0, step_ms_mean=77.0))
    assert any(e.metric == "step_ms_mean" and "steps stall" in e.text for e in verdict.evidence)


def test_recommendations_follow_the_verdict() -> None:
    def first(**changes: Any) -> Recommendation:
        return judge_run("r", RunStatus.COMPLETED, [lane(**changes)]).recommendations[0]

    assert first().change == workers(12)  # 375 images/s per worker; the consumer takes 4,267
    assert first().setting == "num_workers=12"
    assert first(data_wait_frac=0.01).change == NO_CHANGE
    assert first(iowait_pct=25.0).change == STORAGE
    assert first(host=HostLoad(steal_pct=20.0)).change == MEASURE_AGAIN
    saturated = judge_run("r", RunStatus.COMPLETED, [lane(cpu_pct=3000.0, pin_memory=False)])
    changes = [r.change for r in saturated.recommendations]
    assert changes[0] == to_dali("mixed", 8)
    assert Change(Knob.PIN_MEMORY, True) in changes


def test_lanes_far_apart_are_imbalanced_and_starved_lanes_on_a_full_host_share_cores() -> None:
    fast = lane(lanes_on_host=2, host=HostLoad(cpu_pct=96.0), images_per_s=2000.0)
    slow = lane(fast, lane=1, images_per_s=1200.0, data_wait_frac=0.55)
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


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        (workers(12), "num_workers=12"),
        (Change(Knob.NUM_THREADS, 8), "DALI num_threads=8"),
        (to_dali("mixed", 8), "DALI decoder=mixed num_threads=8"),
        (Change(Knob.PERSISTENT_WORKERS, True), "persistent_workers=True"),
        (Change(Knob.SAMPLER, "endless"), "sampler=endless"),
        (Change(Knob.EPOCH_LENGTH, 4), "epoch_length=4x"),
        (Change(Knob.PIN_MEMORY, True), "pin_memory=True"),
        (Change(Knob.OUTPUT_DTYPE, "uint8"), "output_dtype=uint8"),
        (Change(Knob.HW_DECODER_LOAD, 0.5), "DALI hw_decoder_load=0.5"),
        (NO_CHANGE, "no change"),
        (MEASURE_AGAIN, "measure again"),
        (STORAGE, "storage"),
    ],
)
def test_a_change_writes_its_setting_and_reads_back(change: Change, setting: str) -> None:
    assert change.setting == setting
    assert Change.from_json(json.loads(json.dumps(change.to_json()))) == change


def test_a_recommendation_keeps_its_setting_in_json_and_adds_its_change() -> None:
    item = Recommendation("move decoding to DALI", to_dali("mixed", 8), 4000.0, "measured",
                          notes=("frees 3.0 CPU cores",), predicted_error=40.0)  # fmt: skip
    document = item.to_json()
    assert list(document) == [
        "action", "setting", "predicted_images_per_s", "basis", "measured_images_per_s",
        "notes", "predicted_error", "change",
    ]  # fmt: skip
    assert document["setting"] == "DALI decoder=mixed num_threads=8"
    assert document["change"] == {
        "knob": "pipeline", "value": {"decoder": "mixed", "num_threads": 8}
    }  # fmt: skip
    assert Recommendation.from_json(json.loads(json.dumps(document))) == item


POINTS = (
    SweepPoint(1, 500.0, 0.6, 90.0, "r1", 10.0, data_wait_frac_error=0.01),
    SweepPoint(2, 980.0, 0.2, 180.0, "r2", 12.0, data_wait_frac_error=0.01, host_busy=True),
)
POINT_KEYS = ["images_per_s", "images_per_s_error", "data_wait_frac", "data_wait_frac_error",
              "cpu_pct", "host_busy", "run_id"]  # fmt: skip
HEAD: dict[str, Any] = {
    "session_id": "s", "status": RunStatus.COMPLETED, "reason": None, "created": "now",
    "consumer": "sleep:30", "budget_s": 60.0, "elapsed_s": 50.0,
}  # fmt: skip


def test_a_sweep_session_is_its_document_and_back() -> None:
    session = Session(
        kind=SessionKind.SWEEP, **HEAD, knob="num_threads", points=POINTS, best=POINTS[1],
        knee=POINTS[1], skipped=(Skipped(4, "past the peak"),), run_ids=("r1", "r2"),
        precision=0.03, startup_s=3.0, pipeline="dali", read="stream",
    )  # fmt: skip
    document = json.loads(json.dumps(session.to_json()))
    assert list(document) == [
        "schema", "session_id", "status", "reason", "created", "pipeline", "consumer", "read",
        "precision", "budget_s", "elapsed_s", "startup_s", "consumer_alone", "knob", "points",
        "best", "knee", "oversubscribed", "skipped", "host_busy", "run_ids", "curve",
    ]  # fmt: skip
    assert document["schema"] == "feedscope.sweep/1"
    assert list(document["points"][0]) == ["num_threads", *POINT_KEYS]
    assert document["host_busy"] == [2]
    assert document["skipped"] == [{"setting": 4, "reason": "past the peak"}]
    again = Session.from_json(document)
    assert again == session
    assert again.points == POINTS


def test_a_doctor_session_is_its_document_and_back() -> None:
    verdict = Verdict(VerdictKind.STARVED_CPU_HEADROOM, Severity.HIGH, 0.2, ())
    top = Recommendation("raise", workers(2), 980.0, "measured in the sweep, run r2",
                         measured_images_per_s=990.0, predicted_error=12.0)  # fmt: skip
    start = EpochStartCost(3, 12.0, 2, 150.0, 0.08, 1100.0)
    session = Session(
        kind=SessionKind.DOCTOR, **HEAD, points=POINTS, best=POINTS[1], knee=POINTS[1],
        run_ids=("r1", "r2", "r3", "r4", "r5"), precision=0.03, startup_s=3.0,
        consumer_alone={"images_per_s": 4000.0}, consumer_note=None, lanes=1,
        devices=("cpu",), verdict=verdict, verdict_run_id="r1", recommendations=(top,),
        dali=DaliRun("cpu", 2, 700.0, 9.0, "r3", 0.4, advice="DALI measured 700 ± 9",
                     cpu_pct=190.0, freed=CoresFreed("num_workers=2", 2.0, 1.9, 2.0)),
        epochs=EpochsRun(1, 12, True, 500.0, None, "r4", 460.0, 8.0, 0.08, start),
        verify=Verification(workers(2), 980.0, 12.0, 890.0, 11.0, False, False, "r5",
                            (InTurn("num_workers=1", 900.0, 10.0, "r6"),
                             InTurn("num_workers=2", 985.0, 12.0, "r7")), "it stays"),
    )  # fmt: skip
    document = json.loads(json.dumps(session.to_json()))
    assert list(document) == [
        "schema", "session_id", "status", "reason", "created", "consumer", "consumer_note",
        "lanes", "devices", "precision", "budget_s", "elapsed_s", "startup_s", "consumer_alone",
        "verdict", "recommendations", "asides", "sweep", "knee", "oversubscribed", "skipped",
        "host_busy", "dali", "epochs", "verify", "run_ids", "curve", "scaling",
    ]  # fmt: skip
    assert document["schema"] == "feedscope.doctor/1"
    assert list(document["sweep"][0]) == ["num_workers", *POINT_KEYS]
    assert list(document["verdict"]) == [
        "kind", "severity", "data_wait_frac", "evidence", "lane", "partial", "reliable", "title",
        "run_id",
    ]  # fmt: skip
    assert list(document["dali"]) == [
        "images_per_s", "images_per_s_error", "setting", "run_id", "data_wait_frac",
        "host_busy", "reason", "cpu_pct", "freed", "tried", "holds", "not_searched", "code",
        "advice",
    ]  # fmt: skip
    assert document["dali"]["freed"]["freed"] == pytest.approx(0.1)
    assert document["dali"]["setting"] == "DALI decoder=cpu num_threads=2"
    assert list(document["epochs"]) == [
        "setting", "batches_per_epoch", "persistent_workers", "run_id", "images_per_s",
        "images_per_s_error", "stream_images_per_s", "cost_frac", "epoch_start", "reason",
    ]  # fmt: skip
    assert list(document["verify"]) == [
        "setting", "predicted_images_per_s", "predicted_images_per_s_error",
        "measured_images_per_s", "measured_images_per_s_error", "error_frac", "agrees",
        "host_busy", "run_id", "in_turn", "outcome", "precise", "verified", "run_ids", "ratio",
        "ratio_error", "ratio_over",
    ]  # fmt: skip
    assert document["verify"]["setting"] == "num_workers=2"
    again = Session.from_json(document)
    # its recommendation measured in alternation is read at its runs there pooled, its first
    # figure said as its run's; read so, the document comes back the same
    assert session.epochs is not None
    weighed = replace(
        session,
        recommendations=in_alternation(session.recommendations, session.verify),
        epochs=session.epochs.against(900.0),  # num_workers=1's one run in alternation
    )
    assert again == weighed and again.recommendations[0].predicted_images_per_s == 985.0
    assert again.recommendations[0].measured_images_per_s is None
    assert again.points == POINTS  # under "sweep" in a doctor's document, "points" in a sweep's
    assert Session.from_json(again.to_json()) == again


def test_a_doctor_with_nothing_to_answer_on_is_its_document_and_back() -> None:
    session = Session(
        kind=SessionKind.DOCTOR, **{**HEAD, "status": RunStatus.FAILED},
        skipped=(Skipped(2, "the run failed: no batch"),), run_ids=("r1",),
    )  # fmt: skip
    document = json.loads(json.dumps(session.to_json()))
    assert list(document) == [
        "schema", "session_id", "status", "reason", "created", "consumer", "verdict",
        "recommendations", "sweep", "knee", "skipped", "dali", "epochs", "verify", "budget_s",
        "elapsed_s", "run_ids",
    ]  # fmt: skip
    again = Session.from_json(document)
    assert (again.verdict, again.points, again.answered) == (None, (), False)
    assert again.to_json() == document


def test_a_session_runs_the_changes_it_can() -> None:
    config = ProbeConfig(
        backend=Backend.TORCH, spec=PipelineSpec(Path(".")), lanes=plan_lanes(None, 1),
        consumer=parse_consumer("sleep:30"),
    )  # fmt: skip
    more = with_change(config, workers(3))
    assert more is not None
    assert (more.backend, more.spec.dataloader.num_workers) == (Backend.TORCH, 3)
    dali = with_change(config, to_dali("cpu", 2))  # on the CPU, DALI decodes there anyway
    assert dali is not None
    assert (dali.backend, dali.spec.dali.num_threads, dali.spec.dali.decoder) == (
        Backend.DALI, 2, None,
    )  # fmt: skip
    with pytest.raises(InputError, match="'mixed' needs a GPU"):  # what the change says
        with_change(config, to_dali("mixed", 2))
    assert with_change(config, Change(Knob.SAMPLER, "endless")) is None


def test_epoch_starts_get_their_fixes_each_predicted() -> None:
    start = EpochStartCost(starts=4, batches_per_epoch=6.0, opening_batches=6, stall_ms=400.0,
                           share=0.3, steady_images_per_s=2000.0, loader_start_ms=300.0,
                           refill_ms=100.0)  # fmt: skip
    stalled = lane(num_workers=8, persistent_workers=False, epoch_start=start,
                   data_wait_frac=0.35)  # fmt: skip
    diagnosis = judge_run("r", RunStatus.COMPLETED, [stalled])
    assert diagnosis.verdict.kind is VerdictKind.EPOCH_START_STALL
    by_knob = {r.change.knob: r for r in diagnosis.recommendations}
    assert by_knob[Knob.SAMPLER].predicted_images_per_s == pytest.approx(2000.0)
    assert by_knob[Knob.PERSISTENT_WORKERS].setting == "persistent_workers=True"
    assert by_knob[Knob.NUM_WORKERS].setting == "num_workers=6"  # 6 batches an epoch
    rates = [r.predicted_images_per_s or 0.0 for r in diagnosis.recommendations]
    assert rates == sorted(rates, reverse=True)
    assert all(1500.0 < rate <= 2000.0 for rate in rates)


def test_the_budget_shares_what_is_left_and_drops_points_it_cannot_fit() -> None:
    budget = Budget(60.0, time.monotonic())  # no lanes' start left to pay
    assert budget.point_cost() == POINT_GUESS_S + MIN_MEASURE_S  # before any point was timed
    budget.ran(20.0, 12.0, 40)  # 8 s besides its measuring, 0.3 s a batch
    budget.ran(30.0, 18.0, 40)  # 12 s besides, 0.45 s a batch
    assert budget.overhead() == 10.0  # the median of those timed
    assert budget.least_measure() == pytest.approx(MIN_POINT_BATCHES * 0.375)
    assert budget.typical_cost() == 10.0 + 15.0  # and the median measuring
    shorter = budget.least_measure() + 1.0  # a run in alternation, measuring at most this
    assert budget.run_cost(shorter) == pytest.approx(10.0 + shorter)
    assert budget.run_cost(0.0) == budget.point_cost()  # never less than the least a point is
    assert budget.fits(reserve=1)
    assert not budget.fits(reserve=2)  # the least point and two typical ones exceed 60 s
    assert budget.share(later=1) == pytest.approx(60.0 / 2 - 10.0, abs=0.1)
    assert budget.share(later=9) == budget.least_measure()  # never less than that
    assert budget.needed(reserve=2) == 70  # what was spent, the least and two typical points
    assert budget.needed_for(41.0) == 50  # what was spent and 41 s, rounded up to 10 s
    slow = Budget(60.0, time.monotonic(), startup_s=20.0)  # the lanes' start still to pay
    assert slow.remaining() == pytest.approx(40.0, abs=0.1)
    config = ProbeConfig(
        backend=Backend.TORCH, spec=PipelineSpec(Path(".")), lanes=plan_lanes(None, 1),
        consumer=parse_consumer("sleep:30"),
    )  # fmt: skip
    check_budget(15.0, 1, config, "a diagnosis")
    with pytest.raises(InputError, match="cannot fit one trustworthy point") as caught:
        check_budget(5.0, 1, config, "a diagnosis")
    assert "give --budget 14 or more" in str(caught.value)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diagnosis") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=4))
    return root


def probe(*args: Any) -> subprocess.CompletedProcess[str]:
    return probe_cli(*args)


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
    settings = [p["num_workers"] for p in document["sweep"]]
    assert 2 in settings  # yours (the cores), then around the knee its run predicts
    assert len(settings) <= 3 and document["curve"]["workers"] == 2
    predicted = {p["num_workers"]: p["images_per_s"] for p in document["curve"]["predicted"]}
    assert set(settings) <= set(predicted)
    assert all(p["images_per_s"] > 0 for p in document["sweep"])
    if len(settings) < 2 or verdict["kind"] == "host_busy":  # a knee is told only beside
        assert document["knee"] is None  # another point measured, on a quiet host
    else:
        assert document["knee"]["num_workers"] in settings
    assert document["dali"]["images_per_s"] is not None or document["dali"]["reason"]
    assert document["elapsed_s"] < 50 + 15  # the budget holds, give or take the last run
    with Store(db) as store:
        assert {r.run_id for r in store.runs()} == set(document["run_ids"])
        assert {r.session_id for r in store.runs()} == {document["session_id"]}
        assert store.session(document["session_id"]).document == document
    verify, top = document["verify"], document["recommendations"][0]
    if verify is not None and verify["agrees"] and top["setting"] == verify["setting"]:
        if len(verify["in_turn"]) >= 2:  # the pairs are its check: their figure is its one
            assert top["predicted_images_per_s"] == pytest.approx(verify["measured_images_per_s"])
            assert top["measured_images_per_s"] is None
        else:
            assert top["measured_images_per_s"] == verify["measured_images_per_s"]
            assert verify["predicted_images_per_s"] == top["predicted_images_per_s"]
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


@pytest.mark.parametrize(("command", "least"), [("doctor", 14), ("sweep", 22)])
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
        consumer=parse_consumer("sleep:1"), warmup=1, batches=None, duration_s=60.0,
    )  # fmt: skip  # a step far quicker than the loader: starved, well clear of the 20% line
    stop = threading.Event()
    with Store(tmp_path / "s.db") as store:

        def stop_when_measuring(run_id: str) -> None:
            def wait_then_stop() -> None:
                with Store(tmp_path / "s.db") as reader:
                    while len(reader.batches(run_id)) < 48:  # enough to judge on a busy host
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
