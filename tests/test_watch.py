"""`watch` around a real training loop's DataLoader: what it records, and that it never gets in
the way."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from helpers import skip_on_a_busy_host
from probe import watch
from probe.judge.diagnosis import diagnose_run
from probe.measure.timer import BatchTimer
from probe.records import BatchEvent
from probe.store.db import Store
from probe.store.documents import read_run

LOAD_S = 0.003  # per item, in the loader
STEP_S = 0.025  # per batch, in the "training step"
BATCH = 4


class SlowItems(Dataset[tuple[torch.Tensor, int]]):
    """Items that take LOAD_S each to load."""

    def __init__(self, count: int = 64) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(LOAD_S)
        return torch.zeros(3, 8, 8), index


def test_watch_records_the_wait_and_step_split_of_a_training_loop(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    loader = DataLoader(SlowItems(), batch_size=BATCH, num_workers=0)
    seen = []
    for _images, labels in watch(loader, name="sleepy", db=db, warmup=2):
        time.sleep(STEP_S)
        seen.extend(labels.tolist())
    assert seen == list(range(64))  # every batch, in order, untouched
    with Store(db) as store:
        (run,) = store.runs()
        events = store.batches(run.run_id)
        document = read_run(store, run.run_id).to_json()
        diagnosis = diagnose_run(store, run.run_id)
    assert run.kind == "watch" and run.status.value == "completed" and run.label == "sleepy"
    assert [e.index for e in events] == list(range(16))
    assert [e.warmup for e in events] == [True, True] + [False] * 14
    assert all(e.size == BATCH for e in events)
    # On a GPU the loop is never made to wait for it; without CUDA a batch in hand is ready.
    assert all(e.synced is not torch.cuda.is_available() for e in events)
    measured = [e for e in events if not e.warmup]
    wait = statistics.median(e.wait_s for e in measured)
    step = statistics.median(e.step_s for e in measured)
    # Sleeps overrun, never undershoot; a loaded machine adds a few milliseconds.
    assert BATCH * LOAD_S <= wait < BATCH * LOAD_S + 0.010
    assert STEP_S <= step < STEP_S + 0.010
    (lane,) = document["lanes"]
    assert lane["batches"] == 14 and lane["images"] == 56
    assert lane["data_wait_frac"] == pytest.approx(wait / (wait + step), abs=0.1)
    assert document["config"]["spec"]["dataloader"]["num_workers"] == 0
    assert document["pipeline"] == "torch" and document["consumer"] == "your training step"
    assert diagnosis.verdict.kind.value != "pipeline_only"  # a consumer that waits ~1/3 of the time


def test_a_watched_job_is_one_run_with_an_epoch_per_for_and_its_epoch_starts_judged(
    tmp_path: Path,
) -> None:
    """Workers started anew each epoch (persistent_workers=False, the DataLoader's default):
    every epoch opens on a stall, which warm-up, left out once, does not hide."""
    db = tmp_path / "store.db"
    loader = DataLoader(SlowItems(16), batch_size=BATCH, num_workers=2, persistent_workers=False)
    watched = watch(loader, name="four epochs", db=db, warmup=2)
    seen = []
    for _epoch in range(4):
        for _images, labels in watched:
            time.sleep(STEP_S)
            seen.extend(labels.tolist())
    watched.close()
    assert seen == list(range(16)) * 4
    with Store(db) as store:
        (run,) = store.runs()
        events = store.batches(run.run_id)
        document = read_run(store, run.run_id).to_json()
        diagnosis = diagnose_run(store, run.run_id).to_json()
    assert run.status.value == "completed" and run.label == "four epochs"
    assert [e.epoch for e in events] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [e.warmup for e in events] == [True] * 2 + [False] * 14  # once, at the start
    start = document["lanes"][0]["epoch_start"]
    assert start["starts"] == 3 and start["batches_per_epoch"] == 4
    assert start["share"] >= 0.05
    # Its start, iter() (which starts the workers), is seen apart from the prefetch's refill.
    assert 0 < start["loader_start_ms"] <= start["stall_ms"]
    assert start["refill_ms"] == pytest.approx(start["stall_ms"] - start["loader_start_ms"])
    skip_on_a_busy_host({"diagnosis": diagnosis})
    assert diagnosis["verdict"]["kind"] == "epoch_start_stall"
    settings = [r["setting"] for r in diagnosis["recommendations"]]
    assert {"sampler=endless", "persistent_workers=True"} <= set(settings)


def test_leaving_the_loop_early_ends_the_run_with_what_was_measured(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    for index, _ in enumerate(watch(range(1000), db=db, warmup=0, sample_hz=0)):
        if index == 9:
            break
    with Store(db) as store:
        (run,) = store.runs()
        events = store.batches(run.run_id)
    assert run.status.value == "completed" and run.pipeline == "custom"
    assert len(events) == 10 and {e.size for e in events} == {1}


def test_a_loader_that_fails_fails_the_run_and_the_error_reaches_the_loop(tmp_path: Path) -> None:
    def broken() -> Iterator[torch.Tensor]:
        yield torch.zeros(2, 3)
        raise OSError("disk went away")

    db = tmp_path / "store.db"
    with pytest.raises(OSError, match="disk went away"):
        for _ in watch(broken(), db=db, warmup=0, sample_hz=0):
            pass
    with Store(db) as store:
        (run,) = store.runs()
        (lane,) = store.lanes(run.run_id)
    assert run.status.value == "failed" and lane.reason == "OSError: disk went away"


def test_an_unusable_store_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = list(watch(range(5), db=folder))
        second = list(watch(range(3), db=folder))
    assert first == list(range(5)) and second == list(range(3))
    messages = [str(w.message) for w in caught if "feedscope" in str(w.message)]
    assert len(messages) == 1 and "the store path is a folder" in messages[0]


def test_the_timer_waits_for_the_device_where_it_can_and_says_whether_it_did() -> None:
    device_s, step_s = 0.02, 0.01

    def timed(timer: BatchTimer) -> list[BatchEvent]:
        events = []
        timer.ask()
        for _ in range(2):
            timer.got()
            time.sleep(step_s)
            events.append(timer.done(BATCH, epoch=1))
            timer.ask(timer.done_ns)
        return events

    synced = timed(BatchTimer(3, lambda: time.sleep(device_s)))
    unsynced = timed(BatchTimer(3, None))
    assert [e.synced for e in synced] == [True, True]
    assert [e.synced for e in unsynced] == [False, False]
    assert all(e.wait_s >= device_s for e in synced)  # the device's wait is the batch's
    assert all(e.wait_s < device_s for e in unsynced)
    assert all(e.step_s >= step_s for e in synced + unsynced)
    assert [e.index for e in synced] == [0, 1]
    assert {(e.lane, e.size, e.epoch, e.warmup) for e in synced} == {(3, BATCH, 1, False)}
    first, second = synced
    # asked again when the step ended: no time falls between two batches
    assert second.t_ns - first.t_ns == pytest.approx((first.wait_s + first.step_s) * 1e9, abs=2)


@pytest.mark.parametrize(
    ("current", "local_rank", "found"),
    [
        (None, 1, 1),  # CUDA not started yet: the rank's own GPU
        (0, 1, 1),  # tensors on cuda:LOCAL_RANK without set_device: the current one stays 0
        (2, 1, 2),  # set_device(2): the loop's own choice
        (0, None, 0),  # no rank: the current device
    ],
)
def test_a_watched_loop_is_on_its_ranks_gpu_unless_it_chose_another(
    monkeypatch: pytest.MonkeyPatch, current: int | None, local_rank: int | None, found: int
) -> None:
    from probe.measure.devices import loop_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: current is not None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    assert loop_device(local_rank) == found
