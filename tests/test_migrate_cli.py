"""`probe migrate RUN`: a watched DataLoader written for DALI from what its run recorded, with
the DALI setting measured for the job; what it refuses; where it is offered. And the stand-in
for a watched step (`sleep:MS@SM%`) that `probe doctor --like` measures DALI beside, on the
points recorded on one H100 (tests/benchmarks/results/2026-11-27-migrate)."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import fake_torchvision as tv
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from helpers import imported, probe_cli, run_captured, written_module
from pipelines import InputError
from probe import watch
from probe.fix.setting import setting_for
from probe.judge.diagnosis import diagnose_run
from probe.lane_figures import lane_figures
from probe.measure.consumers import ConsumerKind, consumer_note, parse_consumer
from probe.present.offer import migrate_offer
from probe.present.options import stand_in
from probe.records import BatchEvent, GpuSample, RunStatus, SessionRecord
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store, read_run

RESULTS = Path(__file__).parent / "benchmarks" / "results"
LEASE = RESULTS / "2026-11-27-migrate" / "lease1"
WATCHED = "20261127-221443-8247"  # pytorch/examples' script, 16 workers: the training loader
WATCHED_VAL = "20261127-221453-9d71"  # its validation loader
MIGRATED = "20261127-221656-9121"  # the same script with the written DALI loaders
LIKE_DOCTOR = RESULTS / "2026-11-27-watch-cases" / "like" / "like" / "doctor.json"


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """A copy of the H100 lease's store (the command may write to the store it opens)."""
    return Path(shutil.copy(LEASE / "feedscope.db", tmp_path / "feedscope.db"))


