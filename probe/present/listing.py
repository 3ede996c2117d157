"""The listings the dashboard and the launcher read: runs with their headline figures, sweep and
doctor sessions with their answers, and the runs in progress. Runs whose probe process is gone
are marked interrupted first (that takes asking the system whether a process lives, which the
host sampler owns).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from probe.judge.results import read_session
from probe.measure.samplers.host import pid_alive
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present.tables import headline, pipeline_only, recommendation_text
from probe.records import RunRecord, RunStatus
from probe.store.db import Store
from probe.store.documents import lane_figures_of
from probe.store.spool import tidy


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

    @property
    def pipeline_only(self) -> bool:
        """No consumer: its data-wait is the pipeline's capacity at work, not starvation."""
        return pipeline_only(self.consumer)


@dataclass(frozen=True)
class SessionRow:
    """One sweep or doctor session in a listing: what it answered."""

    session_id: str
    kind: str  # "sweep" or "doctor"
    created: str
    status: str
    consumer: str
    devices: str
    answer: str  # a doctor's verdict in one line, a sweep's knee; or why there is none
    recommendation: str  # a doctor's first recommendation, with its images/s
    runs: int


def session_rows(store: Store, limit: int = 200) -> list[SessionRow]:
    """The newest sweep and doctor sessions with their answers."""
    out = []
    for record in store.sessions()[:limit]:
        session = read_session(store, record.session_id)
        top = session.recommendations[0] if session.recommendations else None
        agreed = session.verify is None or session.verify.verified
        if session.verdict is not None:
            answer = headline(session.verdict)
        elif session.knee is not None:
            answer = f"knee at {session.knob}={session.knee.setting}"
        else:
            answer = f"no answer: {session.reason or 'nothing was measured'}"
        out.append(
            SessionRow(
                session_id=session.session_id,
                kind=session.kind.value,
                created=session.created,
                status=session.status.value,
                consumer=session.consumer,
                devices=", ".join(session.devices) or "-",
                answer=answer,
                recommendation="-" if top is None else recommendation_text(top, "", agreed),
                runs=len(session.run_ids),
            )
        )
    return out


def run_rows(store: Store, limit: int = 500) -> list[RunRow]:
    """The newest runs with their headline figures: the lanes' stored figures, or for a lane
    that stored none (running, or killed), those of its events so far."""
    tidy(store, socket.gethostname(), pid_alive)
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
    tidy(store, socket.gethostname(), pid_alive)
    return [run for run in store.runs() if run.status is RunStatus.RUNNING]
