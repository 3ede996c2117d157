"""The modules `probe migrate` writes for a watched DDP job, run as the job runs them: torchrun
with 2 gloo ranks on the CPU, each rank calling `loader()` with no arguments (its rank and world
from torch.distributed) and iterating it for 2 epochs with `set_epoch`, as `ranks_read.py` does.

The job's loader is a DataLoader with a DistributedSampler over `coded_dataset`'s 37 files (its
4 classes of 5, 8, 11 and 13), batches of 6: DALI's own shards of them (18 and 19 files) would
give one rank an empty last batch and, with drop_last, start the next epoch on the padding.

What torch's DataLoader and DistributedSampler give that script, and so what each module must:
each rank 19 files an epoch (ceil(37 / 2): one file read twice across the ranks), in 4 batches
of 6, 6, 6 and 1 (3 of 6 with drop_last), each epoch in a new order. The recipe's module
(`--to dataloader`) gives exactly the DistributedSampler's files, in its order. The DALI module
gives the same counts, with its own order and shards: the ranks' files are every file and one of
them again, the same one in each epoch (the first of the module's order; DistributedSampler's is
the first of each epoch's); with drop_last the ranks' 36 files hold no other file twice.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import fake_torchvision as tv
import pytest
from torch.utils.data import DataLoader, DistributedSampler

from helpers import run_captured
from probe import watch
from probe.present.migrating import migrate
from probe.store.db import Store

pytest.importorskip("nvidia.dali")

RANKS = 2
BATCH_SIZE = 6
SEED = 5  # the DistributedSampler's
FILES = 37  # coded_dataset's


def written_modules(dataset: tv.ImageFolder, folder: Path) -> list[Path]:
    """The DALI and the recipe's module of a watched DDP loader, with and without drop_last,
    each written by `probe migrate` from its run."""
    written = []
    for drop_last in (False, True):
        sampler: Any = DistributedSampler(dataset, num_replicas=RANKS, rank=0, seed=SEED)
        train_loader = DataLoader(
            dataset, batch_size=BATCH_SIZE, sampler=sampler, drop_last=drop_last
        )
        db = folder / f"drop_last_{drop_last}.db"
        with watch(train_loader, name="train.py", db=db, warmup=1, answer=False) as batches:
            for _batch in batches:
                pass
        with Store(db) as store:
            run = store.runs()[0].run_id
        tail = "drop_last" if drop_last else "all"
        written += [folder / f"dali_{tail}.py", folder / f"dataloader_{tail}.py"]
        assert migrate(db, run, written[-2], threads=1) == 0
        assert migrate(db, run, written[-1], to="dataloader") == 0
    return written


def epoch_files(got: dict[str, Any]) -> list[list[int]]:
    """The files a rank read of a module, epoch by epoch."""
    return [[f for batch in epoch for f in batch["files"]] for epoch in got["epochs"]]


def test_both_written_modules_default_path_under_torchrun(
    coded_dataset: Path, tmp_path: Path
) -> None:
    dataset = tv.ImageFolder(str(coded_dataset), transform=tv.validation(32, 32))
    assert len(dataset) == FILES
    modules = written_modules(dataset, tmp_path)
    script = Path(__file__).parent / "ranks_read.py"
    done = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={RANKS}", script, tmp_path, *modules],
        timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    assert [rank["world"] for rank in ranks] == [RANKS, RANKS]
    device = "cuda" if ranks[0]["cuda"] else "cpu"  # the CPU without CUDA, as in CI

    shard = math.ceil(FILES / RANKS)  # 19 a rank: DistributedSampler's padding
    padding = RANKS * shard - FILES  # 1 file read twice
    for name in (path.stem for path in modules):
        drop_last = name.endswith("drop_last")
        sizes = [BATCH_SIZE] * (shard // BATCH_SIZE) + ([] if drop_last else [shard % BATCH_SIZE])
        for rank in ranks:
            got = rank["modules"][name]
            assert (got["len"], got["shard"]) == (len(sizes), shard), name
            assert len(got["epochs"]) == 2
            for batch in (batch for epoch in got["epochs"] for batch in epoch):
                assert batch["labels"] == [dataset.targets[f] for f in batch["files"]], name
                assert batch["devices"] == [device], name
            assert [[len(b["files"]) for b in epoch] for epoch in got["epochs"]] == [sizes] * 2
            first, second = epoch_files(got)
            assert first != second, f"{name}: one order in both epochs"

        if name.startswith("dataloader"):  # the DistributedSampler's files, in its order
            for r, rank in enumerate(ranks):
                sampler: DistributedSampler[Any] = DistributedSampler(
                    dataset, RANKS, r, shuffle=True, seed=SEED
                )
                expected = []
                for epoch in range(2):
                    sampler.set_epoch(epoch)
                    expected.append(list(sampler)[: sum(sizes)])
                assert epoch_files(rank["modules"][name]) == expected, name
            continue
        twice = []  # DALI's: every file (less drop_last's), and the padding's again
        for epoch in range(2):
            counts = Counter(f for rank in ranks for f in epoch_files(rank["modules"][name])[epoch])
            twice.append(sorted(f for f, count in counts.items() if count == 2))
            assert set(counts) <= set(range(FILES)) and max(counts.values()) <= 2, name
            if drop_last:
                assert len(twice[-1]) <= padding, name
            else:
                assert len(counts) == FILES and len(twice[-1]) == padding, name
        if not drop_last:
            assert twice[0] == twice[1], f"{name}: the padding moved"
