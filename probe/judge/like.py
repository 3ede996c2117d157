"""The doctor session that measured a watched job's options: the newest measured like the run
(`probe doctor --like RUN`), or like another loader of its process (a script's training loader
sets its validation loader's), else the newest on the same files."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from pipelines import InputError
from probe.judge.results import Session
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
