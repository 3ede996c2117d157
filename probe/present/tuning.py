"""`probe tune RUN` and `probe tune -- python train.py ARGS`: the command's words. It says what
it will run before the first trial, each trial as it ends, then the table of the candidates as
the job measured them and the answer, with the command that writes it (`probe.fix.tune` runs
the trials)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pipelines import InputError
from probe.fix.tune import WARMUP, Job, Pick, Tuning, figures, trial_text
from probe.judge.results import is_session_id, resolve_subject
from probe.metrics import counted, signed
from probe.present import console
from probe.present.measuring import EXIT_INTERRUPTED
from probe.store.db import Store
from probe.store.documents import read_run


def tune(
    db: Path | None,
    run_id: str | None,
    command: Sequence[str],
    batches: int,
    trial_s: float,
    trials: int,
    budget_s: float | None = None,
) -> int:
    """Tunes the watched run `run_id`'s training loader on its job; or, given `command`,
    watches the job first and tunes the run it made. Exit 0 with an answer, 1 where no trial
    measured, 130 on Ctrl-C (what was measured kept).

    Raises:
        InputError: both or neither of RUN and a command, or a run tune cannot run again.
    """
    if bool(run_id) == bool(command):
        raise InputError(
            "probe tune takes a watched run (probe tune RUN) or the job to watch first "
            "(probe tune -- python train.py ARGS)"
        )
    if command:
        code = _watch_first(db, command)
        if code != 0:
            console.err.print(
                f"error: the job exited with code {code} while watched: no run to tune"
            )
            return code
        run_id = "last"
    with Store(db, create=db is None) as store:
        subject = resolve_subject(store, str(run_id))
        if is_session_id(subject):
            raise InputError(f"{subject} is a session: probe tune takes a watched run")
        document = read_run(store, subject)
        path = store.path
    job = Job.of(document)
    job.check()
    lane = document.lanes[0].figures if document.lanes else None
    per_batch = lane.seconds / lane.batches if lane is not None and lane.batches else None
    tune_id = "tune-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    folder = path.parent / "tune" / tune_id
    folder.mkdir(parents=True, exist_ok=True)
    about = ""
    if per_batch is not None:
        seconds = (WARMUP + batches) * per_batch + (lane.warmup_s if lane else 0.0)
        about = (f" for about {seconds:,.0f} s each after its start-up (at most {trial_s:,.0f} "
                 "s)")  # fmt: skip
    where = f" ({job.site})" if job.site else ""
    console.err.print(
        f"probe tune: runs your job `{job.shown()}` in {job.cwd} up to {counted(trials, 'time')}"
        f"{about}, "
        f"{WARMUP} + {batches} batches each, with a candidate loader in place of its training "
        f"loader{where}; your script's files are not changed. Ctrl-C stops it."
    )
    tuning = Tuning(job, path, folder, tune_id, batches, trial_s, trials, budget_s,
                    say=console.err.print)  # fmt: skip
    try:
        answer = tuning.run()
    except KeyboardInterrupt:
        console.err.print(
            f"interrupted: {len(tuning.trials)} trial(s) kept ({tune_id}); the job was stopped"
        )
        return EXIT_INTERRUPTED
    for line in table(tuning, answer):
        console.print_lines([line])
    return 0 if answer is not None else 1


def _watch_first(db: Path | None, command: Sequence[str]) -> int:
    """`probe watch -- COMMAND`, in a process of its own, its output the user's."""
    argv = [sys.executable, "-m", "probe", "watch", *(["--db", str(db)] if db else []), "--"]
    console.err.print(f"probe tune: watching `{' '.join(command)}` first")
    return subprocess.call([*argv, *command])


def table(tuning: Tuning, answer: Pick | None) -> list[str]:
    """The candidates as the job measured them, then the answer."""
    run_id = tuning.job.run_id
    lines = [f"probe tune {tuning.tune_id} of run {run_id}: each candidate on the job itself",
             "  trial  candidate                          images/s (job)      run"]  # fmt: skip
    for number, trial in enumerate(tuning.trials, 1):
        lines.append(f"  {number:>5}  {trial.candidate.label:<34} {trial_text(trial)}")
    lines += [f"  note: {note}" for note in tuning.notes]
    if answer is None:
        lines.append("no answer: no trial measured a batch")
        return lines
    ranked = figures(tuning.trials)
    if len(ranked) > 1 and any(len(f.run_ids) > 1 for f in ranked):
        lines.append("  pooled: " + "; ".join(
            f"{f.candidate.label} {f.text()} over {len(f.run_ids)} trials" for f in ranked
            if len(f.run_ids) > 1))  # fmt: skip
    chosen = answer.chosen
    runs = ", ".join(chosen.run_ids)
    if not answer.change:
        best = answer.best
        beside = ""
        if best is not chosen:
            beside = (f"; the fastest, {best.candidate.label}, measured {best.text()} "
                      f"({signed(best.images_per_s / chosen.images_per_s - 1)}), within the "
                      "errors")  # fmt: skip
        lines.append(
            f"answer: no change: your loader measured {chosen.text()} (run {runs}){beside}"
        )
        return lines
    ratio, yours = answer.gain(), answer.yours
    against = "" if ratio is None or yours is None else f", {ratio:.2f}x yours ({yours.text()})"
    lines.append(
        f"answer: {chosen.candidate.label}: {chosen.text()} on your job (run {runs}){against}"
    )
    written = chosen.candidate.migrate(run_id)
    if written is None:
        lines.append(f"set num_workers={chosen.candidate.workers} where your script makes its "
                     f"DataLoader; it will give about {chosen.text()}")  # fmt: skip
    else:
        lines.append(f"write it: `{written}`; it will give about {chosen.text()}")
    return lines
