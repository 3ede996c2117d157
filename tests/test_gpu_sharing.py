"""A step slowed by DALI's kernels on its own GPU is told from one slowed by CPU load: the
cause named with its numbers, and no "raise DALI num_threads" for it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from probe.judge.changes import Knob, Recommendation
from probe.judge.diagnosis import RunDiagnosis, judge_run
from probe.judge.facts import HostLoad, LaneFacts
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import LaneFigures
from probe.records import RunStatus

ALONE = {"images_per_s": 3900.0, "step_ms_p50": 33.0, "step_ms_p50_error": 0.4, "batch_size": 128}
# DALI's mixed decoder on the training GPU: the step 41.2 ms against 33.0 ms alone (+25%), the
# host's CPU 38% busy, 8 DALI threads using 7.8 of 16 cores, the hardware decoder 35% busy.
DALI_LANE = LaneFacts(
    lane=0, status="completed", backend="dali", consumer="model:resnet50", batch_size=128,
    figures=LaneFigures(
        batches=400, images_per_s=3100.0, images_per_s_error=40.0, data_wait_frac=0.01,
        data_wait_frac_error=0.005, blocks=20,
        step_ms_p50=41.2, step_ms_p50_error=0.5, sm_active_pct=92.0, sm_active_source="gpm",
        kernel_active_pct=99.0, nvjpg_pct=35.0, cpu_pct=780.0, consumer_alone=ALONE,
    ),
    hostname="node0", host_cpus=16, lanes_on_host=1, on_gpu=True, num_threads=8,
    decoder="mixed", hw_decoder_load=0.65, host=HostLoad(cpu_pct=38.0, machine_cores=16),
)  # fmt: skip
CPU_DECODER = "DALI decoder=cpu num_threads=8"


def lane(base: LaneFacts = DALI_LANE, **changes: Any) -> LaneFacts:
    """`base` with some fields changed, its figures' first (`cpu_pct` is the lane's)."""
    figures = {k: changes.pop(k) for k in list(changes) if hasattr(base.figures, k)}
    return replace(base, figures=replace(base.figures, **figures), **changes)


def diagnose(facts: LaneFacts) -> RunDiagnosis:
    return judge_run("run", RunStatus.COMPLETED, [facts])


def found(diagnosis: RunDiagnosis) -> dict[VerdictKind, Verdict]:
    return {v.kind: v for v in diagnosis.findings}


def more_threads(recommendations: tuple[Recommendation, ...]) -> list[Recommendation]:
    return [
        r
        for r in recommendations
        if r.change.knob is Knob.NUM_THREADS or "raise DALI num_threads" in r.action
    ]


def test_dali_on_the_training_gpu_slowing_the_step_is_gpu_sharing() -> None:
    diagnosis = diagnose(DALI_LANE)
    findings = found(diagnosis)
    assert VerdictKind.NOISY_NEIGHBOUR not in findings
    texts = [e.text for e in findings[VerdictKind.GPU_SHARED].evidence]
    assert texts[0].startswith(
        "the step took 41.2 ± 0.5 ms with DALI decoding on the same GPU against 33.0 ± 0.4 ms "
        "alone (+25%), while the host's CPU was 38% busy (saturated from 85%): DALI's kernels "
        "take SMs from the model"
    )
    assert "SM activity 92% (GPM)" in texts
    assert "hardware JPEG decoder 35% (NVML)" in texts
    assert any(t.startswith("host CPU 38% busy") for t in texts)


def test_gpu_sharing_recommends_decoding_off_the_sms_and_never_more_threads() -> None:
    recommendations = diagnose(DALI_LANE).recommendations
    assert not more_threads(recommendations)
    settings = [r.setting for r in recommendations]
    # the CPU decoder first, then more JPEGs to the hardware decoder (35% busy), above 0.65
    assert settings.index(CPU_DECODER) < settings.index("DALI hw_decoder_load=0.9")
    (cpu,) = [r for r in recommendations if r.setting == CPU_DECODER]
    assert cpu.predicted_images_per_s == 3900.0  # at best the consumer alone's rate
    assert cpu.basis.startswith("estimated")
    assert any("the DataLoader" in note and "38% busy" in note for note in cpu.notes)


def test_a_saturated_or_missing_hardware_decoder_gets_no_more_jpegs() -> None:
    for changes in ({"nvjpg_pct": 95.0}, {"nvjpg_pct": None}, {"hw_decoder_load": 1.0}):
        settings = [r.setting for r in diagnose(lane(**changes)).recommendations]
        assert CPU_DECODER in settings
        assert not any("hw_decoder_load" in s for s in settings), changes


def test_even_with_its_threads_busy_a_gpu_slowdown_gets_no_more_threads() -> None:
    busy = lane(data_wait_frac=0.3, cpu_pct=790.0)  # 8 threads using 7.9 of 16 cores
    diagnosis = diagnose(busy)
    assert diagnosis.lanes[0].kind is VerdictKind.DALI_THREADS_SATURATED
    assert VerdictKind.GPU_SHARED in found(diagnosis)
    assert not more_threads(diagnosis.recommendations)
    assert CPU_DECODER in [r.setting for r in diagnosis.recommendations]
    # the same lane, its step as fast as alone: more threads, as before
    unslowed = diagnose(lane(busy, step_ms_p50=33.0))
    assert VerdictKind.GPU_SHARED not in found(unslowed)
    assert more_threads(unslowed.recommendations)


def test_with_the_cpu_saturated_the_slowdown_stays_the_cpus() -> None:
    for saturated in (
        lane(host=HostLoad(cpu_pct=97.0, machine_cores=16)),  # the host's CPU
        lane(cpu_pct=1500.0, num_threads=16),  # the lane's 16 cores, all DALI's threads
    ):
        diagnosis = diagnose(saturated)
        findings = found(diagnosis)
        assert VerdictKind.GPU_SHARED not in findings
        assert VerdictKind.NOISY_NEIGHBOUR in findings
        assert "under the loader's load" in findings[VerdictKind.NOISY_NEIGHBOUR].evidence[0].text
        assert not any("decoder=cpu" in r.setting for r in diagnosis.recommendations)


def test_a_dataloader_lane_slowed_is_the_noisy_neighbour_as_before() -> None:
    torch_lane = lane(backend="torch", decoder=None, num_threads=None, num_workers=8,
                      hw_decoder_load=None, pin_memory=True, output_dtype="uint8")  # fmt: skip
    findings = found(diagnose(torch_lane))
    assert VerdictKind.GPU_SHARED not in findings
    assert VerdictKind.NOISY_NEIGHBOUR in findings


def test_a_gpu_sleep_step_is_slowed_by_sharing_too_but_nothing_decodes_off_the_gpu() -> None:
    # On a GPU `sleep:MS` is matrix products filling the SMs: DALI's kernels delay them,
    # though the step asks for little CPU (0.02 ms an image: 2.6 ms of its 41.2 ms)
    asleep = lane(consumer="sleep:33", stages_ms={"step": 0.02})
    assert VerdictKind.GPU_SHARED in found(diagnose(asleep))
    for other in (lane(decoder="cpu"), lane(on_gpu=False, consumer="sleep:33")):
        assert VerdictKind.GPU_SHARED not in found(diagnose(other))


def test_a_step_within_its_errors_of_alone_is_no_finding() -> None:
    # 6% slower, yet 2.0 ms is within both errors (2.0 + 0.4 ms)
    close = lane(step_ms_p50=35.0, step_ms_p50_error=2.0)
    assert VerdictKind.GPU_SHARED not in found(diagnose(close))
    assert VerdictKind.GPU_SHARED in found(diagnose(lane(close, step_ms_p50_error=1.0)))
