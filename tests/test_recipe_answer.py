"""feedscope's DataLoader recipe as a watched job's answer, on the runs recorded on the 2-core CPU
machine (tests/benchmarks/results/2026-11-28-recipe): an ImageNet-shaped script with 2 workers,
watched (99.3 ± 2.8 images/s, 19.9 ms of CPU an image), then `probe doctor --like` it (feedscope's
DataLoader: 11.4 ms an image), then the script with the module `probe migrate --to dataloader`
wrote (164.0 ± 5.7 images/s, 6.3% below the 175.0 predicted)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from probe.judge import recipe as recipe_module
from probe.judge.changes import Knob
from probe.judge.diagnosis import diagnose_run
from probe.judge.results import read_session
from probe.present.like_run import like_told
from probe.present.offer import migrate_offer
from probe.store.db import Store
from probe.store.documents import read_run

RESULTS = Path(__file__).parent / "benchmarks" / "results" / "2026-11-28-recipe"
ORIGINAL = "20261128-073710-345f"  # the script as it was
DOCTOR = "doctor-20261128-073737-2bb7"  # probe doctor --like ORIGINAL
RECIPE = "20261128-073830-42b9"  # the script with the written recipe


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A copy of the recorded store (commands may write to the store they open)."""
    return Path(shutil.copy(RESULTS / "feedscope.db", tmp_path / "feedscope.db"))


def with_recipe_changed(db: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """The watched run's recorded recipe, changed by `change`."""
    with sqlite3.connect(db) as connection:
        (text,) = connection.execute(
            "SELECT config FROM runs WHERE run_id = ?", (ORIGINAL,)
        ).fetchone()
        config = json.loads(text)
        change(config["spec"]["recipe"])
        connection.execute(
            "UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), ORIGINAL)
        )


def without_sessions(db: Path) -> Path:
    with sqlite3.connect(db) as connection:
        connection.execute("DELETE FROM sessions")
    return db


def test_the_answer_names_the_recipe_at_the_figure_measured_like_the_job(recorded: Path) -> None:
    with Store(recorded) as store:
        first = diagnose_run(store, ORIGINAL).recommendations[0]
        epochs = read_session(store, DOCTOR).epochs
        offer = migrate_offer(read_run(store, ORIGINAL), [first])
        measured = read_run(store, RECIPE).lanes[0].figures
    assert epochs is not None and epochs.images_per_s is not None
    assert first.change.knob is Knob.RECIPE and first.setting == (
        "feedscope's DataLoader recipe num_workers=2"
    )
    # the doctor's epoch-by-epoch reading of its best setting: a job's for loop reads so
    assert first.predicted_images_per_s == epochs.images_per_s
    assert first.predicted_error == epochs.images_per_s_error
    assert (
        f"doctor session {DOCTOR} (measured like this run, on a stand-in for its step), read "
        "epoch by epoch" in first.basis
    )
    assert "of CPU an image on the job's files, where this loader costs 19.86 ms" in first.basis
    assert offer is not None and offer.command == (
        f"probe migrate {ORIGINAL} --to dataloader -o torch_train_loader.py"
    )
    assert "`train_loader = torch_train_loader.loader()`" in offer.change
    # and the job bore it out: within 10% of the prediction, 1.4x the job's own loader
    assert abs(measured.images_per_s / first.predicted_images_per_s - 1) < 0.10
    assert measured.images_per_s > 1.4 * 99.0


def test_the_doctor_says_its_dataloader_was_the_recipe(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    like_told(recorded, ORIGINAL)
    said = capsys.readouterr().err
    assert f"the DataLoader measured here is feedscope's recipe, not run {ORIGINAL}'s own" in said
    assert f"`probe migrate {ORIGINAL} --to dataloader` writes it" in said


def test_before_the_doctor_the_recipe_is_named_with_what_measures_it(
    recorded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not predicted: after DALI's (not predicted either) where DALI is installed here, first
    where it is not."""
    without_sessions(recorded)
    with Store(recorded) as store:
        answer = diagnose_run(store, ORIGINAL).recommendations
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
        without_dali = diagnose_run(store, ORIGINAL).recommendations
    knobs = [r.change.knob for r in answer]
    assert knobs == [Knob.PIPELINE, Knob.RECIPE]
    recipe = answer[1]
    assert recipe.predicted_images_per_s is None
    assert f"`probe doctor --like {ORIGINAL}` measures it on the job's files" in recipe.basis
    assert [r.change.knob for r in without_dali] == [Knob.RECIPE, Knob.PIPELINE]


def test_the_recipe_is_no_answer_where_it_costs_as_much_as_the_loader(
    recorded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recipe_module, "RECIPE_WORTH_IT", 19.86 / 11.43 + 0.01)
    with Store(recorded) as store:
        answer = diagnose_run(store, ORIGINAL).recommendations
    assert Knob.RECIPE not in [r.change.knob for r in answer]


def test_migrate_to_dataloader_writes_the_recipe_with_the_measured_workers(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "torch_train.py"
    done = probe_cli("migrate", ORIGINAL, "--to", "dataloader", "-o", str(out), "--db",
                     str(recorded))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"2 workers, kept between epochs (doctor session {DOCTOR}" in done.stderr
    assert "read epoch by epoch" in done.stderr
    assert "`train_loader = torch_train.loader()`" in done.stderr
    text = out.read_text()
    assert "\nNUM_WORKERS = 2\n" in text and "\nHANDOVER = 'uint8'" in text
    assert "\nKEPT = 0" in text and "\nREDUCED = True" in text

    for flags, said in (
        (["--to", "dataloader", "--threads", "4"], "--to dataloader takes --workers"),
        (["--workers", "3"], "--workers sets the DataLoader"),
    ):
        refused = probe_cli("migrate", ORIGINAL, *flags, "-o", str(tmp_path / "x.py"),
                            "--db", str(recorded))  # fmt: skip
        assert refused.returncode == 2 and said in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    given = probe_cli("migrate", ORIGINAL, "--to", "dataloader", "--workers", "3", "-o",
                      str(tmp_path / "three.py"), "--db", str(recorded))  # fmt: skip
    assert given.returncode == 0 and "given on the command line" in given.stderr
    assert "\nNUM_WORKERS = 3\n" in (tmp_path / "three.py").read_text()


def test_a_recipe_it_cannot_write_is_no_answer(recorded: Path) -> None:
    with_recipe_changed(recorded, lambda recipe: recipe.update(collate_fn="my_collate"))
    with Store(recorded) as store:
        answer = diagnose_run(store, ORIGINAL).recommendations
    assert Knob.RECIPE not in [r.change.knob for r in answer]


def test_a_step_kept_as_the_jobs_own_leaves_the_recipe_not_predicted(recorded: Path) -> None:
    def blurred(recipe: dict[str, Any]) -> None:
        recipe["transform"].insert(2, {"name": "GaussianBlur", "fields": {"sigma": [0.1, 2.0]}})

    with_recipe_changed(recorded, blurred)
    with Store(recorded) as store:
        (recipe,) = [
            r for r in diagnose_run(store, ORIGINAL).recommendations if r.change.knob is Knob.RECIPE
        ]
    assert recipe.predicted_images_per_s is None
    assert "not predicted: the written loader keeps GaussianBlur as the job's own" in recipe.basis
