"""The listings the dashboard and the launcher read: runs with their headline figures, and the
runs in progress. Runs whose probe process is gone are marked interrupted first (that takes
asking the system whether a process lives, which the host sampler owns).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from probe.measure.samplers.host import pid_alive
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.records import RunRecord, RunStatus
from probe.store.db import Store
from probe.store.documents import lane_figures_of


@dataclass(frozen=True)
class RunRow:
    """One run in a listing."""

    run_id: str
    created: str
    status: str
    reason: str | None
    pipeline: str
    consumer: str
    label: str | None
    devices: str  # "cpu x2" or "GPU 0,1"
    images_per_s: float
    data_wait_frac: float | None
    session_id: str | None


def run_rows(store: Store, limit: int = 500) -> list[RunRow]:
    """The newest runs with their headline figures: the lanes' stored figures, or for a lane
    that stored none (running, or killed), those of its events so far."""
    store.mark_abandoned_runs(socket.gethostname(), pid_alive)
    out = []
    for run in store.runs()[:limit]:
        lanes = store.lanes(run.run_id)
        figures = [lane_figures_of(store, run, lane) for lane in lanes]
        gpus = [lane.gpu_index for lane in lanes]
        devices = (
            f"cpu x{len(gpus)}"
            if all(g is None for g in gpus)
            else "GPU " + ",".join(str(g) for g in gpus)
        )
        out.append(
            RunRow(
                run_id=run.run_id,
                created=run.created,
                status=run.status.value,
                reason=run.reason,
                pipeline=run.pipeline,
                consumer=run.consumer,
                label=run.label,
                devices=devices,
                images_per_s=IMAGES_PER_S.of_run(f.images_per_s for f in figures) or 0.0,
                data_wait_frac=DATA_WAIT.of_run(f.data_wait_frac for f in figures),
                session_id=run.session_id,
            )
        )
    return out


def running_runs(store: Store) -> list[RunRecord]:
    """Runs in progress now (those whose probe process is gone are marked interrupted)."""
    store.mark_abandoned_runs(socket.gethostname(), pid_alive)
    return [run for run in store.runs() if run.status is RunStatus.RUNNING]