def folder(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    """Small JPEGs of gradients in class folders."""
    y, x = np.mgrid[0:48, 0:64]
    for label in range(classes):
        (root / f"c{label}").mkdir(parents=True)
        for n in range(per_class):
            pixels = np.stack([x * 4, y * 5, np.full_like(x, 40 * label + 10 * n)], axis=-1)
            Image.fromarray(pixels.astype(np.uint8)).save(root / f"c{label}" / f"{n}.jpg")
    return root


def watched(tmp_path: Path, transform: Any) -> tuple[Path, str, tv.ImageFolder]:
    """A DataLoader over an ImageFolder, watched for one epoch: the store and its run."""
    dataset = tv.ImageFolder(str(folder(tmp_path / "data")), transform=transform)
    train_loader = DataLoader(dataset, batch_size=2, shuffle=True, num_workers=0)
    db = tmp_path / "store.db"
    with watch(train_loader, name="train.py", db=db, warmup=1, answer=False) as batches:
        for _images, _labels in batches:
            pass
    with Store(db) as store:
        return db, store.runs()[0].run_id, dataset


def test_a_watched_loader_is_written_for_dali_and_its_one_line_named(tmp_path: Path) -> None:
    chain = tv.Compose([tv.Resize(40), tv.CenterCrop(32), tv.ToTensor(),
                        tv.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])  # fmt: skip
    db, run, dataset = watched(tmp_path, chain)
    out = tmp_path / "dali_train_loader.py"
    done = run_captured([sys.executable, "-m", "probe", "migrate", run, "--db", db], cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # written under the loader's name, here
    assert "`train_loader = dali_train_loader.loader()`" in done.stderr  # the loop's own name
    again = probe_cli("migrate", run, "-o", str(out), "--db", str(db))
    assert again.returncode == 2 and "is there already" in again.stderr
    assert "DALI's defaults, not measured for this job" in done.stderr

    module = imported(out)
    loader = module.loader(device="cpu")
    labels: Counter[int] = Counter()
    for images, batch_labels in loader:
        assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (3, 32, 32)
        labels.update(batch_labels.tolist())
    assert len(loader) == 3
    assert labels == Counter(label for _, label in dataset.samples)


def test_a_transform_dali_cannot_follow_is_refused_and_nothing_written(tmp_path: Path) -> None:
    def grey(image: Image.Image) -> Image.Image:
        return image.convert("L").convert("RGB")

    chain = tv.Compose([tv.Resize(40), tv.GaussianBlur([5, 5], (0.1, 2.0)), grey, tv.ToTensor()])
    db, run, _ = watched(tmp_path, chain)
    out = tmp_path / "dali_train.py"
    done = probe_cli("migrate", run, "-o", str(out), "--db", str(db))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    named = [line for line in done.stderr.splitlines() if "GaussianBlur" in line or "grey" in line]
    assert len(named) == 2, done.stderr  # one line each
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_what_is_no_watched_dataloader_is_refused(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "dali.py"
    done = probe_cli("migrate", MIGRATED, "-o", str(out), "--db", str(recorded))
    assert done.returncode == 2 and "watched a dali loader" in done.stderr
    done = probe_cli("migrate", "nosuchrun", "-o", str(out), "--db", str(recorded))
    assert done.returncode == 2 and "no run 'nosuchrun'" in done.stderr
    for name in ("dali.txt", "dali-train.py"):
        done = probe_cli("migrate", WATCHED, "-o", str(tmp_path / name), "--db", str(recorded))
        assert done.returncode == 2 and "a Python name ending in .py" in done.stderr
    assert not out.exists()


def _doctor(store: Store, like: str | None) -> None:
    """The doctor session measured like run 20261127-053256-1c2f on one H200 (its DALI point:
    11 threads, share 0.65, 2,861 images/s), saved as measured like `like`."""
    document = json.loads(LIKE_DOCTOR.read_text())
    if like is not None:
        document["like"] = like
    store.save_session(SessionRecord(
        session_id=document["session_id"], kind="doctor", created=document["created"],
        status=RunStatus.COMPLETED, reason=None, hostname="h200", pid=None, document=document,
    ))  # fmt: skip


def test_the_module_takes_the_setting_measured_like_the_job(recorded: Path) -> None:
    with Store(recorded) as store:
        document = read_run(store, WATCHED)
        default = setting_for(store, document)
        assert (default.num_threads, default.hw_decoder_load) == (8, 0.65)
        assert "not measured for this job" in default.source
        _doctor(store, like="20261127-000000-0000")  # measured like another job: not this one's
        assert setting_for(store, document).source == default.source
        _doctor(store, like=WATCHED)
        setting = setting_for(store, document)
        assert (setting.num_threads, setting.hw_decoder_load, setting.decoder) == (
            11,
            0.65,
            "mixed",
        )
        # its figure the one the answer weighed, its runs in alternation pooled (2,861 was its
        # search's run), and no "per GPU" on the job's one GPU
        assert (
            "doctor-20261127-053958-99f9, measured like this run, on a stand-in for its step: "
            "2,921 ± 32 images/s (the mean of its 3 runs in alternation)" in setting.source
        )
        assert "per GPU" not in setting.source
        validation = setting_for(store, read_run(store, WATCHED_VAL))  # the same job's
        assert validation.num_threads == 11
        assert (
            f"measured like run {WATCHED}, this job's other loader, on a stand-in for its step"
            in validation.source
        )
        given = setting_for(store, document, threads=4, hw_decoder_load=0.9)
        assert (given.num_threads, given.hw_decoder_load) == (4, 0.9)
        assert "given on the command line" in given.source


def test_a_session_like_one_loader_is_the_what_if_of_that_loader_alone(recorded: Path) -> None:
    """A doctor session measured like the training loader quotes its figures on that loader's
    page, not on the validation loader's (another batch size and transforms): there the move
    to DALI stays an estimate, and `probe doctor --like` on the validation loader itself stays
    offered, in its basis and on its page alike."""
    with Store(recorded) as store:
        _doctor(store, like=WATCHED)
        train, val = diagnose_run(store, WATCHED), diagnose_run(store, WATCHED_VAL)
    assert train.what_if is not None and "measured like this run" in train.what_if
    assert val.what_if is None
    every = [*val.recommendations, *val.asides]
    assert any(f"probe doctor --like {WATCHED_VAL}" in item.basis for item in every), every


def test_migrate_is_offered_where_dali_is_the_answer_with_the_line_to_change(
    recorded: Path,
) -> None:
    with Store(recorded) as store:
        offers = {}
        for run in (WATCHED, WATCHED_VAL, MIGRATED):
            diagnosis = diagnose_run(store, run)
            offers[run] = migrate_offer(read_run(store, run), diagnosis.recommendations)
    train, val = offers[WATCHED], offers[WATCHED_VAL]
    assert train is not None and val is not None
    assert train.command == f"probe migrate {WATCHED} -o dali_train_loader.py"
    assert "`train_loader = dali_train_loader.loader()`" in train.change
    assert "iterated at imagenet_main.py:327" in train.change
    # its name where the script makes it, not `loader` in the function it is passed to
    assert val.command == f"probe migrate {WATCHED_VAL} -o dali_val_loader.py"
    assert "`val_loader = dali_val_loader.loader()`" in val.change
    assert offers[MIGRATED] is None  # already DALI
    shown = probe_cli("show", WATCHED, "--db", str(recorded))
    assert shown.returncode == 0 and f"probe migrate {WATCHED}" in shown.stderr


def test_a_watched_steps_sm_share_from_its_recorded_rows(recorded: Path) -> None:
    """On the H100, the DataLoader job's step (30.2 ms) held the SMs 52% of its time: 5% of
    the wall time, most of it data-wait; with DALI, 21.2 ms at 75% (DALI's kernels in it)."""
    with Store(recorded) as store:
        for run, low, high in ((WATCHED, 48, 57), (MIGRATED, 70, 80)):
            record = store.run(run)
            figures = lane_figures_from_store(store, record, store.lanes(run)[0])
            assert figures.step_sm_active_pct is not None
            assert low < figures.step_sm_active_pct < high
            assert figures.sm_active_pct is not None
            assert figures.step_sm_active_pct > figures.sm_active_pct
        watched_lane = read_run(store, WATCHED).lanes[0].figures
    assert stand_in(watched_lane) == "sleep:30.22@52%"  # what `probe doctor --like` stands in


def test_the_steps_sm_share_is_its_activity_over_the_batches_less_their_waits() -> None:
    """Batches of 20 ms waits and 30 ms steps under SM activity sampled at 30%: the steps,
    60% of the batches' time, held the SMs 50% of theirs; a validation pass between epochs,
    at 90%, is outside the batches and weighs nothing."""
    events, samples, t = [], [], 0
    for index in range(40):
        events.append(BatchEvent(0, index, t, 0.020, 0.030, 8, warmup=False))
        t += 50_000_000
        if index == 19:
            t += 1_000_000_000  # validation
    for k in range(1, t // 100_000_000 + 2):
        inside = not (1_000_000_000 < k * 100_000_000 <= 2_000_000_000)
        samples.append(GpuSample(k * 100_000_000, "GPU-0", None, 30.0 if inside else 90.0,
                                 None, None, None, None, None, None, None, None))  # fmt: skip
    figures = lane_figures(events, samples)
    assert figures.step_sm_active_pct == pytest.approx(50.0, abs=2.5)
    assert stand_in(figures) == "sleep:30@50%"


def test_the_stand_in_for_a_watched_step_reads_its_sm_share() -> None:
    spec = parse_consumer("sleep:30.22@52%")
    assert (spec.kind, spec.step_ms, spec.sm_pct) == (ConsumerKind.SLEEP, 30.22, 52.0)
    assert str(spec) == "sleep:30.22@52%" and str(parse_consumer("sleep:30")) == "sleep:30"
    note = consumer_note(spec)
    assert note is not None and "15.7 ms of GPU work" in note and "up to 1.9x" in note
    for text, said in (("sleep:30@0%", "0 < SM <= 100"), ("sleep:30@lots", "a percentage"),
                       ("sleep:30@120", "0 < SM <= 100")):  # fmt: skip
        with pytest.raises(InputError, match=said):
            parse_consumer(text)


class RandomApply(torch.nn.Module):
    """torchvision's RandomApply: its transforms, applied together with probability p."""

    def __init__(self, transforms: list[Any], p: float = 0.5) -> None:
        super().__init__()
        self.transforms, self.p = transforms, p


def test_what_the_written_module_must_not_take_for_granted(tmp_path: Path) -> None:
    """A RandomApply stays one step (refused), not its transforms always applied; a folder read
    by another loader than PIL's is refused; the module checks its listing of the folder against
    the files the job's dataset held; it shards only where the DataLoader's sampler did."""
    from probe.fix.dali import DaliSetting, Unmovable, dali_module
    from probe.measure.recipe import recipe_of

    setting = DaliSetting(num_threads=1, hw_decoder_load=0.65)
    dataset = tv.ImageFolder(str(folder(tmp_path / "data")), transform=tv.Compose(
        [RandomApply([tv.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), tv.ToTensor()]))  # fmt: skip
    with pytest.raises(Unmovable, match="RandomApply") as refused:
        dali_module(recipe_of(DataLoader(dataset, batch_size=2)), setting, "run")
    assert not [line for line in refused.value.lines if line.startswith("ColorJitter")]

    dataset.transform = tv.Compose([tv.Resize(32), tv.CenterCrop(32), tv.ToTensor()])
    dataset.loader = np.load  # type: ignore[assignment]
    with pytest.raises(Unmovable, match="reads its files with load"):
        dali_module(recipe_of(DataLoader(dataset, batch_size=2)), setting, "run")

    dataset.loader = tv.default_loader
    written = dali_module(recipe_of(DataLoader(dataset, batch_size=4)), setting, "run")
    module = written_module(written, tmp_path / "dali_whole.py")
    assert module.SHARD is False  # every rank read every file: the DataLoader had no sampler
    loader = module.loader(device="cpu")
    assert len(loader.dataset) == 6 and len(loader.sampler) == 6 and len(loader) == 2
    shutil.copy(tmp_path / "data" / "c0" / "0.jpg", tmp_path / "data" / "c0" / "9.jpg")
    with pytest.raises(RuntimeError, match="lists 7 files where the job's dataset held 6"):
        module.loader(device="cpu")

    sampler: Any = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0)
    sharded = dali_module(recipe_of(DataLoader(dataset, batch_size=4, sampler=sampler)),
                          setting, "run")  # fmt: skip
    assert "\nSHARD = True\n" in sharded.module
