"""The rank that holds the job: under DDP one rank's slow loader makes every rank wait at the
gradient all-reduce. The rule on recorded batches (`probe.judge.across_lanes.holding_rank`), and a
watched DDP job of two CPU ranks (gloo) whose rank 1 reads slowly."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import free_port, probe_cli, run_captured, torchrun_watch
from pipelines import cpu_set_text
from probe.judge.diagnosis import RunDiagnosis, diagnose_run, judge_run
from probe.judge.evidence import held_share
from probe.judge.facts import HostLoad, LaneFacts, run_facts
from probe.judge.thresholds import HELD_SHARE
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import lane_figures
from probe.metrics import HELD
from probe.present.tables import headline
from probe.records import BatchEvent, RunStatus
from probe.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 5


def lane_of(
    rank: int, times_ms: Sequence[tuple[float, float]], step_apart: bool = False, **given: Any
) -> LaneFacts:
    """A watched rank's facts from its batches' (wait, step) in ms, each batch asked for when
    the one before it ended, its first WARMUP batches warm-up; `given`: what its rank was
    given (`cpu_set`, `shard_images`, ...), its processes' `cpu_pct` and other facts."""
    events, t_ns = [], 0
    for index, (wait_ms, step_ms) in enumerate(times_ms):
        events.append(
            BatchEvent(rank, index, t_ns, wait_ms / 1e3, step_ms / 1e3, 4, index < WARMUP)
        )
        t_ns += round((wait_ms + step_ms) * 1e6)
    measured = [e for e in events if not e.warmup]
    figures = replace(lane_figures(events), cpu_pct=given.pop("cpu_pct", None))
    facts: dict[str, Any] = {
        "hostname": "node0", "host_cpus": 4, "lanes_on_host": 2, "num_workers": 0, **given,
    }  # fmt: skip
    return LaneFacts(
        lane=rank, status="completed", backend="torch", consumer="your training step",
        batch_size=4, figures=figures, on_gpu=False,
        step_ms_mean=sum(e.step_s for e in measured) / len(measured) * 1e3,
        run_lanes=2, watched_run="r", **facts,
    )  # fmt: skip


def ddp(
    waits_ms: Sequence[Sequence[float]],
    compute_ms: float = 5.0,
    given: Sequence[dict[str, Any]] = (),
) -> list[LaneFacts]:
    """Ranks in step, as DDP's all-reduce keeps them: each batch, every rank's step is its
    compute and its wait at the all-reduce for the last rank to get there; `given[i]`: what
    rank i was given (`lane_of`)."""
    lanes = []
    for rank, waits in enumerate(waits_ms):
        times = []
        for index, wait in enumerate(waits):
            slowest = max(w[index] for w in waits_ms)
            times.append((wait, compute_ms + slowest - wait))
        lanes.append(lane_of(rank, times, **(given[rank] if given else {})))
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
    assert found.evidence[-1].text.startswith("the fix is rank 1's loader")
    # given alike, as far as was recorded: what it reads costs more, since rank 0 keeps up
    assert (
        "nothing recorded of what it was given tells it from rank 0's (cores, shard, files), yet "
        "rank 0's loader keeps up on its own (data-wait 1."
    ) in found.evidence[-1].text
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


# Two ranks that both wait for data, as the recipe's ranks did on 8 shared cores (data-wait
# 20.1% and 32.8%): rank 0's loader falls behind by 20 ms a batch, rank 1's by 33 ms.
BOTH_WAIT = ([20.0, 33.0], 40.0)
SATURATED = HostLoad(cpu_pct=97.0)  # the cores they may use, all busy


def both_wait(*given: dict[str, Any]) -> list[LaneFacts]:
    (rank0, rank1), compute_ms = BOTH_WAIT
    return ddp([jittered(rank0, 10), jittered(rank1, 11)], compute_ms, given=given)


