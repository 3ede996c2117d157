"""What the commands on recorded runs do: `probe runs`, `show`, `report`, `check` and `merge`.
Each returns the command's exit code."""

from __future__ import annotations

import contextlib
import errno
import socket
from pathlib import Path

import click

from pipelines import InputError
from probe.present import console, terminal
from probe.present.jsontext import json_text
from probe.present.measuring import EXIT_FAILED
from probe.store.db import Store
from probe.store.documents import read_run
from probe.store.merge import export_run, import_run
from probe.store.spool import tidy

REPORT_FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".json": "json"}


def runs(db: Path | None, as_json: bool, limit: int) -> int:
    """The doctor and sweep sessions with their answers, then the recorded runs, newest first
    (those whose process died unseen marked so); with `as_json`, the runs."""
    from probe.measure.samplers.host import pid_alive
    from probe.present.listing import session_rows

    with Store(db, create=db is None) as store:
        tidy(store, socket.gethostname(), pid_alive)
        documents = [read_run(store, r.run_id) for r in store.runs()[:limit]]
        sessions = [] if as_json else session_rows(store, limit)
    if as_json:
        listing = [
            {
                "run_id": d.run_id, "status": d.status, "reason": d.reason,
                "pipeline": d.pipeline, "consumer": d.consumer, "created": d.created,
                "label": d.label, "images_per_s": d.images_per_s, "lanes": len(d.lanes),
                "data_wait_frac": d.data_wait_frac,
            }
            for d in documents
        ]  # fmt: skip
        click.echo(json_text(listing))
    elif not documents and not sessions:
        console.err.print("no runs yet: start one with `probe doctor` (or `probe run`)")
    else:
        if sessions:  # the answers first, then the runs that gave them
            console.out.print(terminal.sessions_table(sessions))
        if documents:
            console.out.print(terminal.runs_table(documents))
    return 0


def show(db: Path | None, run_id: str, as_json: bool, verbose: bool = False) -> int:
    """A run and its diagnosis, or a sweep or doctor session (those whose process, or a rank
    of it, died unseen marked so); `verbose`: with failed lanes' tracebacks."""
    from probe.fix.setting import tune_told
    from probe.judge.diagnosis import diagnose_run
    from probe.judge.results import is_session_id, read_session, resolve_subject
    from probe.measure.samplers.host import pid_alive

    with Store(db, create=db is None) as store:
        tidy(store, socket.gethostname(), pid_alive)
        subject = resolve_subject(store, run_id)
        if is_session_id(subject):
            session = read_session(store, subject)
            if as_json:
                click.echo(json_text(session.to_json()))
            else:
                console.print_session(session)
                console.say(f"session {session.session_id}")
            return 0
        document = read_run(store, subject)
        diagnosis = diagnose_run(store, document.run_id)
        tuned = tune_told(store, document.run_id) if document.kind == "watch" else None
        others = [r for r in store.loaders(store.run(subject)) if r.run_id != subject]
    if as_json:
        click.echo(json_text({**document.to_json(), "diagnosis": diagnosis.to_json()}))
        return 0
    host = document.host
    reason = f": {document.reason}" if document.reason else ""
    label = f", label {document.label}" if document.label else ""
    gpus = ", ".join(f"{g['index']}: {g['name']}" for g in host.get("gpus", [])) or "none"
    console.print_lines(
        [
            f"run {document.run_id} ({document.status}{reason}), created {document.created}{label}",
            f"pipeline {document.pipeline}, consumer {document.consumer}; data "
            f"{document.config['spec']['data_dir']}",
            f"host {host.get('hostname')}: {host.get('cpus')} CPU cores "
            f"({host.get('cpu_model', '?')}), GPUs {gpus}; torch {host.get('torch', '?')}, "
            f"DALI {host.get('dali') or 'not installed'}",
        ]
    )
    console.print_run(document, diagnosis, tuned)
    for lane in document.lanes:
        if lane.traceback and verbose:
            console.say(f"lane {lane.lane} failed here:\n{lane.traceback.rstrip()}")
        elif lane.traceback:
            console.say(f"lane {lane.lane}'s traceback: `probe show {document.run_id} --verbose`")
    if diagnosis.answered_by is not None:
        console.say(
            f"the recommendations are doctor session {diagnosis.answered_by}'s, measured: this "
            f"run is one of its points (`probe show {diagnosis.answered_by}`)"
        )
    for other in others:
        console.say(f"the script's other loader: {other.label}, run {other.run_id} "
                    f"(`probe show {other.run_id}`)")  # fmt: skip
    return 0


