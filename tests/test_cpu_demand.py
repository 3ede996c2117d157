"""A loader judged by what it needs: the CPU each image costs against the rate the step could
take and the cores the lane may use (`LaneFacts.cpu_capped`), not by its average busy share,
which a loop of short epochs keeps low; and where such a loop's time goes (`TimeSplit`).

The recorded point: pytorch/examples' ImageNet script on one H200 with 16 cores, 16 workers,
ResNet-18, 3,072 camera-sized JPEGs (24 batches of 128 an epoch), 3 epochs with a validation
pass after each. Each image costs about 20 ms of CPU and the step could take 2,327 images/s:
46.5 cores' worth, of 16. An epoch opens on a stall while the 16 workers make the first 16
batches at once, and ends on a tail: the last 8 batches, made by 8 workers while the other 8
sit idle. It was judged "starved, though the CPU has room" (7.2 cores busy on average, time
outside the loop included) with an endless sampler first; the CPU caps it near 800 images/s
whatever its epochs do, and DALI is the answer. (Those are the issue's figures, built by hand
below. The runs recorded since, at the end, measured 30 ms of CPU an image over the loop's own
time: a cap near 520 images/s, and 491 with epochs 8 times longer.)
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import probe_cli, skip_on_a_busy_host
from probe.judge.changes import Knob
from probe.judge.diagnosis import diagnose_run, judge_run
from probe.judge.epochs import in_rounds, rounds_images_per_s
from probe.judge.facts import HostLoad, LaneFacts, run_facts
from probe.judge.verdicts import VerdictKind
from probe.lane_figures import EpochStartCost, LaneFigures, Reading, lane_figures
from probe.records import BatchEvent, LaneCpuSample, RunStatus
from probe.steady import epoch_starts
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store

BATCH = 128
IMAGES_PER_S = 512.0  # over the measured batches' time
SECONDS = 67 * BATCH / IMAGES_PER_S  # 67 batches measured, the first 5 warm-up

# Two measured epoch starts of 4.06 s (the first batch of 16 made at once by 16 workers, after
# the loader's start), three tails of 1.68 s (the 17th batch: 8 workers make the last 8).
H200_EPOCHS = EpochStartCost(
    starts=2, batches_per_epoch=24.0, opening_batches=12, stall_ms=4060.0,
    share=2 * 4.06 / SECONDS, steady_images_per_s=67 * BATCH / (SECONDS - 2 * 4.06),
    ends=3, tail_batches=8, tail_ms=1680.0, tail_share=3 * 1.68 / SECONDS,
)  # fmt: skip

H200 = LaneFacts(
    lane=0, status="completed", backend="torch", consumer="your training step",
    batch_size=BATCH,
    figures=LaneFigures(
        batches=67, images=67 * BATCH, seconds=SECONDS, images_per_s=IMAGES_PER_S,
        images_per_s_error=20.0, data_wait_frac=0.78, data_wait_frac_error=0.03, blocks=4,
        epoch_start=H200_EPOCHS, step_ms_p50=55.0, cpu_pct=1024.0,  # 20 ms an image
        wall_s=SECONDS + 2 * 1.5,  # two validation passes between the three epochs
    ),
    hostname="h200", host_cpus=16, lanes_on_host=1, on_gpu=True, num_workers=16,
    pin_memory=True, output_dtype="uint8", persistent_workers=False,
    host=HostLoad(cpu_pct=55.0, other_cores=0.0, machine_cores=16), prefetch_factor=2,
    image_size=224, watched_run="watch-h200",
)  # fmt: skip


def test_the_h200_loader_is_capped_by_its_cpu_not_by_its_epochs() -> None:
    assert H200.figures.cpu_ms_per_image == pytest.approx(20.0)
    assert H200.consumer_images_per_s == pytest.approx(2327.3, abs=0.1)
    assert H200.cpu_demand_cores == pytest.approx(46.5, abs=0.1)
    assert H200.cpu_cap_images_per_s == pytest.approx(800.0)
    assert H200.cpu_capped and H200.cpu_caps_epochs
    assert not H200.cpu_saturated  # 10.2 of 16 cores over the batches' time: room, it seems
    diagnosis = judge_run("watch-h200", RunStatus.COMPLETED, [H200])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_SATURATED
    assert diagnosis.verdict.title == (
        "starved: the CPU caps the loader: decoding needs more cores or the GPU"
    )
    texts = [e.text for e in diagnosis.verdict.evidence]
    assert texts[:3] == [
        "data-wait 78.0% ± 3.0% of wall time (>= 20%: high)",
        "each image costs 20.00 ms of CPU (workers and training process); the step could take "
        "2,327 images/s, 46.5 cores' worth; the lane may use 16 cores: the CPU caps "
        "the loader near 800 images/s",
        "host CPU 55% busy (8.8 of the machine's 16 cores)",
    ]
    split = (
        "of the 19.8 s from the first measured batch to the last one's end: 18% (3.6 s) in the "
        "windows between epoch starts and tails; 41% (8.1 s) in 2 epoch starts; 26% (5.0 s) in "
        "3 epoch tails (the last 8 batches of each, made while some of the 16 workers sit "
        "idle); 15% (3.0 s) outside the loop's iteration (validation, checkpoints)"
    )
    assert split in texts
    # the epoch starts come second, as a finding of their own
    assert [f.kind for f in diagnosis.findings] == [VerdictKind.EPOCH_START_STALL]
    assert split in [e.text for e in diagnosis.findings[0].evidence]


def test_the_h200_answer_is_dali_first_and_the_epoch_fixes_capped_by_the_cpu() -> None:
    diagnosis = judge_run("watch-h200", RunStatus.COMPLETED, [H200])
    first, *rest = diagnosis.recommendations
    assert first.setting == "DALI decoder=mixed num_threads=8"
    assert first.predicted_images_per_s == pytest.approx(128 / 0.055)
    assert first.basis == (
        "estimated: at most the consumer's own rate, if DALI keeps up; `probe doctor --like "
        "watch-h200` measures it on the job's own files"
    )
    assert [r.setting for r in rest] == [
        "sampler=endless", "epoch_length=4x", "persistent_workers=True"
    ]  # fmt: skip
    endless, longer, _ = rest
    for fix in (endless, longer):
        assert fix.predicted_images_per_s == pytest.approx(800.0)
    # without the CPU's cap, reading across epoch ends gives what the windows between the
    # starts and tails give (2,389 images/s), at most the step's rate
    assert endless.notes == (
        "the lane's cores make at most 800 images/s (20.00 ms of CPU an image, 16 cores per "
        "GPU): with the CPU answered (DALI, decoding on the GPU), at most 2,327 images/s",
    )
    assert H200.figures.windows_images_per_s == pytest.approx(2389, abs=1)
    assert not any(r.change.knob is Knob.NUM_WORKERS for r in diagnosis.recommendations)


def test_workers_short_of_the_cores_hold_the_loader_below_the_cpus_cap() -> None:
    """4 workers of 16 cores, each image 20 ms of CPU: 200 images/s, a quarter of the 800 the
    16 cores can make. The workers hold the loader, not the CPU: more of them first, giving at
    most that cap; as it is short of the step's 2,327 images/s (46.5 cores' worth), DALI
    after them, and no line claims room the 16 cores do not have."""
    figures = replace(H200.figures, images_per_s=200.0, cpu_pct=400.0, epoch_start=None)
    four = replace(H200, num_workers=4, figures=figures)
    assert four.cpu_short and four.workers_hold and not four.cpu_capped
    diagnosis = judge_run("four", RunStatus.COMPLETED, [four])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_HEADROOM
    more, dali = diagnosis.recommendations
    assert more.action == "raise num_workers from 4 to 16"
    assert more.predicted_images_per_s == pytest.approx(800.0)
    assert "(at 20.00 ms of CPU an image, 800 images/s)" in more.basis
    assert dali.setting == "DALI decoder=mixed num_threads=8"
    assert dali.predicted_images_per_s == pytest.approx(128 / 0.055)
    assert dali.notes == (
        "past what more workers can give: the CPU would cap them near 800 images/s, short of "
        "the 2,327 images/s the step could take",
    )
    (demand,) = [e.text for e in diagnosis.verdict.evidence if e.metric == "cpu_demand_cores"]
    assert demand.endswith(
        "46.5 cores' worth; the lane may use 16 cores: the 4 workers hold the loader, not the "
        "CPU (it measured 200 ± 20 images/s of a cap near 800 images/s); more workers give at "
        "most about that cap, short of what the step could take (it needs 46.5 cores, has 16 cores)"
    )


@pytest.mark.parametrize(
    "images_per_s, error, kind",
    [
        (760.0, 20.0, VerdictKind.STARVED_CPU_SATURATED),  # 15.2 of 16 cores: saturated too
        (660.0, 30.0, VerdictKind.STARVED_CPU_SATURATED),  # 82.5% of the cap, 86% with its error
        (660.0, 10.0, VerdictKind.STARVED_CPU_HEADROOM),  # 84% at most: below it, surely
    ],
)
def test_workers_near_their_cpu_cap_are_capped_by_it(
    images_per_s: float, error: float, kind: VerdictKind
) -> None:
    """4 workers whose decoding runs several threads each, at 20 ms of CPU an image: the 16
    cores make at most 800 images/s. A rate within CPU_CAP_NEAR (85%) of that cap, with its
    error, is the CPU's, and DALI comes first; surely below it, the workers'."""
    figures = replace(H200.figures, images_per_s=images_per_s, images_per_s_error=error,
                      cpu_pct=2 * images_per_s, epoch_start=None)  # fmt: skip
    four = replace(H200, num_workers=4, figures=figures)
    assert four.cpu_cap_images_per_s == pytest.approx(800.0) and four.cpu_short
    assert four.cpu_capped is (kind is VerdictKind.STARVED_CPU_SATURATED)
    diagnosis = judge_run("near", RunStatus.COMPLETED, [four])
    assert diagnosis.verdict.kind is kind
    first = diagnosis.recommendations[0].change.knob
    assert first is (Knob.PIPELINE if four.cpu_capped else Knob.NUM_WORKERS)


# The figures (#47): a watched loader on the 2-core machine, no GPU, num_workers=1, its
# processes using 1.1 of the 2 cores at 232 images/s (4.74 ms of CPU an image) while other
# processes used 0.06: the 1.94 cores left make at most 409 images/s. Batches of 32, a 50 ms
# step: it could take 640 images/s, 3.0 cores' worth.
ONE_WORKER = LaneFacts(
    lane=0, status="completed", backend="torch", consumer="your training step", batch_size=32,
    figures=LaneFigures(
        batches=200, images=200 * 32, seconds=200 * 32 / 232.0, images_per_s=232.0,
        images_per_s_error=9.0, data_wait_frac=0.64, data_wait_frac_error=0.03, blocks=10,
        step_ms_p50=50.0, cpu_pct=110.0,
    ),
    hostname="cpu2", host_cpus=2, lanes_on_host=1, on_gpu=False, num_workers=1,
    pin_memory=False, output_dtype="float32", persistent_workers=False,
    host=HostLoad(cpu_pct=58.0, other_cores=0.06, machine_cores=2), prefetch_factor=2,
    image_size=224, watched_run="watch-2core",
)  # fmt: skip


def test_a_loader_well_below_its_cpu_cap_is_not_capped() -> None:
    """232 images/s of a cap near 409: its 1 worker holds it, not the CPU. The verdict says so,
    its first change raises num_workers (to the cap, at most), and as the cap is short of the
    step's 640 images/s, DALI is offered after it."""
    assert ONE_WORKER.cpu_cap_images_per_s == pytest.approx(409.2, abs=0.1)
    assert ONE_WORKER.cpu_short and ONE_WORKER.workers_hold and not ONE_WORKER.cpu_capped
    diagnosis = judge_run("watch-2core", RunStatus.COMPLETED, [ONE_WORKER])
    verdict = diagnosis.verdict
    assert verdict.kind is VerdictKind.STARVED_CPU_HEADROOM
    assert verdict.title == "starved, with CPU headroom: too few workers"
    (demand,) = [e.text for e in verdict.evidence if e.metric == "cpu_demand_cores"]
    assert demand == (
        "each image costs 4.74 ms of CPU (workers and training process); the step could take "
        "640 images/s, 3.0 cores' worth; the lane may use 2 cores, 0.1 of them used by other "
        "processes: the 1 worker holds the loader, not the CPU (it measured 232 ± 9 images/s "
        "of a cap near 409 images/s); more workers give at most about that cap, short of what "
        "the step could take (it needs 3.0 cores, has 2 cores)"
    )
    first, dali = diagnosis.recommendations
    assert first.action == "raise num_workers from 1 to 2"
    assert first.predicted_images_per_s == pytest.approx(409.2, abs=0.1)
    assert dali.setting == "DALI decoder=cpu num_threads=2"
    assert dali.predicted_images_per_s is None  # DALI's CPU decoder: the same 2 cores
    # A 100 ms step takes 320 images/s, 1.5 cores' worth: room for that, and no DALI.
    quick = replace(ONE_WORKER, figures=replace(ONE_WORKER.figures, step_ms_p50=100.0))
    assert not quick.cpu_short
    settings = [r.setting for r in judge_run("quick", RunStatus.COMPLETED, [quick]).recommendations]
    assert settings == ["num_workers=2"]


