"""`probe watch --loader` and `probe tune`: a written module's loader in place of the job's
training loader with no edit to the script, and each candidate measured on the job itself.

The jobs are real scripts run as a user runs them: `tests/data/imagenet_shaped/main.py` (the
ImageNet example's shape, its transforms torchvision's by name, computed with PIL), and a DDP
script under torchrun with 2 gloo ranks. What is asserted is what tune must do whatever the
figures (this 2-core machine moves them): which runs it made, what it swapped, where it stopped,
what it kept, and that its answer is the one its own trials give.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import probe_cli, run_captured, stop_group, torchrun_watch, write_jpeg
from probe.fix.tune import Candidate, Job, Trial, Tuning, apart, figures, pick
from probe.records import RunStatus
from probe.store.db import Store
from probe.store.documents import read_run

ROOT = Path(__file__).resolve().parents[1]
IMAGENET_SHAPED = ROOT / "tests" / "data" / "imagenet_shaped" / "main.py"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIR/train (4 classes of 16) and DIR/val (4 of 2), JPEGs of noise."""
    root = tmp_path_factory.mktemp("tune-data")
    generator = np.random.default_rng(5)
    for split, count in (("train", 16), ("val", 2)):
        for label in range(4):
            for n in range(count):
                pixels = generator.integers(0, 255, (120, 160, 3), dtype=np.uint8)
                write_jpeg(root / split / f"n0{label}" / f"{n:03d}.jpg", pixels)
    return root


