"""The answer at exit of a watched job of several ranks says what `probe show` says of its run:
rank 0 tells it once its own lanes have ended, and waits a few seconds at most for the other
ranks' (`probe.present.watching.ranks_ended`); one still running then is named, never told as
a run that did not complete."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers import probe_cli, torchrun_watch
from probe.present import watching
from probe.records import BatchEvent, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.merge import settle_run

RUN = "20261128-watch-0000abcd"


def two_ranks(db: Path, world: int = 2) -> None:
    """A watched run of 2 ranks, 30 batches each: rank 0's lane ended (completed), rank 1's
    still running; `world`: the world size its config says."""
    run = RunRecord(
        run_id=RUN, kind="watch", created="2026-11-28T08:00:00Z", status=RunStatus.RUNNING,
        reason=None, pipeline="torch", consumer="your training step", label="ddp.py",
        config={"world_size": world, "torchrun": True, "read": "epochs", "warmup": 0,
                "spec": {"batch_size": 4}, "lanes": [{"lane": 0}, {"lane": 1}]},
        host={"cpus": 2}, hostname="here", pid=100, started_ns=0, ended_ns=None,
    )  # fmt: skip
    lanes = [
        LaneRecord(RUN, x, None, None, x, 2, "here", 100 + x, RunStatus.RUNNING, None, None)
        for x in (0, 1)
    ]
    with Store(db) as store:
        store.create_run(run, lanes)
        for lane in (0, 1):
            store.add_batches(RUN, [
                BatchEvent(lane, i, i * 10**8, 0.002, 0.098, 4, False) for i in range(30)
            ])  # fmt: skip
        store.update_lane(RUN, 0, status=RunStatus.COMPLETED)


def end_rank_1(db: Path) -> None:
    with Store(db) as store:
        store.update_lane(RUN, 1, status=RunStatus.COMPLETED)
        settle_run(store, RUN)


def test_the_answer_waits_for_a_rank_that_ends_and_tells_the_run_completed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    two_ranks(db)
    later = threading.Timer(0.5, end_rank_1, (db,))
    later.start()
    started = time.monotonic()
    try:
        lines = watching.loader_answers(db, RUN)
    finally:
        later.join()
    took = time.monotonic() - started
    assert 0.5 <= took < watching.RANKS_END_S, took
    assert lines[0].startswith("ddp.py, 60 batches measured: fed"), lines
    assert "partial" not in lines[0], lines
    with Store(db) as store:
        assert store.run(RUN).status is RunStatus.COMPLETED


def test_a_rank_not_ended_in_time_is_named_as_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "store.db"
    two_ranks(db)
    monkeypatch.setattr(watching, "RANKS_END_S", 0.3)
    started = time.monotonic()
    lines = watching.loader_answers(db, RUN)
    assert time.monotonic() - started >= 0.3
    assert "fed: compute-bound - partial: rank 1 still running: data-wait" in lines[0], lines
    assert "did not complete" not in "\n".join(lines)


def test_a_settled_run_or_one_of_a_single_process_is_told_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single process's run still running at its answer lost its store: waiting would not
    settle it."""

    def no_wait(seconds: float) -> None:
        raise AssertionError(f"waited {seconds} s")

    settled, alone = tmp_path / "settled.db", tmp_path / "alone.db"
    two_ranks(settled)
    end_rank_1(settled)
    two_ranks(alone, world=1)
    monkeypatch.setattr(time, "sleep", no_wait)
    for db in (settled, alone):
        with Store(db) as store:
            assert watching.ranks_ended(store, [RUN])
    assert "partial" not in watching.loader_answers(settled, RUN)[0]


# Rank 1 ends its script a second and a half after rank 0 (a checkpoint it saves, say): rank 0
# tells the answer before rank 1's lane has ended, unless it waits for it.
SCRIPT = """
import sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
for (inputs,) in DataLoader(TensorDataset(torch.zeros(160, 8)), batch_size=4):
    model(inputs).sum().backward()
    time.sleep(0.01)
dist.destroy_process_group()
if rank == 1:
    time.sleep(1.5)
"""


def test_the_exit_line_of_a_completed_torchrun_job_agrees_with_probe_show(
    tmp_path: Path,
) -> None:
    script, db = tmp_path / "ddp.py", tmp_path / "store.db"
    script.write_text(textwrap.dedent(SCRIPT))
    started = time.monotonic()
    result = torchrun_watch(script, db)
    print(f"the job took {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-3000:]
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ddp.py")]
    assert len(told) == 1, result.stderr[-3000:]
    shown = probe_cli("show", "last", "--db", db)
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert first.startswith("run ") and first.endswith(" (completed)"), first
    (verdict,) = [line for line in shown.stderr.splitlines() if line.startswith("verdict: ")]
    print(told[0], verdict, sep="\n")
    assert told[0].split(" measured: ", 1)[1].startswith(verdict.removeprefix("verdict: "))
    assert "partial" not in told[0] and "partial" not in verdict