def test_on_the_cpu_alone_dalis_rate_is_not_claimed() -> None:
    on_cpu = replace(H200, on_gpu=False, watched_run=None)
    diagnosis = judge_run("cpu", RunStatus.COMPLETED, [on_cpu])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_SATURATED
    (dali,) = [r for r in diagnosis.recommendations if r.change.knob is Knob.PIPELINE]
    assert dali.setting == "DALI decoder=cpu num_threads=8"
    assert dali.predicted_images_per_s is None
    assert dali.basis == (
        "not predicted: DALI's CPU decoder uses the same cores; `probe doctor` measures it"
    )
    endless = diagnosis.recommendations[0]
    assert endless.setting == "sampler=endless" and endless.predicted_images_per_s == 800.0
    assert endless.notes[0].endswith("with the CPU answered (more cores), at most 2,327 images/s")


def test_a_fed_loader_stays_fed() -> None:
    """The same loader for a step of 500 ms (ResNet-152 at a large image size, say): 256
    images/s at 20 ms of CPU each is 5.1 cores' worth, and the loader keeps up."""
    figures = replace(H200.figures, step_ms_p50=500.0, images_per_s=250.0, cpu_pct=500.0,
                      data_wait_frac=0.02, data_wait_frac_error=0.01, epoch_start=None)  # fmt: skip
    fed = replace(H200, figures=figures)
    assert fed.cpu_demand_cores == pytest.approx(5.1, abs=0.1) and not fed.cpu_capped
    diagnosis = judge_run("fed", RunStatus.COMPLETED, [fed])
    assert diagnosis.verdict.kind is VerdictKind.FED
    assert [r.setting for r in diagnosis.recommendations] == ["no change"]