def script_args(folder: Path, epochs: int = 40) -> list[str]:
    return [str(folder), "-j", "2", "--epochs", str(epochs), "-b", "8", "-p", "1000"]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> tuple[Path, str]:
    """The imagenet-shaped script watched for 6 epochs of 8 batches: the store and its training
    loader's run."""
    db = tmp_path_factory.mktemp("tune-store") / "store.db"
    done = run_captured(
        [sys.executable, "-m", "probe", "watch", "--db", db, "--", "python", IMAGENET_SHAPED,
         *script_args(folder, epochs=6)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        run = next(r for r in store.runs() if r.label == "main.py")
    return db, run.run_id


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_run_records_what_running_its_job_again_needs(watched: tuple[Path, str]) -> None:
    db, run_id = watched
    with Store(db) as store:
        job = Job.of(read_run(store, run_id))
    assert job.argv[1:] == (str(IMAGENET_SHAPED), *job.argv[2:])
    assert job.cwd and Path(job.cwd).is_dir() and Path(job.python).exists()
    assert set(job.cores) == os.sched_getaffinity(0)
    assert job.ranks == 1 and job.workers == 2 and not job.on_gpu
    assert job.site is not None and job.site.startswith("main.py:")


def test_tune_measures_each_candidate_on_the_job_and_answers_with_its_best(
    tmp_path: Path, watched: tuple[Path, str]
) -> None:
    pytest.importorskip("nvidia.dali")
    db = Path(str(tmp_path / "store.db"))
    db.write_bytes(watched[0].read_bytes())
    before = digest(IMAGENET_SHAPED)
    done = probe_cli("tune", watched[1], "--db", db, "--batches", "40", "--trials", "4")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert digest(IMAGENET_SHAPED) == before  # the script unchanged
    told = done.stderr.splitlines()
    assert told[0].startswith(f"probe tune: runs your job `python {IMAGENET_SHAPED}")
    with Store(db) as store:
        (record,) = store.tunes(watched[1])
        trials = [Trial.from_json(x) for x in record.document["trials"]]
        assert record.status is RunStatus.COMPLETED
        labels = {r.run_id: r.label for r in store.runs()}
        kinds = [t.candidate.kind for t in trials]
        assert kinds[:3] == ["yours", "recipe", "dali"] and len(trials) == 4
        for number, trial in enumerate(trials, 1):
            # each trial a run named after its candidate, stopped after 40 batches of its own
            assert trial.status == "measured" and trial.run_id is not None, trial
            assert str(labels[trial.run_id]).endswith(f"#{number}: {trial.candidate.label}]")
            document = read_run(store, str(trial.run_id))
            assert document.status == RunStatus.COMPLETED.value
            assert document.lanes[0].figures.batches == 40
            assert document.config["command"]["swapped"]["batches"] == 40
        dali = read_run(store, str(trials[2].run_id))
        assert dali.pipeline == "dali"  # the module's DALI iterator was what the job iterated
    answer = pick(trials)
    assert answer is not None
    best = figures(trials)[0]
    if answer.change:  # the fastest, beyond the errors of the job's own
        assert answer.chosen == best and answer.yours is not None and apart(best, answer.yours)
        command = best.candidate.migrate(watched[1])
        assert (
            command is None or f"write it: `{command}`" in done.stdout + done.stderr + done.stderr
        )
    else:
        assert (
            f"answer: no change: your loader measured {answer.chosen.text()}"
            in done.stdout + done.stderr
        )
    yours = answer.yours
    dali_wins = best.candidate.kind == "dali" and yours is not None and apart(best, yours)
    if dali_wins and yours is not None and best.images_per_s >= 1.3 * yours.images_per_s:
        assert "answer: DALI" in done.stdout + done.stderr + done.stderr
    # probe migrate takes the setting tune measured on the job
    written = probe_cli("migrate", watched[1], "--db", db, "-o", str(tmp_path / "dali_m.py"))
    assert written.returncode == 0, written.stderr
    best_dali = next(f for f in figures(trials) if f.candidate.kind == "dali")
    assert f"tune session {record.tune_id}, measured on the job itself" in written.stderr
    assert f"{best_dali.candidate.threads} DALI thread" in written.stderr


MARKER = '''
"""A loader module for the test: batches whose labels are all 99."""
import torch

class Loader:
    def __init__(self, original):
        self.original = original
    def __len__(self):
        return len(self.original)
    def __iter__(self):
        for images, labels in self.original:
            yield images, torch.full_like(labels, 99)

def loader(original=None):
    return Loader(original)
'''

DDP = '''
"""A DDP job on the CPU: each step all-reduces, as DDP's backward does; each rank writes the
labels it was given to OUT/rankR.json."""
import json, os, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
sys.path.insert(0, {tests!r})
import fake_torchvision as tv

dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = tv.ImageFolder({train!r}, tv.validation(40, 32))
sampler = DistributedSampler(dataset, shuffle=True, seed=3)
train_loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=1)
seen = []
for epoch in range(int(sys.argv[1])):
    sampler.set_epoch(epoch)
    for images, labels in train_loader:
        total = images.float().mean().reshape(1)
        dist.all_reduce(total)
        seen.append(labels.tolist())
        with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as f:
            json.dump(seen, f)
'''


def ddp_script(tmp_path: Path, folder: Path) -> Path:
    script = tmp_path / "ddp.py"
    out = tmp_path / "out"
    out.mkdir()
    script.write_text(DDP.format(tests=str(ROOT / "tests"), train=str(folder / "train"),
                                 out=str(out)))  # fmt: skip
    return script


def test_under_torchrun_every_rank_is_swapped_and_stops_at_the_same_batch(
    tmp_path: Path, folder: Path
) -> None:
    script = ddp_script(tmp_path, folder)
    (tmp_path / "marker.py").write_text(MARKER)
    db = tmp_path / "store.db"
    done = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "probe", "watch", "--db", db, "--sample-hz", "5", "--warmup", "2",
         "--loader", tmp_path / "marker.py", "--batches", "11", "--", script, "50"],
        timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert len(seen) == 2 + 11  # the warm-up and the batches asked, then the job ended
        assert {label for batch in seen for label in batch} == {99}  # every batch swapped
    with Store(db) as store:
        run = next(r for r in store.runs() if r.label == "ddp.py")
        document = read_run(store, run.run_id)
    assert document.status == RunStatus.COMPLETED.value
    assert [lane.figures.batches for lane in document.lanes] == [11, 11]
    assert document.config["command"]["nproc_per_node"] == 2


def test_tune_runs_a_torchrun_job_again_with_its_ranks(tmp_path: Path, folder: Path) -> None:
    script = ddp_script(tmp_path, folder)
    db = tmp_path / "store.db"
    done = torchrun_watch(script, db, "2")
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        run_id = next(r for r in store.runs() if r.label == "ddp.py").run_id
    (tmp_path / "out" / "rank0.json").unlink()
    tuned = probe_cli("tune", run_id, "--db", db, "--batches", "10", "--trials", "2", timeout=300)
    assert tuned.returncode == 0, tuned.stderr
    assert "torchrun --nproc-per-node=2 " in tuned.stderr.splitlines()[0]
    with Store(db) as store:
        (record,) = store.tunes(run_id)
        for data in record.document["trials"]:
            trial = Trial.from_json(data)
            assert trial.status == "measured", trial
            lanes = read_run(store, str(trial.run_id)).lanes
            assert [lane.figures.batches for lane in lanes] == [10, 10]


def test_watch_loader_gives_the_batches_of_the_module_imported_by_hand(
    tmp_path: Path, folder: Path
) -> None:
    """A module written for a loader without randomness (no shuffle, the validation chain)."""
    pytest.importorskip("nvidia.dali")
    script = tmp_path / "val.py"
    script.write_text(
        textwrap.dedent(f"""\
        import json, sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import fake_torchvision as tv
        from torch.utils.data import DataLoader
        dataset = tv.ImageFolder({str(folder / "train")!r}, tv.validation(40, 32))
        train_loader = DataLoader(dataset, batch_size=8, shuffle=False, num_workers=0)
        sums = [[round(float(images.double().sum()), 1), labels.tolist()]
                for images, labels in train_loader]
        json.dump(sums, open(sys.argv[1], "w"))
    """)
    )
    db = tmp_path / "store.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = run_captured([sys.executable, "-m", "probe", "watch", "--db", db, "--", script,
                          tmp_path / "own.json"], env=env, cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    with Store(db) as store:
        run_id = store.runs()[0].run_id
    for to in ("dali", "dataloader"):
        module = tmp_path / f"{to}_loader.py"
        wrote = probe_cli("migrate", run_id, "--db", db, "--to", to, "-o", module)
        assert wrote.returncode == 0, wrote.stderr
        swapped = run_captured([sys.executable, "-m", "probe", "watch", "--db", db, "--loader",
                                module, "--", script, tmp_path / f"{to}.json"], env=env,
                               cwd=tmp_path)  # fmt: skip
        assert swapped.returncode == 0, swapped.stderr
        by_hand = run_captured([sys.executable, "-c", textwrap.dedent(f"""\
            import importlib.util, json, sys
            spec = importlib.util.spec_from_file_location("m", {str(module)!r})
            m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
            sums = [[round(float(images.double().sum()), 1), labels.tolist()]
                    for images, labels in m.loader()]
            json.dump(sums, open({str(tmp_path / "hand.json")!r}, "w"))
        """)], env=env, cwd=tmp_path)  # fmt: skip
        assert by_hand.returncode == 0, by_hand.stderr
        got = json.loads((tmp_path / f"{to}.json").read_text())
        assert got == json.loads((tmp_path / "hand.json").read_text())
        assert len(got) == 8 and got[0][1] == [0] * 8