def report(db: Path | None, subject: str, form: str | None, output: Path | None) -> int:
    """A report in `form` (else the one `output`'s suffix names, else Markdown), written whole
    or not at all; on stdout without `output`."""
    from probe.present.report import build_report, render

    form = form or REPORT_FORMATS.get(output.suffix.lower() if output else "", "md")
    if output is not None and not output.parent.is_dir():
        raise InputError(f"cannot write {output}: no folder {output.parent}")
    with Store(db, create=db is None) as store:
        text = render(build_report(store, subject), form)
    if output is None:
        click.echo(text, nl=False)
        return 0
    if not write_whole(output, text):
        return EXIT_FAILED
    click.echo(f"wrote {output} ({form}, {len(text.encode()) / 1e6:.1f} MB)", err=True)
    return 0


def write_whole(path: Path, text: str) -> bool:
    """Writes `text` to `path` whole or not at all (never half a file under the name asked
    for); False, with one line said, where the machine failed (a full disk).

    Raises:
        InputError: the path cannot be written (a folder, no permission), with why.
    """
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):  # a read-only file system refuses the cleanup too
            partial.unlink(missing_ok=True)
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):  # the machine's, not yours
            click.echo(f"error: cannot write {path}: {error.strerror}", err=True)
            return False
        raise InputError(f"cannot write {path}: {error.strerror or error}") from None
    return True


def check(
    db: Path | None,
    run_id: str,
    max_data_wait: str | None,
    min_images_per_s: float | None,
    max_batch_latency_p99_ms: float | None,
    as_json: bool,
) -> int:
    """The gate: 0 when every lane meets every threshold, EXIT_FAILED otherwise."""
    from probe.present.gate import Thresholds, check_run, parse_share

    thresholds = Thresholds(
        None if max_data_wait is None else parse_share(max_data_wait),
        min_images_per_s,
        max_batch_latency_p99_ms,
    )
    thresholds.check()
    from probe.judge.results import focus_run, resolve_subject

    with Store(db, create=db is None) as store:
        run = focus_run(store, resolve_subject(store, run_id))
        result = check_run(read_run(store, run), thresholds)
    if as_json:
        click.echo(json_text(result))
    elif result["passed"]:
        click.echo(f"run {result['run_id']}: every lane meets {thresholds.text()}", err=True)
    else:
        click.echo(f"run {result['run_id']} fails the check ({thresholds.text()}):", err=True)
        for miss in result["misses"]:
            click.echo(f"  {miss}", err=True)
    return 0 if result["passed"] else EXIT_FAILED


def merge(sources: tuple[Path, ...], db: Path | None) -> int:
    """Adds the runs of the `sources` stores to `db`'s: the lanes a run here lacks, the runs and
    sessions it lacks."""
    with Store(db) as store:
        for source in sources:
            if not source.is_file():
                raise InputError(f"no store at {source}")
            if source.resolve() == store.path.resolve():
                raise InputError(f"{source} is the store merged into (--db): give other stores")
            with Store(source) as other:
                for run in reversed(other.runs()):
                    added = import_run(store, export_run(other, run.run_id))
                    what = f"lanes {', '.join(map(str, added))}" if added else "nothing new"
                    console.say(f"{source}: run {run.run_id}: {what}")
                for session in other.sessions():
                    if session.session_id not in {s.session_id for s in store.sessions()}:
                        store.save_session(session)
    return 0