@pytest.mark.parametrize(
    "workers, kind",
    [(8, VerdictKind.STARVED_CPU_HEADROOM), (16, VerdictKind.STARVED_LOADER_LIMIT)],
)
def test_a_loader_the_cores_can_feed_keeps_its_verdict(workers: int, kind: VerdictKind) -> None:
    """3 ms of CPU an image at the step's 2,327 images/s: 7.0 cores' worth, of 16."""
    light = replace(
        H200,
        num_workers=workers,
        figures=replace(H200.figures, cpu_pct=IMAGES_PER_S * 0.3, epoch_start=None),
    )
    assert light.cpu_demand_cores == pytest.approx(7.0, abs=0.1) and not light.cpu_capped
    verdict = judge_run("light", RunStatus.COMPLETED, [light]).verdict
    assert verdict.kind is kind
    (demand,) = [e.text for e in verdict.evidence if e.metric == "cpu_demand_cores"]
    assert demand.endswith(
        "7.0 cores' worth; the lane may use 16 cores: room for that (they could make "
        "5,333 images/s)"
    )


def test_more_workers_are_bounded_by_what_the_cores_can_make() -> None:
    """4 workers whose decoding runs two threads each keep 9 cores busy at 20 ms an image, 112
    images/s a worker; no step measured to aim at: twice today's rate, yet no more than the
    800 images/s the 16 cores can make, which 8 workers reach."""
    figures = replace(H200.figures, images_per_s=450.0, cpu_pct=900.0, epoch_start=None,
                      step_ms_p50=None)  # fmt: skip
    lane = replace(H200, num_workers=4, figures=figures)
    assert lane.cpu_cap_images_per_s == pytest.approx(800.0)
    diagnosis = judge_run("threads", RunStatus.COMPLETED, [lane])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_HEADROOM
    (more,) = diagnosis.recommendations
    assert more.setting == "num_workers=8"
    assert more.predicted_images_per_s == pytest.approx(800.0)
    assert "bounded by the 16 cores per GPU (at 20.00 ms of CPU an image, 800 images/s)" in (
        more.basis
    )


