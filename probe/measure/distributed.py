"""Probes launched by torchrun: one lane per rank, one run for all of them.

Each rank drives its local GPU (LOCAL_RANK) and reads shard RANK of WORLD_SIZE, as a DDP job does.
It measures its lane into a scratch store of its own, then the ranks send what they recorded to
rank 0 over torch.distributed (gloo, so it also works without GPUs), which records one run with
every lane and host. With `gather=False` each rank adds its lane to its own store instead (one
file per node), and `probe merge` joins the nodes' stores later.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pipelines import InputError
from probe.records import RunExport
from probe.store.db import Store
from probe.store.merge import export_run, import_run

GLOO_TIMEOUT = timedelta(minutes=30)  # ranks wait for the slowest at the start and the end


@dataclass(frozen=True)
class Rank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def torchrun_rank() -> Rank | None:
    """This process's rank when torchrun (or another launcher setting its variables) started
    it; None otherwise.

    Raises:
        InputError: the variables are there but make no sense.
    """
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        values = [int(os.environ.get(name, default)) for name, default in zip(
            names, ("0", "1", "0", os.environ.get("WORLD_SIZE", "1")), strict=True
        )]  # fmt: skip
    except ValueError:
        found = ", ".join(f"{n}={os.environ.get(n)!r}" for n in names)
        raise InputError(f"torchrun's variables are not whole numbers: {found}") from None
    rank = Rank(*values)
    if not 0 <= rank.rank < rank.world_size or not 0 <= rank.local_rank < rank.local_world_size:
        raise InputError(
            f"RANK {rank.rank} of WORLD_SIZE {rank.world_size}, LOCAL_RANK {rank.local_rank} of "
            f"LOCAL_WORLD_SIZE {rank.local_world_size}: not a rank of its world"
        )
    return rank


def connect(rank: Rank) -> None:
    """Joins the ranks' gloo group (torchrun's MASTER_ADDR and MASTER_PORT)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=GLOO_TIMEOUT)


def disconnect() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def all_errors(error: str | None) -> list[str | None]:
    """Every rank's error (None: none), on every rank."""
    import torch.distributed as dist

    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return errors


def shared_run_id(rank: Rank, make: Callable[[], str]) -> str:
    """Rank 0's new run id, for every rank."""
    import torch.distributed as dist

    box = [make() if rank.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def run_ranked(
    rank: Rank,
    measure: Callable[[Store, str], Any],
    store: Store,
    run_id: str,
    *,
    gather: bool = True,
) -> list[str]:
    """Runs `measure(scratch_store, run_id)` (this rank's lane) and records it: on rank 0, every
    rank's lane (`gather`), else in `store`. Returns the ranks' errors (on rank 0: all of
    them), each "rank N: why"; a rank that failed to start records no lane."""
    import torch.distributed as dist

    export: RunExport | None = None
    error = None
    with tempfile.TemporaryDirectory(prefix="feedscope-rank-") as scratch:
        try:
            with Store(Path(scratch) / "rank.db") as local:
                measure(local, run_id)
                export = export_run(local, run_id)
        except InputError as failure:
            error = f"rank {rank.rank}: {failure}"
    if not gather:  # the node's ranks share its store: they add their lanes one at a time
        for turn in range(rank.local_world_size):
            if turn == rank.local_rank and export is not None:
                import_run(store, export)
            dist.barrier()
        return [error] if error else []
    parts: list[Any] = [None] * rank.world_size if rank.rank == 0 else []
    dist.gather_object((export, error), parts if rank.rank == 0 else None, dst=0)
    if rank.rank != 0:
        return [error] if error else []
    errors = []
    for part_export, part_error in parts:
        if part_export is not None:
            import_run(store, part_export)
        if part_error:
            errors.append(part_error)
    return errors
