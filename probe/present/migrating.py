"""`probe migrate RUN`: a watched DataLoader's DALI loader, written for the user's own job.

The run recorded what the loader is (its dataset's files and labels, its transforms by class
name and fields, its batch size, shuffle, drop_last and sampler: `spec.recipe`); the setting is
the one measured best for this job: the DALI point of the newest doctor session measured like
the run (`probe doctor --like RUN`), else of the newest doctor session on the same files, else
DALI's defaults, said so in the module and on the terminal.
"""

from __future__ import annotations

from pathlib import Path

from pipelines import InputError
from probe.fix.dali import DaliSetting, dali_module, files_name
from probe.fix.dataloader import TorchSetting, torch_module
from probe.fix.setting import PREFIXES, recorded_recipe, setting_for, torch_setting_for
from probe.judge.results import is_session_id, resolve_subject
from probe.present import console
from probe.present.measuring import EXIT_FAILED
from probe.present.offer import change_line, module_name, origin_of, rerun_text
from probe.present.stored import write_whole
from probe.store.db import Store
from probe.store.documents import read_run


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
    console.err.print(rerun_text(document, str(output)))
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