# -- the figures: CPU over the batches' time, and the time split -------------------------------

WORKERS, PER_EPOCH, STEP_S = 4, 6, 0.05
TICK_S = 0.1  # between CPU samples


def h200_shaped(epochs: int = 4) -> tuple[list[BatchEvent], list[LaneCpuSample]]:
    """A loop of the H200's shape, small: 4 workers make 6 batches an epoch, each in 1 s, all
    starting together at the epoch's start; the last 2 batches are made by 2 workers while 2
    sit idle; a validation pass of 2 s follows each epoch (an epoch takes 2.1 s, on the
    samples' ticks). CPU samples every 0.1 s: 400% while all four work, 200% in the tail, 50%
    during validation."""
    events: list[BatchEvent] = []
    samples: list[LaneCpuSample] = []
    tick = 0  # the epoch's start, in ticks
    for epoch in range(epochs):
        start = tick * TICK_S
        ready = [start + 1.0] * WORKERS + [start + 2.0] * (PER_EPOCH - WORKERS)
        clock = start
        for at in ready:
            wait = max(0.0, at - clock)
            index = len(events)
            events.append(BatchEvent(0, index, round(clock * 1e9), wait, STEP_S, 8,
                                     index < 2, epoch))  # fmt: skip
            clock += wait + STEP_S
        for n in range(1, 21 + 20 + 1):  # the epoch's 21 ticks, then validation's 20
            load = 400.0 if n <= 10 else 200.0 if n <= 21 else 50.0
            samples.append(LaneCpuSample(round((tick + n) * TICK_S * 1e9), 0, load, load / 8,
                                         5.0, 5, 9))  # fmt: skip
        tick += 41
    return events, samples


