"""The rank that holds the job: under DDP one rank's slow loader makes every rank wait at the
gradient all-reduce. The rule on recorded batches (`probe.judge.across_lanes.holding_rank`), and a
watched DDP job of two CPU ranks (gloo) whose rank 1 reads slowly."""

from __future__ import annotations

import json
import os
import random
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from helpers import free_port, probe_cli, run_captured
from probe.judge.diagnosis import diagnose_run, judge_run
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import HELD_SHARE
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import lane_figures
from probe.metrics import HELD
from probe.records import BatchEvent, RunStatus
from probe.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 5


def lane_of(
    rank: int, times_ms: Sequence[tuple[float, float]], step_apart: bool = False
) -> LaneFacts:
    """A watched rank's facts from its batches' (wait, step) in ms, each batch asked for when
    the one before it ended, its first WARMUP batches warm-up."""
    events, t_ns = [], 0
    for index, (wait_ms, step_ms) in enumerate(times_ms):
        events.append(
            BatchEvent(rank, index, t_ns, wait_ms / 1e3, step_ms / 1e3, 4, index < WARMUP)
        )
        t_ns += round((wait_ms + step_ms) * 1e6)
    measured = [e for e in events if not e.warmup]
    return LaneFacts(
        lane=rank, status="completed", backend="torch", consumer="your training step",
        batch_size=4, figures=lane_figures(events), hostname="node0", host_cpus=4,
        lanes_on_host=2, on_gpu=False, num_workers=0,
        step_ms_mean=sum(e.step_s for e in measured) / len(measured) * 1e3,
        run_lanes=2, watched_run="r",
    )  # fmt: skip


def ddp(waits_ms: Sequence[Sequence[float]], compute_ms: float = 5.0) -> list[LaneFacts]:
    """Ranks in step, as DDP's all-reduce keeps them: each batch, every rank's step is its
    compute and its wait at the all-reduce for the last rank to get there."""
    lanes = []
    for rank, waits in enumerate(waits_ms):
        times = []
        for index, wait in enumerate(waits):
            slowest = max(w[index] for w in waits_ms)
            times.append((wait, compute_ms + slowest - wait))
        lanes.append(lane_of(rank, times))
    return lanes


def jittered(mean_ms: float, seed: int, batches: int = 80) -> list[float]:
    spread = random.Random(seed)
    return [max(0.0, mean_ms * spread.uniform(0.7, 1.3)) for _ in range(batches)]


def holding(findings: Sequence[Verdict]) -> list[Verdict]:
    return [f for f in findings if f.kind is VerdictKind.RANK_HOLDS_JOB]


def test_the_rank_whose_loader_is_slow_holds_the_job_and_the_other_waits_for_it() -> None:
    facts = ddp([jittered(1.0, 0), jittered(80.0, 1)])
    assert abs(facts[0].figures.images_per_s / facts[1].figures.images_per_s - 1) < 0.01
    diagnosis = judge_run("r", RunStatus.COMPLETED, facts)
    (found,) = holding(diagnosis.findings)
    assert found.lane == 1
    assert diagnosis.verdict.kind is VerdictKind.RANK_HOLDS_JOB and diagnosis.verdict.lane == 1
    share = next(e for e in found.evidence if e.metric == HELD.name)
    # rank 0's step is its 5 ms of compute and the 80 ms rank 1 waits, less its own 1 ms
    assert share.value == pytest.approx(79 / 84, abs=0.02)
    assert share.text.startswith("rank 0: step waiting for another rank 9")
    assert "the fix is rank 1's loader" in found.evidence[-1].text
    held, own = diagnosis.lanes
    assert held.kind is VerdictKind.HELD_BY_RANK and held.severity is found.severity
    assert own.kind is VerdictKind.STARVED_CPU_HEADROOM
    assert VerdictKind.SHARD_IMBALANCE not in {f.kind for f in diagnosis.findings}


def test_ranks_that_wait_alike_hold_nobody() -> None:
    for waits in ([jittered(2.0, 2), jittered(2.5, 3)], [jittered(40.0, 4), jittered(44.0, 5)]):
        diagnosis = judge_run("r", RunStatus.COMPLETED, ddp(waits, compute_ms=40.0))
        assert holding(diagnosis.findings) == []
        assert VerdictKind.HELD_BY_RANK not in {v.kind for v in diagnosis.lanes}


def test_lanes_that_wait_for_nobody_are_not_held() -> None:
    """A probe's lanes are each their own loop: one that waits more has no other waiting for
    it, whatever their steps (the imbalance in images/s is another finding)."""
    fast = lane_of(0, [(w, 30.0) for w in jittered(1.0, 6)])
    slow = lane_of(1, [(w, 30.0) for w in jittered(80.0, 7)])
    slowed = lane_of(0, [(w, 40.0) for w in jittered(1.0, 8)])  # a step slowed by the host
    for facts in ([fast, slow], [slowed, slow]):
        diagnosis = judge_run("r", RunStatus.COMPLETED, facts)
        assert holding(diagnosis.findings) == []
        assert diagnosis.lanes[0].kind is VerdictKind.FED


def test_a_held_share_below_the_threshold_holds_nobody() -> None:
    # rank 1 waits 6 ms more than rank 0 a batch on 80 ms steps: under HELD_SHARE of them
    facts = ddp([jittered(4.0, 9), [10.0] * 80], compute_ms=80.0)
    assert (facts[0].step_ms_mean or 0) - (facts[1].step_ms_mean or 0) < HELD_SHARE * 86
    assert holding(judge_run("r", RunStatus.COMPLETED, facts).findings) == []


SCRIPT = """
import sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from probe import watch

BATCHES, BATCH = 60, 4

class Items(Dataset):
    def __init__(self, delay_s):
        self.delay_s = delay_s
    def __len__(self):
        return BATCHES * BATCH
    def __getitem__(self, index):
        time.sleep(self.delay_s)
        return torch.full((8,), float(index % 7)), index % 2

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Items(0.025 if rank == 1 else 0.0), batch_size=BATCH)
for inputs, labels in watch(loader, name="held", db=sys.argv[1], answer=False):
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
"""


def test_a_watched_ddp_job_names_its_slow_rank_and_what_the_other_waits_for_it(
    tmp_path: Path,
) -> None:
    """Rank 1's dataset sleeps 25 ms an item (100 ms a batch of 4), rank 0's does not: rank 0
    waits for rank 1 at every all-reduce, in its step."""
    script, db = tmp_path / "held.py", tmp_path / "store.db"
    script.write_text(textwrap.dedent(SCRIPT))
    result = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--master-port", str(free_port()), str(script), str(db)],
        timeout=240, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with Store(db) as store:
        (run,) = store.runs()
        diagnosis = diagnose_run(store, run.run_id)
    (found,) = holding(diagnosis.findings)
    assert found.lane == 1
    (share,) = [e for e in found.evidence if e.metric == HELD.name]
    assert share.value is not None and share.value > 0.3 and share.text.startswith("rank 0:")
    rank0 = diagnosis.lanes[0]
    assert rank0.kind is not VerdictKind.FED
    if all(v.reliable for v in [*diagnosis.lanes, *diagnosis.findings]):
        assert diagnosis.verdict.kind is VerdictKind.RANK_HOLDS_JOB
    shown = probe_cli("show", run.run_id, "--db", db, "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    print(f"rank 1 holds the job: {share.text}")
    told = [f for f in document["diagnosis"]["findings"] if f["kind"] == "rank_holds_job"]
    assert [f["lane"] for f in told] == [1]
