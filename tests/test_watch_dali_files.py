"""A watched DALI iterator's files: its file reader's `file_root`, `files` or `file_list` give the
folder they share and how many they are (`described.dali_files`), recorded in the run's spec,
so that `probe doctor --like RUN` measures on them and a DALI lane's advice points to it; any
other source is named, its files not known, and nothing in the reading ever raises."""

from __future__ import annotations

import gc
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers import probe_cli
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe import watch
from probe.judge.facts import LaneFacts, run_facts
from probe.judge.recommend_dali import in_dalis_terms
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind
from probe.lane_figures import LaneFigures
from probe.measure.described import dali_files
from probe.store.db import Store

pytest.importorskip("nvidia.dali")

BATCH, SIDE = 6, 48


@pytest.fixture(autouse=True)
def _collect_dalis_pipelines() -> Iterator[None]:
    """Frees each test's DALI pipelines (held in reference cycles) while their threads live: a
    process forked later in this test process (a DataLoader worker, a pool's) that collected
    one would wait for those threads, which it does not have, forever."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dali-files") / "photos"
    make_sample_dataset(root, SampleParams(count=96, classes=4, seed=3))
    return root


def jpegs(photos: Path) -> list[Path]:
    return sorted(photos.glob("*/*.jpg"))


def built(**reader: Any) -> Any:
    """A built CPU pipeline that reads with `fn.readers.file(**reader)`."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        files, labels = fn.readers.file(name="Reader", **reader)
        return files, labels

    pipeline = pipe()
    pipeline.build()
    return pipeline


def dali_iterator(photos: Path) -> Any:
    """A DALI iterator as users build one (CPU only here) over the class folders of `photos`."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        files, labels = fn.readers.file(file_root=str(photos), name="Reader")
        images = fn.decoders.image(files, device="cpu")
        return fn.resize(images, resize_x=SIDE, resize_y=SIDE), labels

    return DALIGenericIterator(
        pipe(), ["data", "label"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP
    )


def test_a_file_roots_files_are_its_folder_as_dali_counted_them(photos: Path) -> None:
    assert dali_files(built(file_root=str(photos))) == {"data_dir": str(photos), "data_files": 96}
    relative = [str(p.relative_to(photos)) for p in jpegs(photos)[::2]]
    assert dali_files(built(file_root=str(photos), files=relative)) == {
        "data_dir": str(photos), "data_files": 48,
    }  # fmt: skip


def test_a_files_list_gives_the_folder_its_paths_share(photos: Path) -> None:
    files = [str(p) for p in jpegs(photos)[::10]]  # in all four class folders
    assert dali_files(built(files=files)) == {"data_dir": str(photos), "data_files": 10}
    one = dali_files(built(files=files[0]))  # a single path, as DALI takes it too
    assert one == {"data_dir": str(Path(files[0]).parent), "data_files": 1}


def test_a_file_list_is_read_relative_to_the_root_else_to_its_own_folder(
    photos: Path, tmp_path: Path
) -> None:
    """The list's "path label" lines, read as DALI reads them: blank lines and trailing spaces
    skipped, spaces inside a path kept."""
    lines = [f"{p.relative_to(photos)} {i % 4}  \n" for i, p in enumerate(jpegs(photos)[:12])]
    listed = tmp_path / "elsewhere" / "train.txt"
    listed.parent.mkdir()
    listed.write_text("".join(lines) + "\n")
    assert dali_files(built(file_root=str(photos), file_list=str(listed))) == {
        "data_dir": str(photos), "data_files": 12,
    }  # fmt: skip

    copy = tmp_path / "my photos"  # the list beside the class folders, no file_root
    shutil.copytree(photos / "class_00", copy / "class a")
    shutil.copytree(photos / "class_01", copy / "class b")
    (copy / "train.txt").write_text(
        "".join(f"{p.relative_to(copy)} {i}\n" for i, p in enumerate(sorted(copy.glob("*/*"))))
    )
    assert dali_files(built(file_list=str(copy / "train.txt"))) == {
        "data_dir": str(copy), "data_files": 48,
    }  # fmt: skip


def test_the_ops_apis_file_reader_is_read_too(photos: Path) -> None:
    from nvidia.dali import ops
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline(batch_size=2, num_threads=1, device_id=None)
    with pipe:
        files, labels = ops.readers.File(file_root=str(photos))()
        pipe.set_outputs(files, labels)
    pipe.build()
    assert dali_files(pipe) == {"data_dir": str(photos), "data_files": 96}


def test_another_source_is_named_and_its_files_not_known() -> None:
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        return fn.external_source(source=lambda: [np.zeros(4, np.uint8)] * 2)

    external = pipe()
    external.build()
    assert dali_files(external) == {
        "data_dir": "(read by DALI's external_source: its files not known)", "data_files": None,
    }  # fmt: skip
    tfrecord = op({"_module": "nvidia.dali.fn.readers", "_display_name": "tfrecord",
                   "path": ["/data/train.tfrecord"]})  # fmt: skip
    assert dali_files(SimpleNamespace(_ops=[tfrecord]))["data_dir"] == (
        "(read by DALI's readers.tfrecord: its files not known)"
    )


class Printed:
    """An operator's spec, which DALI prints as `text`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def op(arguments: dict[str, Any] | None, printed: str = "") -> Any:
    """An operator as a built pipeline holds it: its arguments as DALI keeps them (None: a DALI
    that keeps them elsewhere), and its spec as DALI prints it."""
    return SimpleNamespace(
        name="Reader", _op=SimpleNamespace(_init_args=arguments), spec=Printed(printed)
    )


