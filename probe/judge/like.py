"""The doctor session that measured a watched job's options: the newest measured like the run
(`probe doctor --like RUN`), or like another loader of its process (a script's training loader
sets its validation loader's), else the newest on the same files."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipelines import InputError
from probe.judge.changes import Knob, Recommendation
from probe.judge.results import Session
from probe.metrics import IMAGES_PER_S, job_scope
from probe.records import RunRecord
from probe.store.db import Store


@dataclass(frozen=True)
class LikeSession:
    """A doctor session, and how it was measured for the run (`how`): "measured like this run, on
    a stand-in for its step", "measured like run X, this job's other loader, on a stand-in for its
    step" or "measured on the same files"; not on the job itself (`probe tune` measures there)."""

    session: Session
    how: str


def like_session(
    store: Store, run: RunRecord, wanted: Callable[[Session], bool]
) -> LikeSession | None:
    """The doctor session measured for `run` that holds what `wanted` asks of it (None: none)."""
    folder = run.config.get("spec", {}).get("data_dir")
    job = {loader.run_id for loader in store.loaders(run)}  # its process's
    like: Session | None = None
    same_files: Session | None = None
    for record in sorted(store.sessions(), key=lambda r: r.created, reverse=True):
        if record.kind != "doctor":
            continue
        with contextlib.suppress(KeyError, TypeError, ValueError):  # written unlike this one
            session = Session.from_json(record.document)
            if not wanted(session):
                continue
            if session.like == run.run_id and (like is None or like.like != session.like):
                like = session  # like this very run: before one like its other loader
            elif session.like in job and like is None:
                like = session
            elif same_files is None and folder and _data_dir(store, session) == folder:
                same_files = session
    if like is not None:
        which = (
            "this run" if like.like == run.run_id else f"run {like.like}, this job's other loader"
        )
        how = f"measured like {which}, on a stand-in for its step"
        return LikeSession(like, how)
    return None if same_files is None else LikeSession(same_files, "measured on the same files")


def _data_dir(store: Store, session: Session) -> str | None:
    """The data folder a session's runs read (None: it has no run that can be read)."""
    for run_id in session.run_ids[:1]:
        with contextlib.suppress(InputError, KeyError):
            folder = store.run(run_id).config.get("spec", {}).get("data_dir")
            return None if folder is None else str(folder)
    return None


def what_if(store: Store, run: RunRecord) -> LikeSession | None:
    """The newest doctor session that measured a watched run's what-if like it (`probe doctor
    --like RUN`), with an answer; None: none did. One measured like the job's other loader is
    not this loader's (its batch size and transforms differ): `probe migrate` may take DALI's
    setting from it (`like_session`), the loader's page does not quote its figures."""
    return like_session(store, run, lambda s: s.answered and s.like == run.run_id)


def what_if_text(found: LikeSession) -> str:
    """What the session measured for the run, in its own figures (those its answer weighed):
    its answer, and DALI where it measured it."""
    session = found.session
    whose = job_scope(session.devices)
    parts = []
    for item in session.recommendations[:1]:
        figure = IMAGES_PER_S.text(item.predicted_images_per_s, item.predicted_error)
        which, read = item.setting, ""
        if item.change.knob is Knob.NUM_WORKERS:  # the doctor's DataLoader: the recipe's
            which = f"feedscope's DataLoader at {item.setting}"
            epochs = session.epochs
            if epochs is not None and epochs.images_per_s is not None:
                by_epoch = IMAGES_PER_S.text(epochs.images_per_s, epochs.images_per_s_error)
                read = f" as one stream, {by_epoch}{whose} read epoch by epoch"
        parts.append(f"its answer, {which}, {figure}{whose}{read}")
    dali = session.dali
    shown = None if dali is None else session.shown(dali.change.setting)
    if (
        dali is not None
        and shown is not None
        and not any(r.change == dali.change for r in session.recommendations[:1])
    ):
        listed = any(r.change == dali.change for r in session.recommendations)
        parts.append(
            f"{dali.change.setting} {shown.text}{whose}" + ("" if listed else ", not recommended")
        )
    return (
        f"{found.how}, doctor session {session.session_id} measured: "
        + "; ".join(parts)
        + f" (`probe show {session.session_id}`)"
    )


def dali_as_measured(
    found: LikeSession, estimate: Recommendation
) -> tuple[Recommendation | None, Recommendation | None]:
    """A run's estimated move to DALI, `estimate`, as the session `found` measured it: the
    session's recommendation of it (first of the pair), or where the session measured DALI and
    did not recommend it, the move set aside with why (second); (None, None): not measured."""
    session, dali = found.session, found.session.dali
    where = f"{found.how}, doctor session {found.session.session_id}"
    listed = next((r for r in session.recommendations if r.change.knob is Knob.PIPELINE), None)
    if listed is not None:
        return replace(listed, basis=f"{where}: {listed.basis}"), None
    if dali is None or not dali.judged:
        return None, None
    shown = session.shown(dali.change.setting)
    if shown is None:
        return None, None
    why = dali.advice or "below the DataLoader's answer there"
    aside = Recommendation(
        estimate.action,
        dali.change,
        shown.images_per_s,
        f"{where}, {shown.source}",
        notes=(f"not recommended: {why}",),
        predicted_error=shown.error,
    )
    return None, aside