def test_epoch_tails_cost_their_wait_beyond_the_middle_batches() -> None:
    events, _ = h200_shaped()
    found = epoch_starts(events, WORKERS)
    assert found is not None
    assert (found.starts, found.opening_batches, found.tail_batches) == (3, 3, 2)
    assert found.ends == 4  # the first epoch's tail was measured too
    # the middle batch (the 4th) waits nothing: a start costs its 1 s, a tail its 1 s less
    # the four steps between
    assert found.stall_s == pytest.approx(1.0)
    assert found.tail_s == pytest.approx(1.0 - 4 * STEP_S)


def test_a_lanes_cpu_is_over_its_batches_time_and_its_wall_time_splits() -> None:
    events, samples = h200_shaped()
    figures = lane_figures(events, cpu_samples=samples, reading=Reading(WORKERS, WORKERS))
    measured = [e for e in events if not e.warmup]
    # 400% over the first second of each epoch but the first (warm-up's), 200% over the rest
    # of its batches' time; validation's 50% in no figure, as the samples' mean has it
    seconds = figures.seconds
    busy = (3 * 1.0 * 400 + (seconds - 3 * 1.0) * 200) / seconds
    assert figures.cpu_pct == pytest.approx(busy, rel=1e-6)
    within = [s.cpu_pct for s in samples if measured[0].t_ns <= s.t_ns]
    assert sum(within) / len(within) < 0.7 * busy
    split = figures.time_split
    assert split is not None
    end = measured[-1].t_ns / 1e9 + STEP_S
    assert split.wall_s == pytest.approx(end - measured[0].t_ns / 1e9)
    assert split.outside_s == pytest.approx(3 * 2.0)  # the validation between epochs
    assert split.starts_s == pytest.approx(3 * 1.0)
    assert split.tails_s == pytest.approx(4 * (1.0 - 4 * STEP_S))
    assert split.windows_s + split.starts_s + split.tails_s + split.outside_s == pytest.approx(
        split.wall_s
    )
    again = LaneFigures.from_json(json.loads(json.dumps(figures.to_json())))
    assert again == figures


def test_a_document_stored_before_the_split_reads_without_it() -> None:
    stored = LaneFigures(batches=10, images=80, seconds=1.0, images_per_s=80.0,
                         epoch_start=H200_EPOCHS).to_json()  # fmt: skip
    del stored["wall_s"]
    for key in ("ends", "tail_batches", "tail_ms", "tail_share"):
        del stored["epoch_start"][key]
    old = LaneFigures.from_json(stored)
    assert old.wall_s is None and old.time_split is None
    assert old.epoch_start is not None and old.epoch_start.ends == 0
    assert old.epoch_start.tail_share == 0.0


# -- live: a CPU-bound watched script ---------------------------------------------------------

