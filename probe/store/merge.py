"""Joining stores: a run's lanes with everything recorded for them, handed from one store to
another (the ranks of a torchrun probe to rank 0, the nodes of a job to one store by `probe
merge`), with times from another host moved onto this run's clock. The rows go through the
store's writers, which keep the rollups; a run whose start moves has its rollups built again
(their buckets count from it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from probe.records import (
    BatchEvent,
    GpuSample,
    HostSample,
    LaneCpuSample,
    LaneRecord,
    RunExport,
    RunRecord,
    RunStatus,
    stopped_for_another,
)
from probe.store import rollups
from probe.store.db import Store
from probe.store.schema import add_lanes, host_from_row, run_from_row, run_row


def import_run(store: Store, export: RunExport) -> list[int]:
    """Adds a run's lanes from another store, with their events and samples, to the run of
    the same id here (created if new); returns the lanes added. Lanes, GPUs and hosts the run
    already has here are kept as they are. Times from another host are moved onto this
    run's clock through the wall clock both hosts read at their start."""
    run = export.run
    with store.transaction() as db:  # several ranks may create the run at once
        db.execute(
            "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            run_row(run),
        )
        here = run_from_row(
            db.execute("SELECT * FROM runs WHERE run_id = ?", (run.run_id,)).fetchone()
        )
    shift = 0 if here.hostname == run.hostname else clock_shift(here.host, run.host)
    have = {lane.lane for lane in store.lanes(run.run_id)}
    lanes = [lane for lane in export.lanes if lane.lane not in have]
    added = {lane.lane for lane in lanes}
    uuids = {lane.gpu_uuid for lane in lanes} - {None}
    uuids -= _recorded(store, rollups.GPU, run.run_id)
    hosts = _recorded(store, rollups.HOST, run.run_id)
    with store.transaction() as db:
        add_lanes(db, lanes)
    add_rows(
        store,
        RunExport(
            run, lanes, [e for e in export.batches if e.lane in added],
            [g for g in export.gpu if g.gpu_uuid in uuids],
            {name: rows for name, rows in export.host.items() if name not in hosts},
            [c for c in export.lane_cpu if c.lane in added], export.unavailable,
        ),
        shift,
    )  # fmt: skip
    _join(store, run.run_id, run, shift)
    settle_run(store, run.run_id)
    return sorted(added)


def add_rows(store: Store, export: RunExport, shift: int = 0) -> None:
    """Writes an export's events and samples (not its run or lanes), `shift` added to their
    times, in one transaction."""
    store.add_rows(
        export.run.run_id,
        batches=_moved(export.batches, shift),
        gpu=_moved(export.gpu, shift),
        host={name: _moved(samples, shift) for name, samples in export.host.items()},
        lane_cpu=_moved(export.lane_cpu, shift),
        unavailable=export.unavailable,
    )


def export_run(store: Store, run_id: str) -> RunExport:
    """Everything recorded for a run (its exact id)."""
    run = store.run(run_id)
    host: dict[str, list[HostSample]] = {}
    for row in store.query(
        "SELECT * FROM host_samples WHERE run_id = ? ORDER BY t_ns", (run.run_id,)
    ):
        host.setdefault(row["hostname"], []).append(host_from_row(row))
    return RunExport(
        run, store.lanes(run.run_id), store.batches(run.run_id), store.gpu_samples(run.run_id),
        host, store.lane_cpu(run.run_id), store.unavailable(run.run_id),
    )  # fmt: skip


