"""`probe migrate RUN`: a watched DataLoader's DALI loader, written for the user's own job.

The run recorded what the loader is (its dataset's files and labels, its transforms by class
name and fields, its batch size, shuffle, drop_last and sampler: `spec.recipe`); the setting is
the one measured best for this job: the DALI point of the newest doctor session measured like
the run (`probe doctor --like RUN`), else of the newest doctor session on the same files, else
DALI's defaults, said so in the module and on the terminal.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pipelines import DaliOptions, InputError
from probe.judge.results import Session, is_session_id, resolve_subject
from probe.present import console
from probe.present.measuring import EXIT_FAILED
from probe.present.migrate import DaliSetting, dali_module, files_name
from probe.present.offer import change_line, module_name, origin_of, script_of
from probe.present.stored import write_whole
from probe.store.db import Store
from probe.store.documents import RunDocument, read_run

DEFAULT_THREADS = 8  # the doctor's first DALI point on a GPU: min(8, cores)


def migrate(
    db: Path | None,
    run_id: str,
    output: Path | None,
    threads: int | None = None,
    hw_decoder_load: float | None = None,
    force: bool = False,
) -> int:
    """Writes the DALI module for the watched run `run_id` to `output` (default: `dali_` and
    the loader's name in the script, `module_name`), with its setting (`threads`,
    `hw_decoder_load` where given), and says the line to change; nothing is written where a
    transform cannot be moved (exit 2).

    Raises:
        InputError: no such run, not a watched DataLoader, nothing recorded of it, a transform
            that cannot be moved (one line each), or a file that is there already.
    """
    if output is not None:
        _check_output(output, force)
    with Store(db, create=db is None) as store:
        subject = resolve_subject(store, run_id)
        if is_session_id(subject):
            raise InputError(
                f"{subject} is a doctor or sweep session: probe migrate takes a watched run "
                "(`probe runs` lists them)"
            )
        document = read_run(store, subject)
        if output is None:
            output = Path(f"{module_name(document)}.py")
            _check_output(output, force)
        recipe = recorded_recipe(document)
        setting = setting_for(store, document, threads, hw_decoder_load)
    written = dali_module(recipe, setting, origin=origin_of(document))
    files = None if written.files is None else Path(files_name(str(output)))
    if files is not None and written.files is not None and not write_whole(files, written.files):
        return EXIT_FAILED
    if not write_whole(output, written.module):
        return EXIT_FAILED
    also = f" and its file list {files}" if files is not None else ""
    console.err.print(f"wrote {output}{also}: {setting.describe()} ({setting.source})")
    console.err.print(change_line(document, output.stem))
    console.err.print(
        f"then check it on the job itself: `probe watch -- python {script_of(document)} ...`"
    )
    return 0


def _check_output(output: Path, force: bool) -> None:
    """Refuses a module file that cannot be imported, or one that is there already.

    Raises:
        InputError: which, and what to do.
    """
    if output.suffix != ".py" or not output.stem.isidentifier():
        raise InputError(
            f"-o {output}: the module's file must be a Python name ending in .py, to be imported"
        )
    if output.exists() and not force:
        raise InputError(f"{output} is there already: give another -o, or --force")
    if not output.parent.is_dir():
        raise InputError(f"cannot write {output}: no folder {output.parent}")


def recorded_recipe(document: RunDocument) -> dict[str, Any]:
    """What the run recorded of its loader to move it.

    Raises:
        InputError: the run is not a watched torch DataLoader, or recorded nothing of it.
    """
    spec = document.config.get("spec", {})
    if document.kind != "watch":
        raise InputError(
            f"run {document.run_id} is a {document.kind} run of feedscope's own pipelines: "
            "probe migrate writes the loader of a watched job (`probe watch -- python train.py`)"
        )
    if document.pipeline != "torch":
        raise InputError(
            f"run {document.run_id} watched a {document.pipeline} loader: probe migrate moves a "
            "torch DataLoader"
        )
    recipe = spec.get("recipe")
    if not recipe:
        raise InputError(
            f"run {document.run_id} recorded nothing of its loader's dataset and transforms "
            "(it was watched by an older feedscope): watch the job again"
        )
    return dict(recipe)


def setting_for(
    store: Store,
    document: RunDocument,
    threads: int | None = None,
    hw_decoder_load: float | None = None,
) -> DaliSetting:
    """The DALI setting for the run's job: the newest doctor session measured like it (or like
    another loader of its process: a script's training loader sets its validation loader's),
    else the newest on the same files, else DALI's defaults; `threads` and `hw_decoder_load` where
    given replace the session's."""
    folder = document.config.get("spec", {}).get("data_dir")
    job = {run.run_id for run in store.loaders(store.run(document.run_id))}  # its process's
    like: Session | None = None
    same_files: Session | None = None
    for record in sorted(store.sessions(), key=lambda r: r.created, reverse=True):
        if record.kind != "doctor" or not record.document.get("dali"):
            continue
        with contextlib.suppress(KeyError, TypeError, ValueError):  # written unlike this one
            session = Session.from_json(record.document)
            if session.dali is None or session.dali.images_per_s is None:
                continue
            if session.like == document.run_id and (like is None or like.like != session.like):
                like = session  # like this very run: before one like its other loader
            elif session.like in job and like is None:
                like = session
            elif same_files is None and _data_dir(store, session) == folder:
                same_files = session
    chosen = like or same_files
    if chosen is not None and chosen.dali is not None:
        dali = chosen.dali
        how = "measured on the same files"
        if chosen is like:
            how = (
                "measured like this run"
                if chosen.like == document.run_id
                else (f"measured like run {chosen.like}, this job's other loader")
            )
        rate = f"{dali.images_per_s:,.0f} images/s" if dali.images_per_s else "no rate"
        base = DaliSetting(
            num_threads=dali.num_threads,
            hw_decoder_load=DaliOptions.hw_decoder_load
            if dali.hw_decoder_load is None
            else dali.hw_decoder_load,
            decoder=dali.decoder,
            source=f"doctor session {chosen.session_id}, {how}: {rate} per GPU",
            predicted_images_per_s=dali.images_per_s,
        )
    else:
        base = DaliSetting(
            num_threads=DEFAULT_THREADS,
            hw_decoder_load=DaliOptions.hw_decoder_load,
            source=f"DALI's defaults, not measured for this job: `probe doctor --like "
            f"{document.run_id}` finds its best setting",
        )
    if threads is None and hw_decoder_load is None:
        return base
    return DaliSetting(
        num_threads=threads or base.num_threads,
        hw_decoder_load=base.hw_decoder_load if hw_decoder_load is None else hw_decoder_load,
        decoder=base.decoder,
        source=f"given on the command line (the measured setting: {base.source})",
    )


def _data_dir(store: Store, session: Session) -> str | None:
    """The data folder a session's runs read (None: it has no run that can be read)."""
    for run_id in session.run_ids[:1]:
        with contextlib.suppress(InputError, KeyError):
            folder = store.run(run_id).config.get("spec", {}).get("data_dir")
            return None if folder is None else str(folder)
    return None