SCRIPT = """\
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Costly(Dataset):
    \"\"\"Items that each burn {cost_s} s of CPU: a decode's worth.\"\"\"

    def __init__(self, count):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        until = time.thread_time() + {cost_s}
        while time.thread_time() < until:
            pass
        return torch.zeros(3, 8, 8), index


train = DataLoader(Costly(24), batch_size=8, num_workers=2)
val = DataLoader(Costly(8), batch_size=8)
for epoch in range({epochs}):
    for images, labels in train:
        time.sleep(0.003)
    for images, labels in val:
        pass
"""


def test_a_cpu_bound_watched_script_is_capped_by_its_cpu_then_its_epoch_starts(
    tmp_path: Path,
) -> None:
    """2 workers make 3 batches of 8 an epoch at 25 ms of CPU an image, for a step that could
    take a batch every few ms: over 40 cores' worth, on a machine of 2."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(cost_s=0.025, epochs=14)))
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", sys.executable, script, timeout=300)
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        runs = {run.label: run.run_id for run in store.runs()}
        diagnosis = diagnose_run(store, runs["train.py"]).to_json()
    skip_on_a_busy_host({"diagnosis": diagnosis})
    verdict = diagnosis["verdict"]
    assert verdict["kind"] == "starved_cpu_saturated", verdict
    (demand,) = [e for e in verdict["evidence"] if e["metric"] == "cpu_demand_cores"]
    assert demand["value"] > 10  # cores' worth, for a lane of 2
    assert "the CPU caps the loader near" in demand["text"]
    assert [f["kind"] for f in diagnosis["findings"]][:1] == ["epoch_start_stall"]
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    assert told[0].startswith("feedscope: train.py, the training loader, ")
    assert told[0].endswith(
        verdict["title"] + f" (high: data-wait {verdict['data_wait_frac']:.1%})"
    )
    assert told[1].startswith("feedscope:   also: starved at epoch starts")  # second


# --- the recorded runs themselves (tests/benchmarks/results/2026-11-27-watch-cases) -----------

WATCH_CASES = Path(__file__).parent / "benchmarks" / "results" / "2026-11-27-watch-cases"
EIGHT, SIXTEEN, LONG = (  # the ImageNet script's training loader under probe watch
    ("watch8", "20261127-053511-b1a5"),  # 8 workers, 24 batches an epoch, 8 epochs
    ("watch16", "20261127-053256-1c2f"),  # 16 workers, the same
    ("long", "20261127-060846-b8ae"),  # 16 workers, 192 batches an epoch, 2 epochs
)


def recorded(tmp_path: Path, case: tuple[str, str], anew: bool = False) -> LaneFacts:
    """The recorded run's training lane, its figures as stored when it ended or (`anew`)
    computed again from its rows by today's code."""
    db = tmp_path / f"{case[0]}.db"
    shutil.copyfile(WATCH_CASES / case[0] / "feedscope.db", db)
    with Store(db) as store:
        run = store.run(case[1])
        if anew:
            (lane,) = store.lanes(run.run_id)
            figures = lane_figures_from_store(store, run, lane)
            store.update_lane(run.run_id, lane.lane, summary=figures.to_json())
        (facts,) = run_facts(store, run.run_id)
    return facts


def test_more_workers_for_few_batches_an_epoch_are_predicted_in_rounds(tmp_path: Path) -> None:
    """24 batches an epoch: 8 workers make them in 3 rounds, 12 or 16 in 2. From the 8-worker
    job, 16 workers are predicted within 10% of the 16-worker job as measured, and the other
    way round; the advice is 12 (as few rounds as 16, fewer workers); at 16 nothing gains."""
    eight, sixteen = recorded(tmp_path, EIGHT), recorded(tmp_path, SIXTEEN)
    assert (eight.figures.images_per_s, sixteen.figures.images_per_s) == pytest.approx(
        (232, 363), abs=1
    )
    at_16, at_8 = rounds_images_per_s(eight, 16), rounds_images_per_s(sixteen, 8)
    assert at_16 == pytest.approx(sixteen.figures.images_per_s, rel=0.10)  # 340 against 363
    assert at_8 == pytest.approx(eight.figures.images_per_s, rel=0.10)  # 247 against 232
    advice = in_rounds(eight)
    assert advice is not None and advice.setting == "num_workers=12"
    assert advice.action == (
        "raise num_workers from 8 to 12: its 24 batches an epoch take 2 rounds of a batch per "
        "worker, against 3 now, and keep the workers across epochs (persistent_workers=True)"
    )
    at_12 = rounds_images_per_s(eight, 12)
    assert at_12 == pytest.approx(at_16, rel=0.02)
    assert advice.notes[0].startswith(f"without persistent_workers=True: {at_12:,.0f} images/s")
    assert in_rounds(sixteen) is None