def settle_run(store: Store, run_id: str) -> None:
    """Sets a run's status from its lanes' once none is running: failed if one failed,
    interrupted if one was, else completed; a run missing lanes (recorded in another store:
    `probe merge` joins them) says which."""
    run = store.run(run_id)
    lanes = store.lanes(run_id)
    if any(lane.status is RunStatus.RUNNING for lane in lanes):
        return
    expected = int(run.config.get("world_size") or len(run.config.get("lanes", [])))
    missing = sorted(set(range(expected)) - {lane.lane for lane in lanes})
    failed = [x for x in lanes if x.status is RunStatus.FAILED]
    stopped = [x for x in lanes if x.status is RunStatus.INTERRUPTED]
    if failed:
        status, reasons = (
            RunStatus.FAILED,
            [f"lane {x.lane} failed: {x.reason}" for x in failed],
        )
    elif stopped:  # the lane that stopped first of itself says why
        first = first_to_end(stopped) or stopped[0]
        status, reasons = RunStatus.INTERRUPTED, [f"lane {first.lane}: {first.reason}"]
    else:
        status, reasons = RunStatus.COMPLETED, []
    if missing:
        reasons.append(
            f"{len(lanes)} of {expected} lanes recorded here (missing: "
            f"{', '.join(map(str, missing))}; `probe merge` adds them from their stores)"
        )
    ended = max((run.ended_ns or 0, *(store.time_span(run_id) or (0, 0))))
    store.finish_run(run_id, status, "; ".join(reasons) or None, ended)


def first_to_end(lanes: Sequence[LaneRecord]) -> LaneRecord | None:
    """The lane whose end a run's reason gives: the first that failed, else the first
    interrupted of itself (not `stopped_for_another`); None where none ended so."""
    failed = [x for x in lanes if x.status is RunStatus.FAILED]
    interrupted = [
        x for x in lanes if x.status is RunStatus.INTERRUPTED and not stopped_for_another(x.reason)
    ]
    return next(iter(failed + interrupted), None)


def _join(store: Store, run_id: str, other: RunRecord, shift: int) -> None:
    """Folds another store's record of a run into this one's: its lanes' configuration,
    its host, its start. Read and written in one transaction: ranks join at once, and a
    rank's lane entry (its cores, its shard) must not be written over by another's."""
    with store.transaction() as db:
        here = run_from_row(db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone())
        config = dict(here.config)
        lanes = {x["lane"]: x for x in (*config.get("lanes", []), *other.config["lanes"])}
        config["lanes"] = [lanes[k] for k in sorted(lanes)]
        host = dict(here.host)
        nodes = dict(host.get("nodes", {}))
        for name, facts in {other.hostname: other.host, **other.host.get("nodes", {})}.items():
            if name != here.hostname:
                nodes.setdefault(name, {k: v for k, v in facts.items() if k != "nodes"})
        if nodes:
            host["nodes"] = nodes
        started = min(here.started_ns, other.started_ns + shift)
        db.execute(
            "UPDATE runs SET config = ?, host = ?, started_ns = ? WHERE run_id = ?",
            (json.dumps(config), json.dumps(host), started, run_id),
        )
        if started != here.started_ns:
            rollups.rebuild(db, run_id)


def _recorded(store: Store, kind: rollups.Samples, run_id: str) -> set[Any]:
    """The GPUs (or hosts) a run holds samples of."""
    rows = store.query(
        f"SELECT DISTINCT {kind.key} FROM {kind.table} WHERE run_id = ? AND res_s = ?",
        (run_id, rollups.COARSEST_S),
    )
    return {row[0] for row in rows}


_Timed = TypeVar("_Timed", BatchEvent, GpuSample, HostSample, LaneCpuSample)


def _moved(items: Sequence[_Timed], shift: int) -> list[_Timed]:
    """`items` with `shift` added to their times."""
    if not shift:
        return list(items)
    return [dataclasses.replace(item, t_ns=item.t_ns + shift) for item in items]


def clock_shift(here: dict[str, Any], there: dict[str, Any]) -> int:
    """What to add to a monotonic time of host `there` to put it on host `here`'s monotonic
    clock, from the (monotonic, wall) pair each read together (a host dict's `clock`); 0 when
    either lacks one. As good as the hosts' wall clocks agree (NTP: milliseconds)."""
    a, b = here.get("clock"), there.get("clock")
    if not a or not b:
        return 0
    return int((a["monotonic_ns"] - a["unix_ns"]) - (b["monotonic_ns"] - b["unix_ns"]))