def test_without_the_arguments_dict_they_are_read_from_the_spec_as_dali_prints_it(
    photos: Path,
) -> None:
    files = [str(p) for p in jpegs(photos)[:3]]
    printed = (
        "OpSpec for readers__File:\n  Inputs:\n  Outputs:\n    Reader[0]_cpu\n  Arguments:\n"
        "    device: cpu\n    _display_name: file\n    _module: nvidia.dali.fn.readers\n"
        f"    files: [{', '.join(files)}, ]\n    preserve_name: True\n"
    )
    assert dali_files(SimpleNamespace(_ops=[op(None, printed)])) == {
        "data_dir": str(photos / "class_00"), "data_files": 3,
    }  # fmt: skip


class Raising:
    def __repr__(self) -> str:
        raise RuntimeError("a DALI of another make")

    def reader_meta(self, name: str) -> dict[str, Any]:
        raise RuntimeError("no such reader")


FILE = {"_module": "nvidia.dali.fn.readers", "_display_name": "file"}


@pytest.mark.parametrize(
    ("pipe", "source"),
    [
        (None, "the DALI pipeline"),
        (SimpleNamespace(_ops=[object()]), "the DALI pipeline"),
        (SimpleNamespace(_ops=[SimpleNamespace(_op=None, spec=Raising())]), "the DALI pipeline"),
        (SimpleNamespace(_ops=[op({**FILE, "file_root": "/no/such/folder"})]), "readers.file"),
        (SimpleNamespace(_ops=[op({**FILE, "file_list": "/no/such/list.txt"})]), "readers.file"),
        (SimpleNamespace(_ops=[op({**FILE, "files": [1, None]})]), "readers.file"),
        (SimpleNamespace(_ops=[op({**FILE, "files": 7})]), "readers.file"),
        (SimpleNamespace(_ops=[op({**FILE})]), "readers.file"),
    ],
)
def test_odd_pipelines_are_not_known_and_nothing_raises(pipe: Any, source: str) -> None:
    by = source if source == "the DALI pipeline" else f"DALI's {source}"
    assert dali_files(pipe) == {"data_dir": f"(read by {by}: its files not known)",
                                "data_files": None}  # fmt: skip


def test_a_root_dali_did_not_count_is_known_without_its_count(photos: Path) -> None:
    pipe = Raising()
    pipe._ops = [op({**FILE, "file_root": str(photos)})]  # type: ignore[attr-defined]
    assert dali_files(pipe) == {"data_dir": str(photos), "data_files": None}


