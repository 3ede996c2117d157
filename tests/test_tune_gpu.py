"""`probe tune` on 2 H200s, read from the stores the lease recorded
(tests/benchmarks/results/2026-11-28-tune, `tune_gpu.sh`): pytorch/examples' ImageNet script on
one GPU held to 4 cores, and a DDP script on both GPUs sharing 8 cores. Each was tuned (6
trials), then settings of the migrated script were run for 3 epochs each under `probe watch`.
And tune's search, replayed on the first job's recorded figures."""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from helpers import probe_cli
from probe.fix import tune
from probe.fix.tune import Candidate, Job, Trial, Tuning, figures, pick
from probe.store.db import Store
from probe.store.documents import read_run

LEASE = Path(__file__).parent / "benchmarks" / "results" / "2026-11-28-tune"


def stored(tmp_path: Path, case: str) -> Path:
    return Path(shutil.copy(LEASE / f"feedscope-{case}.db", tmp_path / "store.db"))


def trials_of(store: Store) -> tuple[dict, list[Trial]]:  # type: ignore[type-arg]
    (record,) = store.tunes()
    return record.document, [Trial.from_json(x) for x in record.document["trials"]]


def training_run(store: Store, label: str) -> str:
    """The training loader (the most batches) of the newest process watched as `label`."""
    newest = next(r for r in store.runs() if (r.label or "").split(" (loader ")[0] == label)
    return store.loaders(newest)[0].run_id


@pytest.mark.parametrize(("case", "lanes"), [("one", 1), ("ddp", 2)])
def test_each_trial_was_the_job_with_its_candidate_and_the_answer_is_its_best(
    tmp_path: Path, case: str, lanes: int
) -> None:
    with Store(stored(tmp_path, case)) as store:
        document, trials = trials_of(store)
        assert len(trials) == 6 and trials[0].candidate.kind == "yours"
        for trial in trials:
            run = read_run(store, str(trial.run_id))
            # every rank swapped, and stopped after 5 + 200 batches
            assert run.config["command"]["swapped"]["batches"] == 200
            assert [lane.figures.batches for lane in run.lanes] == [200] * lanes
            assert [lane.figures.warmup_batches for lane in run.lanes] == [5] * lanes
            assert trial.images_per_s == run.images_per_s
        answer = pick(trials)
        assert answer is not None and answer.change
        assert asdict(answer.chosen.candidate) == document["pick"]
        assert answer.chosen.candidate.kind == "dali"
        # the pick written by `probe migrate` and run for 3 epochs: tune's figure within 5%
        verified = read_run(store, training_run(store, "verify-pick")).images_per_s
        assert abs(answer.chosen.images_per_s / verified - 1) <= 0.05, (answer, verified)
    wall = (LEASE / "wall.txt").read_text()
    (seconds,) = re.findall(rf"^{case} tune ([\d.]+) s$", wall, re.MULTILINE)
    assert float(seconds) <= 300  # 6 trials in at most 5 minutes


def test_the_pick_and_the_fastest_setting_run_by_hand_are_one_spread_apart(
    tmp_path: Path,
) -> None:
    """On the first job the best 3-epoch run was DALI 2 x 1.0 at 1,193 images/s, 11% above the
    pick (2 x 0.9). Run again in turn, twice each, the two settings' means lie within 5%: one
    setting's runs spread more than the settings differ."""
    with Store(stored(tmp_path, "one")) as store:
        runs = {
            name: [read_run(store, training_run(store, f"alt-{name}-{i}")).images_per_s
                   for i in (1, 2)]
            for name in ("dali_t2_s100", "dali_t2_s90")
        }  # fmt: skip
        runs["dali_t2_s100"].append(read_run(store, training_run(store, "verify-dali-t2-s1.0"))
                                    .images_per_s)  # fmt: skip
        runs["dali_t2_s90"].append(read_run(store, training_run(store, "verify-pick")).images_per_s)
    means = {name: sum(rates) / len(rates) for name, rates in runs.items()}
    assert abs(means["dali_t2_s90"] / means["dali_t2_s100"] - 1) <= 0.05, means
    spread = max(runs["dali_t2_s100"]) / min(runs["dali_t2_s100"]) - 1
    assert spread > 0.15, runs  # 940 to 1,193: more than the gaps tune saw between settings