def test_the_cpu_cap_read_off_short_epochs_holds_for_long_ones(tmp_path: Path) -> None:
    """The CPU each image costs, over the loop's own time (its validation and checkpoints left
    out), read off the job of short epochs: the cap it gives is what the same script with
    epochs 8 times longer measured (491 images/s), within 10%; the CPU caps both, and DALI is
    the first change of both."""
    short, long = recorded(tmp_path, SIXTEEN, anew=True), recorded(tmp_path, LONG, anew=True)
    assert short.figures.cpu_ms_per_image == pytest.approx(30, abs=1.5)
    cap = short.cpu_cap_images_per_s
    assert cap is not None and long.figures.images_per_s == pytest.approx(cap, rel=0.10)
    for facts in (short, long):
        diagnosis = judge_run("recorded", RunStatus.COMPLETED, [facts])
        assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_SATURATED and facts.cpu_capped
        assert diagnosis.recommendations[0].change.knob is Knob.PIPELINE


def test_the_recorded_eight_workers_are_held_by_them_not_by_the_cpu(tmp_path: Path) -> None:
    """The 8-worker job, as recorded: 232 images/s, under half of what its 16 cores make at 31
    ms of CPU an image. Its 8 workers hold it: more of them first, then DALI, as the cap is
    far short of the step's rate; the 16-worker job, its cores all given workers, stays capped."""
    eight = recorded(tmp_path, EIGHT, anew=True)
    cap = eight.cpu_cap_images_per_s
    assert cap is not None and eight.figures.images_per_s < 0.5 * cap
    assert eight.cpu_short and not eight.cpu_capped
    diagnosis = judge_run("recorded", RunStatus.COMPLETED, [eight])
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_HEADROOM
    assert [r.setting for r in diagnosis.recommendations] == [
        "num_workers=12", "DALI decoder=mixed num_threads=8"
    ]  # fmt: skip
    assert recorded(tmp_path, SIXTEEN, anew=True).cpu_capped


def test_a_watched_dali_iterator_is_judged_and_advised_in_its_own_terms() -> None:
    """DALI's ResNet-50 example on one GPU (`-j 8`, mixed decoder at DALI's default share),
    starved at 30% with its threads using 3 of 16 cores: too few DALI threads, not "too few
    workers", and its first changes are DALI's: more threads, then more of the JPEGs to the
    hardware decoder, which has room."""
    lane = replace(
        H200, backend="dali", num_workers=None, pin_memory=None, output_dtype=None,
        persistent_workers=None, prefetch_factor=None, num_threads=8, decoder="mixed",
        hw_decoder_load=0.65,
        figures=replace(H200.figures, images_per_s=1500.0, data_wait_frac=0.30,
                        cpu_pct=300.0, nvjpg_pct=35.0, epoch_start=None),
    )  # fmt: skip
    diagnosis = judge_run("dali-example", RunStatus.COMPLETED, [lane])
    assert diagnosis.verdict.kind is VerdictKind.DALI_THREADS_TOO_FEW
    assert diagnosis.verdict.title == "starved, with CPU headroom: too few DALI threads"
    settings = [r.setting for r in diagnosis.recommendations]
    assert settings == ["DALI num_threads=16", "DALI hw_decoder_load=0.9"]


def test_findings_besides_the_verdict_are_told_once_each() -> None:
    """The verdict's own kind is not told again, and a finding of several lanes once, its worst
    lane's: "also: starved at epoch starts" on an 8-GPU job is one line, not eight."""
    from probe.judge.thresholds import Severity
    from probe.judge.verdicts import Verdict
    from probe.present.tables import also_lines, headline

    verdict = Verdict(VerdictKind.STARVED_CPU_SATURATED, Severity.HIGH, 0.9, ())
    epochs = [
        Verdict(VerdictKind.EPOCH_START_STALL, Severity.HIGH, wait, (), lane)
        for lane, wait in enumerate((0.5, 0.7, 0.6))
    ]
    again = replace(verdict, lane=1, data_wait_frac=0.8)
    lines = also_lines(verdict, [again, *epochs], headlines=True)
    assert lines == ["also: " + headline(epochs[1])]