def test_a_failing_trial_is_one_line_and_the_next_one_runs(
    tmp_path: Path, watched: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from probe.fix import tune

    db = Path(str(tmp_path / "store.db"))
    db.write_bytes(watched[0].read_bytes())
    broken = tmp_path / "broken.py"
    broken.write_text("def loader(original=None):\n    raise RuntimeError('no such files')\n")
    real = tune.module_for
    monkeypatch.setattr(tune, "module_for", lambda job, candidate, folder: (
        broken if candidate.kind == "recipe" else real(job, candidate, folder)))  # fmt: skip
    monkeypatch.setattr(tune, "starts", lambda job, store: [
        Candidate("recipe", workers=1), Candidate("yours", workers=1)])  # fmt: skip
    said: list[str] = []
    with Store(db) as store:
        job = Job.of(read_run(store, watched[1]))
    tuning = Tuning(job, db, tmp_path, "tune-test-0000", batches=10, trials_at_most=2,
                    say=said.append)  # fmt: skip
    tuning.run()
    failed, measured = tuning.trials
    assert failed.status == "failed" and failed.images_per_s is None
    assert failed.cause == "RuntimeError: no such files", failed.cause
    assert "trial 1: recipe, num_workers=1: failed: RuntimeError: no such files" in said
    assert measured.status == "measured" and measured.batches == 10


def test_ctrl_c_ends_the_job_and_tune_and_keeps_what_was_measured(
    tmp_path: Path, watched: tuple[Path, str]
) -> None:
    db = Path(str(tmp_path / "store.db"))
    db.write_bytes(watched[0].read_bytes())
    with sqlite3.connect(db) as raw:  # the job made long: its first trial is under way then
        (text,) = raw.execute("SELECT config FROM runs WHERE run_id = ?", (watched[1],)).fetchone()
        config = json.loads(text)
        argv = config["command"]["argv"]
        argv[argv.index("--epochs") + 1] = "400"
        raw.execute("UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), watched[1]))
    tune = subprocess.Popen(
        [sys.executable, "-m", "probe", "tune", watched[1], "--db", str(db), "--batches", "5000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        batches = 0
        while batches < 10 and time.monotonic() < deadline:  # the first trial under way
            time.sleep(0.5)
            with Store(db) as store:
                runs = [r for r in store.runs() if "[tune" in (r.label or "")]
                batches = len(store.batches(runs[0].run_id, 0)) if runs else 0
        assert batches >= 10
        os.killpg(tune.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches every process
        _, stderr = tune.communicate(timeout=30)
    finally:
        if tune.poll() is None:
            stop_group(tune)
    assert tune.returncode == 130, stderr
    assert "interrupted:" in stderr and "Traceback" not in stderr
    with Store(db) as store:
        (record,) = store.tunes(watched[1])
        assert record.status is RunStatus.INTERRUPTED
        (run,) = [r for r in store.runs() if "[tune" in (r.label or "") and "(loader" not in
                  (r.label or "")]  # fmt: skip
        assert run.status is RunStatus.INTERRUPTED
        assert len(store.batches(run.run_id, 0)) >= 10  # what it measured kept
    alive = subprocess.run(["pgrep", "-f", str(IMAGENET_SHAPED)], capture_output=True, text=True,
                           check=False)  # fmt: skip
    assert alive.stdout.strip() == ""  # the job ended with tune


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (None, "recorded no command to run again (watched by watch() in its code"),
        ({"nnodes": 2}, "ran on 2 nodes: probe tune runs a job again on one node"),
        ({"cwd": "/no/such/folder"}, "the job's folder /no/such/folder is not there"),
    ],
)
def test_a_job_tune_cannot_run_again_is_refused_in_one_line(
    tmp_path: Path, watched: tuple[Path, str], command: dict[str, object] | None, said: str
) -> None:
    db = Path(str(tmp_path / "store.db"))
    db.write_bytes(watched[0].read_bytes())
    with sqlite3.connect(db) as raw:
        (text,) = raw.execute("SELECT config FROM runs WHERE run_id = ?", (watched[1],)).fetchone()
        config = json.loads(text)
        if command is None:
            del config["command"]
        else:
            config["command"].update(command)
        raw.execute("UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), watched[1]))
    done = probe_cli("tune", watched[1], "--db", db)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and said in line, line
    with Store(db) as store:
        assert store.tunes() == []  # nothing started


def test_a_swap_that_finds_no_loader_at_its_line_is_an_error(tmp_path: Path, folder: Path) -> None:
    (tmp_path / "marker.py").write_text(MARKER)
    done = run_captured(
        [sys.executable, "-m", "probe", "watch", "--db", tmp_path / "store.db", "--loader",
         tmp_path / "marker.py", "--at", "main.py:1", "--batches", "5", "--", "python",
         IMAGENET_SHAPED, *script_args(folder, epochs=1)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    said = "error: nothing was swapped: the job iterated no loader at main.py:1"
    assert said in done.stderr.splitlines() and "Traceback" not in done.stderr


def test_migrate_offers_the_job_with_the_module_before_a_line_changes(
    tmp_path: Path, watched: tuple[Path, str]
) -> None:
    db = Path(str(tmp_path / "store.db"))
    db.write_bytes(watched[0].read_bytes())
    module = tmp_path / "torch_x.py"
    done = probe_cli("migrate", watched[1], "--db", db, "--to", "dataloader", "-o", module)
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        argv = store.run(watched[1]).config["command"]["argv"]
    said = done.stderr.strip().splitlines()[-1]
    assert said == (
        f"try it on the job before a line changes: `probe watch --loader {module} -- "
        f"{' '.join(argv)}`"
    )
