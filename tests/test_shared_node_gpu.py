"""A shared node, as recorded on 2 H200s with 32 cores (tests/benchmarks/results/
2026-11-28-shared-node, `tests/benchmarks/shared_node_gpu.sh`): a DDP script's 2 ranks held to
cores 16-23 while 8 other processes burned cores 24-31. Their load is the node's, not the job's:
the job is judged, not refused; its ranks, given alike, are judged together; its stand-in step
for `--like` is read as what it is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probe.judge.across_lanes import holding_rank
from probe.judge.diagnosis import diagnose_run
from probe.judge.evidence import unwaited_step
from probe.judge.facts import LaneFacts, run_facts
from probe.judge.verdicts import VerdictKind
from probe.present.options import stand_in_step
from probe.store.db import Store
from probe.store.documents import read_run

RECORDED = Path(__file__).parent / "benchmarks" / "results" / "2026-11-28-shared-node"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The recorded store, copied: reading must not touch the recorded file."""
    copy = tmp_path_factory.mktemp("shared-node") / "feedscope.db"
    shutil.copy(RECORDED / "feedscope.db", copy)
    return Store(copy)


def run_of(store: Store, label: str) -> str:
    return next(run.run_id for run in store.runs() if run.label == label)


def facts(store: Store, label: str) -> list[LaneFacts]:
    return run_facts(store, run_of(store, label))


def test_other_jobs_on_the_nodes_other_cores_do_not_make_the_job_busy(store: Store) -> None:
    """8 cores burned elsewhere, none of the job's 8 taken: its answer stands, the load beside
    it said as context."""
    for lane in facts(store, "original"):
        assert (lane.host.job_cores, lane.host.machine_cores) == (8, 32)
        assert lane.host.elsewhere_cores == pytest.approx(8.0, abs=0.3)
        assert lane.host.other_cores is not None and lane.host.other_cores < 0.1
        assert not lane.host_busy
    diagnosis = diagnose_run(store, run_of(store, "original"))
    assert diagnosis.verdict.reliable
    assert diagnosis.verdict.kind is VerdictKind.STARVED_CPU_SATURATED
    texts = [e.text for e in diagnosis.verdict.evidence]
    assert any("on the run's 8 cores (of the machine's 32; the other 24: 8.0 busy" in t
               for t in texts), texts  # fmt: skip


def test_two_ranks_given_the_same_cores_are_judged_together(store: Store) -> None:
    """Both ranks starved on the 8 cores they share (data-wait 27% and 17%): no rank holds the
    job; the shared CPU caps them."""
    lanes = facts(store, "original")
    diagnosis = diagnose_run(store, run_of(store, "original"))
    assert holding_rank(lanes, diagnosis.lanes) is None
    kinds = {finding.kind for finding in diagnosis.findings}
    assert VerdictKind.RANK_HOLDS_JOB not in kinds and VerdictKind.SHARED_CORES in kinds


def test_ranks_whose_gpus_run_ahead_keep_the_slowest_median_and_say_it(store: Store) -> None:
    """On the GPUs the hosts ran ahead of the all-reduce: the ranks kept one pace (94.8 and
    97.3 ms a batch) but their batches are not in step on the host, so no step is read across
    them, and the stand-in says it may hold their wait for each other."""
    run_id = run_of(store, "original")
    assert unwaited_step(store.batches_across(run_id), 2) is None
    step = stand_in_step(read_run(store, run_id), None)
    assert step is not None and step.read is not None
    assert step.lane.step_ms_p50 == pytest.approx(75.4, abs=0.1)
    assert "could not be read apart from their wait for each other" in step.read


def test_the_written_loaders_ran_the_job_by_torchrun_every_epoch_whole(store: Store) -> None:
    """The DALI module and the recipe's, `loader()` with no arguments under torchrun on both
    ranks: each recorded as many measured batches on each rank as the job's own loader."""
    batches = {
        label: [lane.figures.batches for lane in facts(store, label)]
        for label in ("original", "dali", "recipe")
    }
    assert batches["dali"] == batches["recipe"] == batches["original"]
    for epoch in (RECORDED / "ddp-dali.log").read_text().splitlines():
        if epoch.startswith("epoch "):
            assert "4096 images (the dataset's 4096), labels' sum 14336 (14336)" in epoch
