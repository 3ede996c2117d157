"""`probe tune RUN`: each candidate loader measured on the job itself.

The watched run recorded what running its job again needs (its command, folder, interpreter,
cores, visible GPUs and torchrun world: `probe.measure.autowatch.rerun_record`). Tune runs that
command again once per candidate (a trial), under `probe watch --loader MODULE` (the module
`probe migrate` writes for the candidate, in place of the training loader, with no edit to the
script) or `--workers N` (the job's own loader at N workers), stopped after `batches` batches
beyond the warm-up on every rank. Each trial is a run of its own, named after its candidate, and
its figure is the job's images/s as `probe watch` measures it.

The candidates are searched as the doctor searches them: the job's own loader first (the
answer's baseline, measured in this session as the others are), feedscope's DataLoader recipe
and DALI at their starting points (what the doctor or `--like` measured for the job where it
did, else from the cores a rank has), then the neighbours of the best one so far (workers
halved and doubled; DALI's threads, and on a GPU its hardware decoder's share). Where the best
two are within their errors, each is measured once more, in turn, and their trials pooled.
The answer is the candidate the job measured best; one whose gain over the job's own is within
the errors is no change.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines import DaliOptions, InputError
from pipelines.errors import error_line
from probe.fix.dali import DaliSetting, Unmovable, dali_module, files_name
from probe.fix.dataloader import TorchSetting, torch_module
from probe.judge.like import like_session
from probe.judge.recipe import recipe_figure
from probe.records import RunStatus, TuneRecord
from probe.store.db import Store
from probe.store.documents import RunDocument, read_run

WARMUP = 5  # each trial's first batches, left out of its figure (as `probe watch`'s default)
BATCHES = 200  # each trial's batches beyond them
TRIAL_S = 180.0  # a trial still running after this long is stopped, what it measured kept
TRIALS = 6
STOP_S = 15.0  # how long a trial stopped gets to end before it is killed
SHARES = (1.0, 0.9, 0.75, 0.65)  # the hardware decoder's shares searched, as the doctor's


@dataclass(frozen=True)
class Candidate:
    """A loader for the job: its own (`kind` "yours", at `workers`), feedscope's DataLoader
    recipe ("recipe", at `workers`) or DALI ("dali", `threads` and, on a GPU, `share`: its
    hardware decoder's share of the JPEGs)."""

    kind: str
    workers: int | None = None
    threads: int | None = None
    share: float | None = None

    @property
    def label(self) -> str:
        if self.kind == "yours":
            return f"yours, num_workers={self.workers}"
        if self.kind == "recipe":
            return f"recipe, num_workers={self.workers}"
        share = "" if self.share is None else f" x share {self.share:g}"
        return f"DALI, {self.threads} thread{'s' if self.threads != 1 else ''}{share}"

    def migrate(self, run_id: str) -> str | None:
        """The command that writes it for the job (None: the job's own loader)."""
        if self.kind == "recipe":
            return f"probe migrate {run_id} --to dataloader --workers {self.workers}"
        if self.kind == "dali":
            share = "" if self.share is None else f" --hw-decoder-load {self.share:g}"
            return f"probe migrate {run_id} --to dali --threads {self.threads}{share}"
        return None


@dataclass
class Trial:
    """One run of the job with a candidate: its figure for the job, or why it has none."""

    candidate: Candidate
    run_id: str | None = None
    images_per_s: float | None = None
    error: float | None = None
    seconds: float = 0.0
    status: str = "measured"  # measured | stopped (at its time limit) | failed | interrupted
    cause: str | None = None
    batches: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "candidate": asdict(self.candidate)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trial:
        return cls(**{**data, "candidate": Candidate(**data["candidate"])})


@dataclass(frozen=True)
class Figure:
    """A candidate's figure for the job over its trials: the mean, its error, its runs."""

    candidate: Candidate
    images_per_s: float
    error: float | None
    run_ids: tuple[str, ...]

    def text(self) -> str:
        error = "" if self.error is None else f" ± {self.error:,.0f}"
        return f"{self.images_per_s:,.0f}{error} images/s"


def figures(trials: Sequence[Trial]) -> list[Figure]:
    """Each candidate measured, its trials pooled, the best first."""
    out = []
    for candidate in dict.fromkeys(t.candidate for t in trials):
        measured = [t for t in trials if t.candidate == candidate and t.images_per_s]
        if not measured:
            continue
        rates = [t.images_per_s or 0.0 for t in measured]
        rate = sum(rates) / len(rates)
        errors = [t.error for t in measured if t.error is not None]
        error = math.hypot(*errors) / len(errors) if errors else None
        if len(rates) > 1:
            # a setting's runs differ by more than each run's own error says (the GPU's clocks,
            # the page cache): pooled, the error is at least half their spread
            error = max(error or 0.0, (max(rates) - min(rates)) / 2)
        runs = tuple(t.run_id for t in measured if t.run_id)
        out.append(Figure(candidate, rate, error, runs))
    return sorted(out, key=lambda f: -f.images_per_s)


def apart(a: Figure, b: Figure) -> bool:
    """Whether `a` is above `b` beyond their errors (95% intervals that do not overlap)."""
    return a.images_per_s - (a.error or 0.0) > b.images_per_s + (b.error or 0.0)


@dataclass(frozen=True)
class Pick:
    """Tune's answer: the candidate the job measured best, or the job's own where no other was
    better beyond the errors (`best` then the fastest measured)."""

    chosen: Figure
    yours: Figure | None
    best: Figure

    @property
    def change(self) -> bool:
        return self.yours is None or self.chosen is not self.yours

    def gain(self) -> float | None:
        if self.yours is None or not self.yours.images_per_s:
            return None
        return self.chosen.images_per_s / self.yours.images_per_s


def pick(trials: Sequence[Trial]) -> Pick | None:
    """The answer of `trials`, whose first is the job's own loader as it was (None: nothing
    measured)."""
    ranked = figures(trials)
    if not ranked:
        return None
    own = trials[0].candidate
    yours = next((f for f in ranked if f.candidate == own), None)
    best = ranked[0]
    if yours is not None and best is not yours and not apart(best, yours):
        return Pick(yours, yours, best)
    return Pick(best, yours, best)


@dataclass(frozen=True)
class Job:
    """What running a watched job again needs, as its run recorded it."""

    run_id: str
    argv: tuple[str, ...]
    cwd: str
    python: str
    cores: tuple[int, ...]
    cuda_visible_devices: str | None
    ranks: int  # on this node
    site: str | None  # FILE:LINE of the training loader's loop
    workers: int  # its own loader's
    prefetch_factor: int | None  # its own loader's, which the recipe's module keeps
    on_gpu: bool
    label: str
    recipe: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cores_per_rank(self) -> int:
        return max(1, len(self.cores) // max(1, self.ranks))

    @classmethod
    def of(cls, document: RunDocument) -> Job:
        """The job of a watched run.

        Raises:
            InputError: not a watched run of `probe watch --`, or one of several nodes.
        """
        command = document.config.get("command")
        if document.kind != "watch":
            raise InputError(
                f"run {document.run_id} is a {document.kind} run of feedscope's own pipelines: "
                "probe tune measures a watched job (`probe watch -- python train.py`)"
            )
        if not command:
            raise InputError(
                f"run {document.run_id} recorded no command to run again (watched by watch() in "
                "its code, or by an older feedscope): `probe tune -- python train.py ARGS` "
                "watches it first"
            )
        if (command.get("nnodes") or 1) > 1:
            raise InputError(
                f"run {document.run_id} ran on {command['nnodes']} nodes: probe tune runs a job "
                "again on one node; tune it on one node's ranks, or measure each candidate with "
                "`probe watch --loader` on every node"
            )
        if document.pipeline != "torch":
            raise InputError(
                f"run {document.run_id} watched a {document.pipeline} loader: probe tune swaps a "
                "torch DataLoader"
            )
        recipe = document.config.get("spec", {}).get("recipe") or {}
        site = None
        if recipe.get("file") and recipe.get("line"):
            site = f"{Path(str(recipe['file'])).name}:{recipe['line']}"
        loader = document.config.get("spec", {}).get("dataloader") or {}
        return cls(
            run_id=document.run_id,
            argv=tuple(command["argv"]),
            cwd=command["cwd"],
            python=command["python"] if Path(command["python"]).exists() else sys.executable,
            cores=tuple(command.get("cores") or sorted(os.sched_getaffinity(0))),
            cuda_visible_devices=command.get("cuda_visible_devices"),
            ranks=int(command.get("nproc_per_node") or 1),
            site=site,
            workers=int(loader.get("num_workers") or 0),
            prefetch_factor=loader.get("prefetch_factor"),
            on_gpu=any(lane.gpu is not None for lane in document.lanes),
            label=(document.label or "train.py").split(" (")[0],
            recipe=recipe,
        )

    def check(self) -> None:
        """Refuses a job that cannot run again here.

        Raises:
            InputError: its folder is gone.
        """
        if not Path(self.cwd).is_dir():
            raise InputError(f"the job's folder {self.cwd} is not there to run it again")

    def command(self, watch: Sequence[str]) -> list[str]:
        """The job's command under `probe watch` with the options `watch`: under torchrun when
        it ran so, with as many processes."""
        launcher = [self.python]
        if self.ranks > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone",
                         f"--nproc-per-node={self.ranks}"]  # fmt: skip
        return [*launcher, "-m", "probe", "watch", *watch, "--", *self.argv]

    def shown(self) -> str:
        """The job's command as the user ran it."""
        launch = f"torchrun --nproc-per-node={self.ranks} " if self.ranks > 1 else ""
        return launch + " ".join(self.argv)


def starts(job: Job, store: Store) -> list[Candidate]:
    """The first candidates: the job's own loader, then feedscope's DataLoader recipe and DALI
    at what a doctor session measured for the job, else at the cores a rank has; those that
    cannot be written for the job left out (`unmovable` names them)."""
    run = store.run(job.run_id)
    out = [Candidate("yours", workers=job.workers)]
    cores = job.cores_per_rank
    if movable(job, "recipe"):
        found = like_session(store, run, lambda s: s.best is not None and s.like == job.run_id)
        figure = None if found is None else recipe_figure(found.session)
        workers = figure.num_workers if figure is not None else max(1, min(job.workers, cores))
        out.append(Candidate("recipe", workers=max(1, min(workers, cores))))
    if movable(job, "dali"):
        found = like_session(store, run, lambda s: s.dali is not None and bool(s.dali.images_per_s))
        dali = None if found is None else found.session.dali
        if dali is not None and (dali.decoder == "mixed") == job.on_gpu:
            share = None
            if job.on_gpu:
                share = (
                    DaliOptions.hw_decoder_load
                    if dali.hw_decoder_load is None
                    else dali.hw_decoder_load
                )
            out.append(Candidate("dali", threads=dali.num_threads, share=share))
        elif job.on_gpu:  # the hardware decoder takes the JPEGs off the cores first
            out.append(Candidate("dali", threads=max(1, min(cores, 4) // 2), share=1.0))
        else:
            out.append(Candidate("dali", threads=cores))
    return out


def neighbours(candidate: Candidate, job: Job) -> list[Candidate]:
    """The settings next to `candidate`: workers or threads doubled and halved within the
    cores a rank has, and on a GPU DALI's share one step either way."""
    cores = job.cores_per_rank
    out = []
    if candidate.kind == "dali":
        threads = candidate.threads or 1
        if candidate.share is not None:
            index = min(range(len(SHARES)), key=lambda i: abs(SHARES[i] - (candidate.share or 0)))
            for step in (1, -1):
                if 0 <= index + step < len(SHARES):
                    out.append(Candidate("dali", threads=threads, share=SHARES[index + step]))
        for value in (threads * 2, threads // 2):
            if 1 <= value <= cores and value != threads:
                out.append(Candidate("dali", threads=value, share=candidate.share))
        return out
    workers = candidate.workers or 0
    for value in (max(1, workers) * 2, workers // 2):
        if 0 <= value <= cores and value != workers:
            out.append(Candidate(candidate.kind, workers=value))
    return out


def movable(job: Job, kind: str) -> bool:
    """Whether the job's loader can be written as `kind`'s module."""
    return unmovable(job, kind) is None


def unmovable(job: Job, kind: str) -> str | None:
    """Why the job's loader cannot be written as `kind`'s module (None: it can)."""
    if not job.recipe:
        return "its run recorded nothing of its loader's dataset and transforms"
    try:
        if kind == "dali":
            dali_module(job.recipe, DaliSetting(num_threads=1, hw_decoder_load=0.0), "")
        else:
            torch_module(job.recipe, TorchSetting(num_workers=0), "")
    except Unmovable as error:
        return "; ".join(error.lines)
    return None


def module_for(job: Job, candidate: Candidate, folder: Path) -> Path | None:
    """The module written for `candidate` in `folder` (None: the job's own loader)."""
    origin = f"run {job.run_id} of {job.label} (probe tune: {candidate.label})"
    if candidate.kind == "yours":
        return None
    if candidate.kind == "dali":
        written = dali_module(
            job.recipe,
            DaliSetting(
                num_threads=candidate.threads or 1,
                hw_decoder_load=candidate.share if candidate.share is not None else 0.0,
                source="probe tune's trial",
            ),
            origin,
        )
        name = f"dali_t{candidate.threads}_s{round((candidate.share or 0) * 100)}"
    else:
        setting = TorchSetting(candidate.workers or 0, source="probe tune's trial",
                               prefetch_factor=job.prefetch_factor)  # fmt: skip
        written = torch_module(job.recipe, setting, origin)
        name = f"torch_w{candidate.workers}"
    path = folder / f"{name}.py"
    if written.files is not None:
        Path(files_name(str(path))).write_text(written.files, encoding="utf-8")
    path.write_text(written.module, encoding="utf-8")
    return path


@dataclass
class Tuning:
    """One tune session: its job, its options, its trials as they end (saved each time)."""

    job: Job
    db: Path
    folder: Path
    tune_id: str
    batches: int = BATCHES
    trial_s: float = TRIAL_S
    trials_at_most: int = TRIALS
    budget_s: float | None = None  # the session's seconds (None: bounded by its trials alone)
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    say: Callable[[str], None] = print
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    _started: float = field(default=0.0, init=False)

    def run(self) -> Pick | None:
        """Runs the trials; the answer (None: nothing measured). A Ctrl-C stops the trial under
        way and the session, what was measured kept (KeyboardInterrupt raised on)."""
        store_status = RunStatus.COMPLETED
        reason = None
        self._started = time.monotonic()
        try:
            with Store(self.db) as store:
                queue = starts(self.job, store)
            for kind in ("recipe", "dali"):
                why = unmovable(self.job, kind)
                if why is not None:
                    what = "DALI" if kind == "dali" else "the recipe"
                    self.notes.append(f"{what}: not tried: {why}")
            tried: set[Candidate] = set()
            while len(self.trials) < self.trials_at_most:
                candidate = next((c for c in queue if c not in tried), None)
                if (
                    candidate is None
                    and self._close()
                    and self.trials_at_most - len(self.trials) == 2
                ):
                    break  # every start measured: the last two trials go to the close call
                if candidate is None:
                    candidate = self._next(tried)
                if candidate is None or not self.fits(1):
                    break
                tried.add(candidate)
                self._trial(candidate)
            self._close_call()
        except KeyboardInterrupt:
            store_status, reason = RunStatus.INTERRUPTED, "interrupted (Ctrl-C)"
            raise
        finally:
            self.save(store_status, reason)
        return pick(self.trials)

    def left_s(self) -> float:
        """The seconds the budget leaves (infinite without one)."""
        if self.budget_s is None:
            return math.inf
        return self.budget_s - (time.monotonic() - self._started)

    def fits(self, count: int) -> bool:
        """Whether `count` more trials fit the budget, each as long as the trials so far took
        (said once where they do not)."""
        if not self.trials:
            return self.left_s() > 0
        mean = sum(t.seconds for t in self.trials) / len(self.trials)
        if count * mean <= self.left_s():
            return True
        said = f"the budget ({self.budget_s:g} s) left no time for"
        if not any(note.startswith(said) for note in self.notes):
            self.notes.append(f"{said} {'another trial' if count == 1 else f'{count} more trials'}"
                              f" (each took about {mean:,.0f} s): --budget sets it")  # fmt: skip
        return False

    def _next(self, tried: set[Candidate]) -> Candidate | None:
        """A neighbour not yet tried of the best measured, else of the next best."""
        for figure in figures(self.trials):
            for candidate in neighbours(figure.candidate, self.job):
                if candidate not in tried:
                    return candidate
        return None

    def _close(self) -> bool:
        """Whether the best two measured are within their errors."""
        ranked = figures(self.trials)
        return len(ranked) > 1 and not apart(ranked[0], ranked[1])

    def _close_call(self) -> None:
        """Where the best two are within their errors and two trials are left, each once more
        in turn, the runner-up first (their trials pooled); else a note that they are."""
        ranked = figures(self.trials)
        if not self._close():
            return
        if self.trials_at_most - len(self.trials) >= 2 and self.fits(2):
            for figure in (ranked[1], ranked[0]):
                self._trial(figure.candidate)
            ranked = figures(self.trials)
            if not self._close():
                return
        self.notes.append(
            f"{ranked[0].candidate.label} and {ranked[1].candidate.label} are within their "
            "errors: either serves; more trials (--trials) would measure them again"
        )

    def _trial(self, candidate: Candidate) -> None:
        number = len(self.trials) + 1
        label = f"{self.job.label} [tune {self.tune_id[-4:]} #{number}: {candidate.label}]"
        self.say(f"trial {number}: {candidate.label} ...")
        trial = run_trial(self, candidate, label, self.folder / f"trial-{number}.log")
        self.trials.append(trial)
        self.say(f"trial {number}: {candidate.label}: {trial_text(trial)}")
        self.save(RunStatus.RUNNING, None)

    def save(self, status: RunStatus, reason: str | None) -> None:
        chosen = pick(self.trials)
        document = {
            "job": self.job.shown(),
            "batches": self.batches,
            "trials": [t.to_json() for t in self.trials],
            "notes": self.notes,
            "pick": None if chosen is None else asdict(chosen.chosen.candidate),
        }
        with Store(self.db) as store:
            store.save_tune(TuneRecord(self.tune_id, self.job.run_id, self.created, status,
                                       reason, document))  # fmt: skip


def trial_text(trial: Trial) -> str:
    if trial.status == "failed":
        return f"failed: {trial.cause}"
    if trial.images_per_s is None:
        return f"{trial.status}: no batch measured ({trial.cause or 'none'})"
    error = "" if trial.error is None else f" ± {trial.error:,.0f}"
    stopped = " (stopped at its time limit)" if trial.status == "stopped" else ""
    short = f" ({trial.cause})" if trial.cause else ""
    return f"{trial.images_per_s:,.0f}{error} images/s, run {trial.run_id}{stopped}{short}"


def run_trial(tuning: Tuning, candidate: Candidate, label: str, log: Path) -> Trial:
    """Runs the job once with `candidate`; its trial. A trial that cannot start, or whose
    job fails, is a finding with its one-line cause."""
    job = tuning.job
    started = time.monotonic()
    try:
        module = module_for(job, candidate, tuning.folder)
    except (Unmovable, OSError) as error:
        return Trial(candidate, status="failed", cause=str(error).splitlines()[0])
    swap = ["--workers", str(candidate.workers)]
    if module is not None:
        swap = ["--loader", str(module)]
    watch = ["--db", str(tuning.db), "--name", label, "--warmup", str(WARMUP), *swap,
             "--batches", str(tuning.batches)]  # fmt: skip
    if job.site is not None:
        watch += ["--at", job.site]
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])  # this feedscope, for the job
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if job.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = job.cuda_visible_devices
    cores = set(job.cores) & os.sched_getaffinity(0) or os.sched_getaffinity(0)
    with Store(tuning.db) as store:
        before = {run.run_id for run in store.runs()}
    status, interrupted = "measured", False
    with open(log, "wb") as output:
        child = subprocess.Popen(
            job.command(watch), cwd=job.cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),  # noqa: PLW1509 (no threads here)
        )  # fmt: skip
        try:
            code = child.wait(timeout=max(1.0, min(tuning.trial_s, tuning.left_s())))
        except subprocess.TimeoutExpired:
            status = "stopped"
            code = _stop(child)
        except KeyboardInterrupt:
            status, interrupted = "interrupted", True
            code = _stop(child)
    trial = _measured(tuning, Trial(candidate, status=status), label, before)
    trial.seconds = time.monotonic() - started
    if interrupted:
        tuning.trials.append(trial)  # what it measured kept with the session
        raise KeyboardInterrupt
    if code != 0 and status != "stopped":
        trial.status, trial.cause = "failed", _cause(log, code)
        trial.images_per_s = trial.error = None
    elif trial.run_id is None:
        trial.status, trial.cause = "failed", _cause(log, code) if code else (
            "no loader of the job was swapped: it iterated none at "
            f"{job.site or 'the line its run recorded'}")  # fmt: skip
    elif not trial.batches:
        trial.cause = _cause(log, code) if code else "the job iterated no batch of its loader"
    elif trial.batches < tuning.batches and status == "measured":
        trial.cause = f"the job ended after {trial.batches} of the {tuning.batches} batches asked"
    return trial


def _measured(tuning: Tuning, trial: Trial, label: str, before: set[str]) -> Trial:
    """`trial` with the figures of its run: the one this trial made whose loader was swapped
    (the job may iterate another loader first, whose run then holds the plain label)."""
    with Store(tuning.db) as store:
        runs = [
            run for run in store.runs()
            if run.run_id not in before and (run.label or "").split(" (loader ")[0] == label
            and run.config.get("command", {}).get("swapped")
        ]  # fmt: skip
        if runs:
            document = read_run(store, runs[0].run_id)
            trial.run_id = document.run_id
            # per rank: every rank stops at the same batch
            trial.batches = min(lane.figures.batches for lane in document.lanes)
            if trial.batches:
                trial.images_per_s = document.images_per_s
                trial.error = document.images_per_s_error
    return trial


def _stop(child: subprocess.Popen[bytes]) -> int:
    """Stops a trial's job: SIGINT to its first process (the script's, or torchrun, which stops
    its ranks), as Ctrl-C stops a job in a terminal but without reaching its DataLoader workers
    first (a worker that ends before the loop sees its interrupt reads as the loader failing);
    then kills what is left of it after STOP_S (at once on a second Ctrl-C, raised on)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGINT)
    try:
        return child.wait(timeout=STOP_S)
    except BaseException as error:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        code = child.wait()
        if not isinstance(error, subprocess.TimeoutExpired):
            raise
        return code


def _cause(log: Path, code: int) -> str:
    """A failed trial's cause, in one line: the last error line its job printed."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    line = error_line(text)
    return line or f"the job exited with code {code} (its output: {log})"