@pytest.fixture(scope="module")
def watched(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The store and run id of a watched DALI job over `photos` (one epoch, a 20 ms step)."""
    db = tmp_path_factory.mktemp("watched") / "store.db"
    for _ in watch(dali_iterator(photos), db=db, answer=False):
        time.sleep(0.02)
    with Store(db) as store:
        [run] = store.runs()
    return db, run.run_id


def test_a_watched_dali_iterator_records_its_files(photos: Path, watched: tuple[Path, str]) -> None:
    db, run_id = watched
    with Store(db) as store:
        run = store.run(run_id)
        [lane] = run_facts(store, run_id)
    spec = run.config["spec"]
    assert run.pipeline == "dali"
    assert (spec["data_dir"], spec["data_files"]) == (str(photos), 96)
    assert (spec["batch_size"], spec["image_size"], spec["dali"]["num_threads"]) == (BATCH, SIDE, 1)
    assert lane.watched_run == run_id and lane.watched_files


def test_a_watched_loop_whose_files_are_not_known_is_told_so(tmp_path: Path) -> None:
    def batches() -> Iterator[int]:
        yield from range(10)

    db = tmp_path / "store.db"
    for _ in watch(batches(), db=db, answer=False):
        pass
    with Store(db) as store:
        [run] = store.runs()
        [lane] = run_facts(store, run.run_id)
    assert lane.watched_run == run.run_id and not lane.watched_files


def test_the_doctor_like_a_watched_dali_job_measures_on_its_files(
    photos: Path, watched: tuple[Path, str]
) -> None:
    """`probe doctor --like RUN`: the job's folder, batch size, image size and DALI threads; every
    run of its session on that folder."""
    db, run_id = watched
    result = probe_cli("doctor", "--like", run_id, "--db", db, "--gpus", "none",
                       "--budget", "40", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    said, command = result.stderr.splitlines()[:2]
    assert said.startswith(f"like run {run_id}: copied data {photos} (its 96 files), ")
    assert f"batch size {BATCH}, image size {SIDE}, threads 1, consumer sleep:" in said
    assert command.startswith(f"  as: probe doctor --data {photos} --num-shards 1 ")
    assert f"--batch-size {BATCH} --image-size {SIDE} --threads 1 --consumer sleep:" in command
    session = json.loads(result.stdout)
    with Store(db) as store:
        measured = [store.run(run_id) for run_id in session["run_ids"]]
    assert any(r.pipeline == "dali" for r in measured), "DALI was measured"
    for run in measured:
        spec = run.config["spec"]
        assert spec["data_dir"] == str(photos)
        assert (spec["batch_size"], spec["image_size"]) == (BATCH, SIDE)


# One H100's watched DALI job, as seen: mixed decoder, 4 threads on 4 cores, all busy, and the
# hardware decoder with room
WATCHED = LaneFacts(
    lane=0, status="completed", backend="dali", consumer="your training step", batch_size=256,
    figures=LaneFigures(batches=200, images=51200, seconds=40.0, images_per_s=1280.0,
                        data_wait_frac=0.6, blocks=4, step_ms_p50=80.0, nvjpg_pct=30.0),
    hostname="h100", host_cpus=4, lanes_on_host=1, on_gpu=True, num_threads=4,
    decoder="mixed", hw_decoder_load=0.65, watched_run="watch-h100", watched_files=True,
)  # fmt: skip
SATURATED = Verdict(VerdictKind.DALI_THREADS_SATURATED, Severity.HIGH, 0.6, ())


def test_a_watched_dali_lane_whose_files_are_known_is_pointed_to_like_its_run() -> None:
    [share] = in_dalis_terms(WATCHED, SATURATED, 1)
    assert share.setting == "DALI hw_decoder_load=0.9"
    assert share.basis.endswith(
        "`probe doctor --like watch-h100` searches DALI's threads and the hardware decoder's "
        "share on its files"
    )
    [unknown] = in_dalis_terms(replace(WATCHED, watched_files=False), SATURATED, 1)
    assert "`probe doctor --data DIR` (DIR: a class-per-folder copy of its images)" in (
        unknown.basis
    )
    [probed] = in_dalis_terms(replace(WATCHED, watched_run=None), SATURATED, 1)
    assert probed.basis.endswith("`probe doctor` searches DALI's threads and the hardware "
                                 "decoder's share")  # fmt: skip