def test_ranks_that_share_their_cores_and_all_wait_for_data_are_judged_together() -> None:
    """Given the same cores and shards, both starved: the one that waits most got less of the
    cores, not a slower loader. No rank is named (it was, with the other's share of its step
    waiting for it over 20%); the shared CPU is the finding, with the cores and each wait."""
    shared = {"cpu_set": frozenset(range(4)), "shard_images": 320, "host": SATURATED}
    facts = both_wait(shared, shared)
    share = held_share(facts[0], facts[1])
    assert share is not None and share > 0.2  # enough to be named, were they told apart
    diagnosis = judge_run("r", RunStatus.COMPLETED, facts)
    assert holding(diagnosis.findings) == []
    assert VerdictKind.HELD_BY_RANK not in {v.kind for v in diagnosis.lanes}
    (found,) = [f for f in diagnosis.findings if f.kind is VerdictKind.SHARED_CORES]
    told = found.evidence[0].text
    assert found.evidence[-1].text.startswith("host CPU 97% busy")
    assert told.startswith(
        "ranks 0 and 1 share cores 0-3 (4 cores), equal shards (320 images an epoch), and the "
        "CPU caps them (data-wait rank 0 27.2% ± 1.3%, rank 1 44.6% ± 1.1%): no rank holds "
        "the others. "
    ), told
    assert told.endswith("not one rank's loader")
    # nothing shows that the CPU caps them: no finding either, each rank's own verdict stands
    plain = both_wait({"cpu_set": frozenset(range(4))}, {"cpu_set": frozenset(range(4))})
    diagnosis = judge_run("r", RunStatus.COMPLETED, plain)
    kinds = {f.kind for f in diagnosis.findings}
    assert VerdictKind.RANK_HOLDS_JOB not in kinds and VerdictKind.SHARED_CORES not in kinds
    # cores not recorded (a run stored before they were): one host's ranks share its cores
    assert holding(judge_run("r", RunStatus.COMPLETED, both_wait({}, {})).findings) == []


def test_a_rank_given_alike_whose_peer_keeps_up_is_named_only_where_the_cpu_has_room() -> None:
    """Given alike, rank 0 keeps up on its own while rank 1 waits: where their processes use
    a fraction of the cores, rank 1's reads cost more (its files, its disk: a sleep here); where
    they use all the cores they share, rank 0's prefetch only got ahead: the CPU caps both."""
    waits = [jittered(1.0, 12), jittered(30.0, 13)]
    alike = {"cpu_set": frozenset(range(4)), "shard_images": 320}
    for used, named in ((30.0, True), (390.0, False)):
        given = {**alike, "cpu_pct": used / 2}
        facts = ddp(waits, compute_ms=40.0, given=[given, given])
        diagnosis = judge_run("r", RunStatus.COMPLETED, facts)
        assert [f.lane for f in holding(diagnosis.findings)] == ([1] if named else [])
        shared = [f for f in diagnosis.findings if f.kind is VerdictKind.SHARED_CORES]
        assert len(shared) == (0 if named else 1), shared
    told = shared[0].evidence[0].text
    assert told.startswith(
        "ranks 0 and 1 share cores 0-3 (4 cores), equal shards (320 images an epoch), and the "
        "CPU caps them (data-wait rank 0 "
    ), told
    assert shared[0].evidence[1].text == "their processes use 3.9 cores of the 4 they may use"


def test_a_rank_given_fewer_cores_than_the_other_is_named_for_them() -> None:
    fewer = both_wait({"cpu_set": frozenset({0, 1})}, {"cpu_set": frozenset({0})})
    diagnosis = judge_run("r", RunStatus.COMPLETED, fewer)
    (found,) = holding(diagnosis.findings)
    assert found.lane == 1
    assert found.evidence[-1].text.startswith("the fix is rank 1's loader (its own verdict: "), (
        found.evidence[-1].text
    )
    assert (
        "it was given or reads otherwise than the ranks it holds: its cores, 0 (1 core), against "
        "rank 0's 0-1 (2 cores); a change to the other ranks gains nothing"
    ) in found.evidence[-1].text
    assert diagnosis.lanes[0].kind is not VerdictKind.HELD_BY_RANK  # it waits for data too
    # the rank with more cores waiting most is not named for them: they are judged together
    more = both_wait({"cpu_set": frozenset({0})}, {"cpu_set": frozenset({0, 1})})
    assert holding(judge_run("r", RunStatus.COMPLETED, more).findings) == []


@pytest.mark.parametrize(
    ("apart", "told"),
    [
        (
            {"cpu_set": frozenset({4, 5, 6, 7})},
            "its cores, 4-7 (4 cores), against rank 0's 0-3 (4 cores)",
        ),
        ({"shard_images": 640}, "its shard, 640 images an epoch, against rank 0's 320"),
        ({"shard_batches": 160}, "its shard, 160 batches an epoch, against rank 0's 80"),
        ({"data_dir": "/data/b"}, "its files, in /data/b, against rank 0's in /data/a"),
        ({"hostname": "node1"}, "its host, node1, against rank 0's node0"),
    ],
)
def test_a_rank_given_other_cores_a_larger_shard_other_files_or_another_host_is_named(
    apart: dict[str, Any], told: str
) -> None:
    rank0 = {"cpu_set": frozenset(range(4)), "shard_images": 320, "data_dir": "/data/a"}
    if "shard_batches" in apart:
        rank0 = {"shard_batches": 80}
    rank1 = {**rank0, **apart}
    (found,) = holding(judge_run("r", RunStatus.COMPLETED, both_wait(rank0, rank1)).findings)
    assert found.lane == 1 and told in found.evidence[-1].text, found.evidence[-1].text


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


