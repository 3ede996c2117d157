"""`watch` on any iterable, end to end: plain Python objects, tuples, dicts and a DALI iterator's
output are recorded, shown, reported, diagnosed and drawn by the dashboard's pages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from streamlit.testing.v1 import AppTest

from helpers import skip_on_a_busy_host
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe import watch
from probe.judge.diagnosis import diagnose_run
from probe.present.cli import main
from probe.store.db import Store
from probe.store.documents import read_run

APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
STEPS = 40


def ints() -> Iterator[int]:
    yield from range(STEPS)


def tuples() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _ in range(STEPS):
        yield torch.zeros(8, 3, 16, 16), torch.zeros(8, dtype=torch.long)


def dicts() -> Iterator[dict[str, torch.Tensor]]:
    for _ in range(STEPS):
        yield {"image": torch.zeros(8, 3, 16, 16), "label": torch.zeros(8)}


def dali(root: Path) -> Iterable[Any]:
    """A DALI iterator as users build one (CPU only here): a list of dicts per step."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)  # type: ignore[untyped-decorator]
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(file_root=str(root), name="Reader")
        images = fn.resize(fn.decoders.image(jpegs, device="cpu"), resize_x=32, resize_y=32)
        return images, labels

    iterator: Iterable[Any] = DALIGenericIterator(
        pipe(), ["data", "label"], reader_name="Reader",
        last_batch_policy=LastBatchPolicy.DROP, auto_reset=True,
    )  # fmt: skip
    return iterator


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("any") / "photos"
    make_sample_dataset(root, SampleParams(count=320, classes=2, seed=2))
    return root


@pytest.mark.parametrize("kind", ["ints", "tuples", "dicts", "dali"])
def test_watch_of_any_iterable_works_everywhere(
    kind: str, photos: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    db = tmp_path / "store.db"
    source = {"ints": ints, "tuples": tuples, "dicts": dicts}.get(kind)
    iterable = source() if source is not None else dali(photos)
    seen = 0
    for _ in watch(iterable, name=f"any-{kind}", db=db):
        time.sleep(0.01)
        seen += 1
    assert seen > 0
    with Store(db) as store:
        [run] = store.runs()
        document = read_run(store, run.run_id)
        diagnosis = diagnose_run(store, run.run_id)
    [lane] = document.lanes
    assert document.status == "completed" and lane.figures.batches > 0
    per_batch = lane.figures.images / lane.figures.batches
    assert per_batch == (1 if kind == "ints" else 8)  # the batches' own size, as handed over
    assert diagnosis.verdict.title and diagnosis.recommendations  # an answer, on what it has

    for argv in (["show", "last"], ["show", "last", "--json"]):
        assert main([*argv, "--db", str(db)]) == 0
    shown = capsys.readouterr()
    assert "Traceback" not in shown.err
    json.loads(shown.out[shown.out.index("{") :])
    for suffix in ("md", "html", "json"):
        out = tmp_path / f"report.{suffix}"
        assert main(["report", "last", "--db", str(db), "-o", str(out)]) == 0
        assert out.stat().st_size > 0

    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])
    for page, params in (("runs", {}), ("run", {"run": run.run_id})):
        at = AppTest.from_file(APP, default_timeout=60)
        at.switch_page(f"views/{page}.py")
        for name, value in params.items():
            at.query_params[name] = value
        at.run()
        assert not at.exception, [e.message for e in at.exception]


def test_a_starved_dali_iterator_is_told_in_dalis_terms(photos: Path, tmp_path: Path) -> None:
    """One DALI thread on two cores, decoding for a step of 2 ms: DALI's threads, not
    DataLoader workers, in its verdict and its first change, which the answer at exit prints."""
    from probe.present.watching import loader_answers

    db = tmp_path / "store.db"
    for _ in watch(dali(photos), name="dali", db=db, answer=False):
        time.sleep(0.002)
    with Store(db) as store:
        [run] = store.runs()
        diagnosis = diagnose_run(store, run.run_id)
    skip_on_a_busy_host({"diagnosis": diagnosis.to_json()})
    verdict = diagnosis.verdict
    assert verdict.kind.value in (
        "dali_threads_saturated", "dali_threads_too_few", "starved_cpu_saturated"
    )  # fmt: skip
    assert "worker" not in verdict.title and "num_workers" not in json.dumps(
        [e.text for e in verdict.evidence]
    )
    first = diagnosis.recommendations[0]
    assert first.setting == "DALI num_threads=2"
    assert first.action == "raise DALI num_threads from 1 to 2"
    assert "searches DALI's threads and the hardware decoder's share" in first.basis
    lines = loader_answers(db, run.run_id)
    assert lines[1].startswith("  first change: DALI num_threads=2: raise DALI num_threads")
