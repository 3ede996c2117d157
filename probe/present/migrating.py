"""`probe migrate RUN`: a watched DataLoader's DALI loader, written for the user's own job.

The run recorded what the loader is (its dataset's files and labels, its transforms by class
name and fields, its batch size, shuffle, drop_last and sampler: `spec.recipe`); the setting is
the one measured best for this job: the DALI point of the newest doctor session measured like
the run (`probe doctor --like RUN`), else of the newest doctor session on the same files, else
DALI's defaults, said so in the module and on the terminal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines import DaliOptions, InputError
from probe.judge.like import like_session
from probe.judge.recipe import recipe_figure
from probe.judge.results import is_session_id, resolve_subject
from probe.present import console
from probe.present.measuring import EXIT_FAILED
from probe.present.migrate import DaliSetting, dali_module, files_name
from probe.present.migrate_torch import TorchSetting, torch_module
from probe.present.offer import change_line, module_name, origin_of, script_of
from probe.present.stored import write_whole
from probe.store.db import Store
from probe.store.documents import RunDocument, read_run

DEFAULT_THREADS = 8  # the doctor's first DALI point on a GPU: min(8, cores)
PREFIXES = {"dali": "dali", "dataloader": "torch"}  # a written module's name: PREFIX_loader


def migrate(
    db: Path | None,
    run_id: str,
    output: Path | None,
    threads: int | None = None,
    hw_decoder_load: float | None = None,
    force: bool = False,
    to: str = "dali",
    workers: int | None = None,
) -> int:
    """Writes the loader module for the watched run `run_id` to `output` (default: the prefix
    of `to` and the loader's name in the script, `module_name`): DALI's (`to` "dali"), with its
    setting (`threads`, `hw_decoder_load` where given), or feedscope's DataLoader recipe's (`to`
    "dataloader"), with its `workers` where given; and says the line to change. Nothing is
    written where the loader cannot be written (exit 2).

    Raises:
        InputError: no such run, not a watched DataLoader, nothing recorded of it, a transform
            that cannot be moved (one line each), an option of the other loader, or a file that
            is there already.
    """
    if to == "dataloader" and (threads is not None or hw_decoder_load is not None):
        raise InputError(
            "--threads and --hw-decoder-load set DALI: --to dataloader takes --workers"
        )
    if to == "dali" and workers is not None:
        raise InputError("--workers sets the DataLoader: give it with --to dataloader")
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
            output = Path(f"{module_name(document, PREFIXES[to])}.py")
            _check_output(output, force)
        recipe = recorded_recipe(document)
        setting: DaliSetting | TorchSetting
        if to == "dali":
            setting = setting_for(store, document, threads, hw_decoder_load)
            written = dali_module(recipe, setting, origin=origin_of(document))
        else:
            setting = torch_setting_for(store, document, workers)
            written = torch_module(recipe, setting, origin=origin_of(document))
    files = None if written.files is None else Path(files_name(str(output)))
    if files is not None and written.files is not None and not write_whole(files, written.files):
        return EXIT_FAILED
    if not write_whole(output, written.module):
        return EXIT_FAILED
    also = f" and its file list {files}" if files is not None else ""
    console.err.print(f"wrote {output}{also}: {setting.describe()} ({setting.source})")
    if written.keeps:
        console.err.print(f"it keeps the job's own {', '.join(written.keeps)}")
    console.err.print(change_line(document, output.stem, original=bool(written.keeps)))
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
    found = like_session(
        store,
        store.run(document.run_id),
        lambda session: session.dali is not None and session.dali.images_per_s is not None,
    )
    if found is not None and found.session.dali is not None:
        chosen, how, dali = found.session, found.how, found.session.dali
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


def torch_setting_for(
    store: Store, document: RunDocument, workers: int | None = None
) -> TorchSetting:
    """The workers for feedscope's DataLoader recipe in the run's job: the doctor's best
    DataLoader point measured like the run (`probe doctor --like RUN`: its DataLoader is the
    recipe), else the job's own; `workers` where given replaces them."""
    loader = document.config.get("spec", {}).get("dataloader", {})
    prefetch = loader.get("prefetch_factor")
    found = like_session(
        store,
        store.run(document.run_id),
        lambda session: session.best is not None and session.like == document.run_id,
    )
    figure = None if found is None else recipe_figure(found.session)
    if found is not None and figure is not None:
        base = TorchSetting(
            num_workers=figure.num_workers,
            source=f"doctor session {found.session.session_id}, {found.how}: feedscope's "
            f"DataLoader gave {figure.cell} images/s at num_workers={figure.num_workers}, read "
            f"{figure.read}",
            predicted_images_per_s=figure.images_per_s,
            prefetch_factor=prefetch,
        )
    else:
        base = TorchSetting(
            num_workers=int(loader.get("num_workers") or 0),
            source=f"the job's own, not measured for the recipe: `probe doctor --like "
            f"{document.run_id}` measures it",
            prefetch_factor=prefetch,
        )
    if workers is None:
        return base
    return TorchSetting(
        num_workers=workers,
        source=f"given on the command line (the measured setting: {base.source})",
        prefetch_factor=prefetch,
    )