def test_the_search_replayed_on_the_recorded_figures_alternates_the_close_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial answered with the figure the H200 measured for its candidate: the job's own,
    the recipe, DALI at 2 threads x share 1.0, then its nearest setting (0.9); those two within
    their errors with two trials left, each is run once more, the runner-up first."""
    with Store(stored(tmp_path, "one")) as store:
        _, recorded = trials_of(store)
        job = Job.of(read_run(store, store.tunes()[0].run_id))
    measured = {t.candidate: t for t in recorded}
    asked: list[Candidate] = []

    def replayed(tuning: Tuning, candidate: Candidate, label: str, log: Path) -> Trial:
        asked.append(candidate)
        return measured[candidate]

    monkeypatch.setattr(tune, "run_trial", replayed)
    monkeypatch.setattr(Tuning, "save", lambda self, status, reason: None)
    tuning = Tuning(job, tmp_path / "store.db", tmp_path, "tune-replay-0000", say=lambda _: None)
    answer = tuning.run()
    twice, nearest = (
        Candidate("dali", threads=2, share=1.0),
        Candidate("dali", threads=2, share=0.9),
    )
    assert asked == [Candidate("yours", workers=4), Candidate("recipe", workers=4), twice,
                     nearest, twice, nearest]  # fmt: skip
    assert answer is not None and answer.chosen.candidate in (twice, nearest)
    pooled = {f.candidate: f for f in figures(tuning.trials)}
    assert len(pooled[nearest].run_ids) == 2
    assert any("within their errors: either serves" in note for note in tuning.notes)


def test_on_the_ddp_job_the_pick_and_the_fastest_setting_are_one_spread_apart(
    tmp_path: Path,
) -> None:
    """On the DDP job the best 3-epoch run was DALI 3 x 0.9 at 3,356 images/s, 5.7% above the
    pick (4 x 1.0). The two settings run again in turn, twice each, with `probe watch --loader`
    (`alternate_dali.sh`): their means over three runs lie within 5%."""
    path = Path(shutil.copy(LEASE / "ddp-alternation" / "feedscope.db", tmp_path / "store.db"))
    with Store(path) as store:
        runs = {
            setting: [read_run(store, training_run(store, f"alt-{setting}-{i}")).images_per_s
                      for i in (1, 2)]
            for setting in ("t4-s1.0", "t3-s0.9")
        }  # fmt: skip
        runs["t4-s1.0"].append(read_run(store, training_run(store, "verify-pick")).images_per_s)
        runs["t3-s0.9"].append(
            read_run(store, training_run(store, "verify-dali-t3-s0.9")).images_per_s
        )
        (record,) = store.tunes()
        assert record.document["pick"] == {"kind": "dali", "workers": None, "threads": 4,
                                           "share": 1.0}  # fmt: skip
    means = {setting: sum(rates) / len(rates) for setting, rates in runs.items()}
    assert abs(means["t4-s1.0"] / means["t3-s0.9"] - 1) <= 0.05, (means, runs)


def test_a_budget_starts_no_trial_the_trials_so_far_say_would_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job's trials replayed on a clock that moves by each trial's recorded seconds
    (45.7, 35.2, 33.0): with --budget 150, a fourth (about 38 s) would pass it."""
    with Store(stored(tmp_path, "one")) as store:
        _, recorded = trials_of(store)
        job = Job.of(read_run(store, store.tunes()[0].run_id))
    measured = {t.candidate: t for t in recorded}
    clock = [0.0]

    def replayed(tuning: Tuning, candidate: Candidate, label: str, log: Path) -> Trial:
        clock[0] += measured[candidate].seconds
        return measured[candidate]

    monkeypatch.setattr(tune, "run_trial", replayed)
    monkeypatch.setattr("probe.fix.tune.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(Tuning, "save", lambda self, status, reason: None)
    tuning = Tuning(job, tmp_path / "store.db", tmp_path, "tune-replay-0001", budget_s=150,
                    say=lambda _: None)  # fmt: skip
    tuning.run()
    assert len(tuning.trials) == 3 and clock[0] == pytest.approx(113.9, abs=0.05)
    assert any(
        note.startswith("the budget (150 s) left no time for another trial (each took about 38 s)")
        for note in tuning.notes
    ), tuning.notes


def test_a_tuned_run_is_quoted_with_its_figures_and_offered_tune_no_more(tmp_path: Path) -> None:
    """After `probe tune RUN`, `probe show RUN` quotes what the tune session measured on the job
    itself, its best against the job's own loader, and offers `probe tune` no more."""
    db = stored(tmp_path, "one")
    with Store(db) as store:
        _, trials = trials_of(store)
        (record,) = store.tunes()
        best = figures(trials)[0]
    shown = probe_cli("show", record.run_id, "--db", db)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stderr.split())
    assert f"tune session {record.tune_id}" in text, text
    assert f"{best.candidate.label}, {best.text()}" in text
    assert f"`probe tune {record.run_id}`" not in text
