"""`probe doctor --like` of a watched DDP job: the stand-in step is the step each rank took
without waiting for the others at the all-reduce (each batch's shortest across the ranks), not
the slowest rank's median, which holds its wait for a starved peer; a job of one lane keeps its
own median; ranks that do not run in step are not read as DDP's. On batch rows built in a
store, as the ranks of a watched job write them."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import photo_folder
from probe import InputError
from probe.judge.evidence import UnwaitedStep, unwaited_step
from probe.lane_figures import LaneFigures
from probe.measure.consumers import consumer_note, parse_consumer
from probe.present.options import decimal, stand_in, stand_in_step
from probe.records import BatchAcross, BatchEvent, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.documents import LaneDocument, RunDocument, read_run

RUN = "20261128-watch-0000ddp0"
WARMUP = 5
ALL_REDUCE_MS = 0.5  # the all-reduce's own time: in every rank's step, the last one's too


def watched_run(store: Store, folder: Path, ranks: int) -> None:
    """A completed watched job of `ranks` CPU ranks (one lane each) that read `folder`."""
    spec = {"data_dir": str(folder), "batch_size": 4, "image_size": 32,
            "dataloader": {"num_workers": 0, "persistent_workers": False}}  # fmt: skip
    run = RunRecord(
        run_id=RUN, kind="watch", created="2026-11-28T08:00:00Z", status=RunStatus.COMPLETED,
        reason=None, pipeline="torch", consumer="your training step", label="ddp.py",
        config={"world_size": ranks, "read": "epochs", "warmup": WARMUP, "spec": spec},
        host={}, hostname="here", pid=100, started_ns=0, ended_ns=60 * 10**9,
    )  # fmt: skip
    ended = RunStatus.COMPLETED
    lanes = [LaneRecord(RUN, rank, None, None, rank, ranks, "here", 100 + rank, ended, None, None)
             for rank in range(ranks)]  # fmt: skip
    store.create_run(run, lanes)


def in_step(waits_ms: Sequence[Sequence[float]], compute_ms: Sequence[float]) -> list[list[Any]]:
    """Each rank's batches (wait, step) in ms as DDP's all-reduce paces them: every rank's step
    ends when the last rank's data came and its compute and the all-reduce are done, so a
    rank's step is its compute, the all-reduce's own time and its wait there for the last."""
    ranks = []
    for waits in waits_ms:
        times = []
        for index, wait in enumerate(waits):
            last = max(w[index] for w in waits_ms)
            times.append((wait, compute_ms[index] + ALL_REDUCE_MS + last - wait))
        ranks.append(times)
    return ranks


def write_batches(store: Store, ranks: Sequence[Sequence[tuple[float, float]]]) -> None:
    """The ranks' batches, each asked for when the one before it ended; the first WARMUP are
    warm-up."""
    for rank, times in enumerate(ranks):
        events, t_ns = [], 0
        for index, (wait_ms, step_ms) in enumerate(times):
            events.append(
                BatchEvent(rank, index, t_ns, wait_ms / 1e3, step_ms / 1e3, 4, index < WARMUP)
            )
            t_ns += round((wait_ms + step_ms) * 1e6)
        store.add_batches(RUN, events)


def stored(tmp_path: Path, photos: Path, ranks: Sequence[Sequence[tuple[float, float]]]) -> Path:
    """A store holding a watched job of these ranks' batches (`write_batches`) that read
    `photos`."""
    db = tmp_path / "store.db"
    with Store(db) as store:
        watched_run(store, photos, ranks=len(ranks))
        write_batches(store, ranks)
    return db


def doctor_like(
    db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    """`probe doctor --like RUN` on the CPU up to the diagnosis (what it would measure with,
    and the session's `like` and `step_read`), and the line that says what it copied."""
    from probe.present.cli import main

    seen: dict[str, Any] = {}

    def run_doctor(config: Any, *args: Any, **kwargs: Any) -> None:
        seen.update(consumer=str(config.consumer), **kwargs)
        raise InputError("measured no further")

    monkeypatch.setattr("probe.judge.doctor.run_doctor", run_doctor)
    assert main(["doctor", "--like", RUN, "--db", str(db), "--gpus", "none"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said[-1] == "error: measured no further"
    return seen, said[0]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("photos"), [(64, 48)] * 4, 2)


def test_a_ddp_runs_stand_in_is_the_step_without_the_wait_for_a_starved_rank(
    tmp_path: Path, photos: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Rank 1 waits about 25 ms for each batch, rank 0 hardly; the compute is about 20 ms. Rank
    0's step holds its wait for rank 1 at the all-reduce (a median near 45 ms); each batch's
    shortest step is rank 1's, the job's own work. Warm-up batches (long) and the batches
    rank 1 took beyond rank 0's (short) are in no figure of the stand-in."""
    batches = 60
    compute = [20.0 + index * 0.05 for index in range(batches)]  # each batch's its own
    waits = [[0.3] * batches, [25.0 + (index % 5) * 0.4 for index in range(batches)]]
    ranks = in_step(waits, compute)
    for index in range(WARMUP):  # a slow start: each rank's first steps take 200 ms
        ranks[0][index] = ranks[1][index] = (0.3, 200.0)
    ranks[1] += [(0.2, 1.0)] * 8  # rank 1 ran 8 batches further, each quick
    db = tmp_path / "store.db"
    with Store(db) as store:
        watched_run(store, photos, ranks=2)
        write_batches(store, ranks)
        document = read_run(store, RUN)
    job_step = statistics.median(c + ALL_REDUCE_MS for c in compute[WARMUP:])
    slowest = max(lane.figures.step_ms_p50 or 0.0 for lane in document.lanes)
    assert slowest > 44.0 and job_step < 23.0  # the case: the median holds rank 1's wait

    seen, said = doctor_like(db, monkeypatch, capsys)
    assert seen["consumer"] == f"sleep:{decimal(job_step)}"
    assert f", consumer sleep:{decimal(job_step)}" in said and said.startswith(f"like run {RUN}")
    assert seen["like"] == RUN
    assert seen["step_read"] == (
        "each batch's shortest across its 2 ranks (their step without waiting for each other "
        f"at the all-reduce; the slowest rank's own median {decimal(slowest)} ms)"
    )


def test_a_single_lane_runs_stand_in_is_its_median_step(
    tmp_path: Path, photos: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    steps = [20.0 + (index % 7) * 0.3 for index in range(40)]
    db = tmp_path / "store.db"
    with Store(db) as store:
        watched_run(store, photos, ranks=1)
        write_batches(store, [[(3.0, step) for step in steps]])
    seen, _ = doctor_like(db, monkeypatch, capsys)
    assert seen["consumer"] == f"sleep:{decimal(statistics.median(steps[WARMUP:]))}"
    assert seen["step_read"] is None


def across(ranks: Sequence[Sequence[tuple[float, float]]]) -> list[BatchAcross]:
    """`Store.batches_across` of ranks' (wait, step) in ms, every batch measured."""
    out = []
    for index in range(min(len(times) for times in ranks)):
        steps = [times[index][1] / 1e3 for times in ranks]
        batch = [sum(times[index]) / 1e3 for times in ranks]
        out.append(BatchAcross(min(steps), max(steps), min(batch), max(batch)))
    return out


def test_ranks_that_take_turns_waiting_for_data_stand_in_with_their_compute() -> None:
    """Two ranks on shared cores, each waiting 10 ms for a batch in turn: each rank's median
    step holds its wait for the other half the time; each batch's shortest does not."""
    compute = [20.0] * 40
    waits = [[10.0 if index % 2 else 0.5 for index in range(40)],
             [0.5 if index % 2 else 10.0 for index in range(40)]]  # fmt: skip
    ranks = in_step(waits, compute)
    found = unwaited_step(across(ranks), 2)
    assert found is not None and found.batches == 40
    assert found.step_ms == pytest.approx(20.0 + ALL_REDUCE_MS)
    assert min(statistics.median(step for _, step in times) for times in ranks) > 25.0


def test_ranks_each_their_own_loop_are_not_read_as_ddp(
    tmp_path: Path, photos: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Ranks with no all-reduce between them (each its own loop: rank 1 waits 25 ms for data,
    and no step is longer for it): their batch times differ as much as their waits, so no step
    is read across them, and the stand-in is the slowest rank's median, as before."""
    ranks = [[(0.3, 20.0 + (i % 3) * 0.5) for i in range(40)],
             [(25.0, 21.0 + (i % 4) * 0.5) for i in range(40)]]  # fmt: skip
    assert unwaited_step(across(ranks), 2) is None
    seen, _ = doctor_like(stored(tmp_path, photos, ranks), monkeypatch, capsys)
    slowest = statistics.median(step for _, step in ranks[1][WARMUP:])
    assert seen["consumer"] == f"sleep:{decimal(slowest)}" and seen["step_read"] is None


def test_ranks_at_one_pace_whose_batches_are_not_in_step_keep_the_slowest_median_and_say_so(
    tmp_path: Path, photos: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """On GPUs the host runs ahead of the all-reduce: the ranks keep one pace over the run, but
    batch by batch their times do not line up (seen on 2 H200s: 94.8 and 97.3 ms a batch, the
    batch times as far apart as the steps). No step is read across them: the stand-in is the
    slowest rank's median, and the note says it may hold their wait for each other."""
    waits = [5.0, 40.0, 0.5, 25.0, 0.5, 60.0, 0.5, 0.5]
    steps = [70.0, 45.0, 95.0, 60.0, 80.0, 30.0, 85.0, 100.0]
    ranks = [[(waits[i % 8], steps[i % 8]) for i in range(40)],
             [(waits[(i + 3) % 8], steps[(i + 3) % 8]) for i in range(40)]]  # fmt: skip
    assert unwaited_step(across(ranks), 2) is None
    seen, _ = doctor_like(stored(tmp_path, photos, ranks), monkeypatch, capsys)
    slowest = max(statistics.median(step for _, step in times[WARMUP:]) for times in ranks)
    assert seen["consumer"] == f"sleep:{decimal(slowest)}"
    assert "could not be read apart from their wait for each other" in seen["step_read"]


def test_the_sessions_consumer_note_says_how_the_step_was_read() -> None:
    """Said once, where the stand-in is described: with its SM share where GPM measured one;
    without a reading to tell, a step with no SM share needs no note (as before)."""
    read = "each batch's shortest across its 2 ranks (...)"
    assert consumer_note(parse_consumer("sleep:46.2"), read) == (
        f"a stand-in for a watched step: 46.2 ms, {read}"
    )
    note = consumer_note(parse_consumer("sleep:46.2@50%"), read)
    assert note is not None
    assert note.startswith(f"a stand-in for a watched step: 46.2 ms, {read}, its SMs busy 50% ")
    assert "23.1 ms of GPU work" in note and note.count(read) == 1
    assert consumer_note(parse_consumer("sleep:46.2")) is None


def gpm_figures(step_ms: float, sm_active_pct: float) -> LaneFigures:
    """A lane's figures: its median step, and the share of it its SMs were busy (GPM)."""
    return LaneFigures(batches=50, step_ms_p50=step_ms, step_sm_active_pct=sm_active_pct,
                       sm_active_source="gpm")  # fmt: skip


def test_the_stand_ins_sm_share_is_the_rank_that_waited_least() -> None:
    """The SM share of a step is of its time: rank 0's 45 ms step, mostly its wait at the
    all-reduce, held the SMs 40% of it; rank 1's own 21 ms step, 80%. The 21 ms stand-in takes
    rank 1's share, whose step is its own work."""
    lanes = tuple(
        LaneDocument(rank, rank, f"GPU-{rank}", rank, 2, "here", "completed", None, figures)
        for rank, figures in enumerate((gpm_figures(45.0, 40.0), gpm_figures(21.5, 80.0)))
    )
    document = RunDocument(
        RUN, "watch", "completed", None, "2026-11-28T08:00:00Z", "ddp.py", "torch",
        "your training step", 60.0, {}, {}, {}, (), lanes,
    )  # fmt: skip
    step = stand_in_step(document, UnwaitedStep(21.0, 2, 50))
    assert step is not None and stand_in(step.lane, step.step_ms) == "sleep:21@80%"
    alone = stand_in_step(replace(document, lanes=lanes[:1]), None)
    assert alone is not None and stand_in(alone.lane, alone.step_ms) == "sleep:45@40%"