# Each item costs CPU_MS of CPU in the worker (as decoding a JPEG does), its batch of 4 against a
# step that sleeps 10 ms: a DistributedSampler gives each rank an equal shard.
CORES_SCRIPT = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

BATCHES, BATCH = 120, 4
cores, workers, cpu_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1e3

class Decoded(Dataset):
    def __len__(self):
        return BATCHES * BATCH * 2
    def __getitem__(self, index):
        until = time.thread_time() + cpu_s
        while time.thread_time() < until:
            pass
        return torch.full((8,), float(index % 7)), index % 2

dist.init_process_group("gloo")
if cores == "fewer" and dist.get_rank() == 0:
    os.sched_setaffinity(0, {0})  # its workers inherit it
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
dataset = Decoded()
loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                    sampler=DistributedSampler(dataset, shuffle=False))
for inputs, labels in loader:
    model(inputs).sum().backward()
    time.sleep(0.010)
dist.destroy_process_group()
"""


def watched_ranks(folder: Path, *args: object) -> tuple[RunDiagnosis, list[LaneFacts], float]:
    """`CORES_SCRIPT ARGS` watched by `probe watch` under torchrun, 2 gloo ranks: its run's
    diagnosis and facts, and the job's wall time."""
    script, db = folder / "ranks.py", folder / "store.db"
    script.write_text(textwrap.dedent(CORES_SCRIPT))
    started = time.monotonic()
    result = torchrun_watch(script, db, *args, env={"OMP_NUM_THREADS": "1"})
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    with Store(db) as store:
        (run,) = store.runs()
        return diagnose_run(store, run.run_id), run_facts(store, run.run_id), took


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_two_watched_ranks_on_the_same_cores_both_starved_name_no_rank(tmp_path: Path) -> None:
    """Both ranks on the machine's 2 cores, 2 workers each, each item 10 ms of CPU: each rank's
    loader needs about 4 cores to feed its step. Both starve, whichever waits more: no rank is
    named, and the shared CPU is the finding, with the cores and each rank's data-wait."""
    diagnosis, facts, took = watched_ranks(tmp_path, "same", 2, 10)
    print(f"the job took {took:.1f} s")
    mine = frozenset(os.sched_getaffinity(0))
    assert [f.cpu_set for f in facts] == [mine] * 2
    assert [f.shard_images for f in facts] == [480, 480]
    assert all((f.figures.data_wait_frac or 0.0) >= 0.05 for f in facts), facts
    assert holding(diagnosis.findings) == []
    assert VerdictKind.HELD_BY_RANK not in {v.kind for v in diagnosis.lanes}
    (shared,) = [f for f in diagnosis.findings if f.kind is VerdictKind.SHARED_CORES]
    told = shared.evidence[0].text
    print(f"also: {headline(shared)}\n  - {told}")
    assert told.startswith(
        f"ranks 0 and 1 share cores {cpu_set_text(mine)} ({len(mine)} cores), equal shards "
        "(480 images an epoch), and the CPU caps them (data-wait rank 0 "
    ), told


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_a_watched_rank_given_fewer_cores_is_named_where_it_holds_and_the_other_never(
    tmp_path: Path,
) -> None:
    """Rank 0 given core 0 alone, rank 1 both cores, one worker each, each item 4 ms of CPU:
    each rank's own cores are recorded. On two cores the scheduler gives each rank about a
    core whatever it was given, and which one waits more varies with what else runs and
    whose prefetch got ahead. Where rank 0 holds rank 1 by their waits, it is named, for its
    cores; rank 1, given more, is never named, whichever waits more (it was: "the fix is rank
    1's loader")."""
    diagnosis, facts, took = watched_ranks(tmp_path, "fewer", 1, 4)
    print(f"the job took {took:.1f} s")
    mine = frozenset(os.sched_getaffinity(0))
    assert [f.cpu_set for f in facts] == [frozenset({0}), mine]
    named = holding(diagnosis.findings)
    assert all(found.lane == 0 for found in named), named
    fewer, more = facts
    waits = [f.figures.data_wait_frac or 0.0 for f in facts]
    errors = [f.figures.data_wait_frac_error or 0.0 for f in facts]
    share = held_share(more, fewer)
    holds = waits[0] - waits[1] > math.hypot(*errors) and (share or 0.0) >= HELD_SHARE
    print(f"data-wait {waits}, rank 1's step held {share}: rank 0 holds: {holds}")
    if holds:
        (found,) = named
        cores = f"its cores, 0 (1 core), against rank 1's {cpu_set_text(mine)} ({len(mine)} cores)"
        assert cores in found.evidence[-1].text, found.evidence[-1].text
