"""A failure keeps its cause: the one-line reason names the real error under a DataLoader
worker's or DALI's wrapping (for memory, what the batch needs), the whole traceback is stored
and shown; sizes that cannot fit are refused before anything starts."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from streamlit.testing.v1 import AppTest

from helpers import probe_cli
from pipelines import Backend, PipelineSpec
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.measure.causes import failure_reason
from probe.present.cli import main
from probe.records import RunStatus
from probe.store.db import Store

APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")


class Failing(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, error: str) -> None:
        self.error = error

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.error == "memory":
            return torch.empty(10**13)  # 40 TB: the CPU allocator refuses it
        raise ValueError(f"label file for sample {index} is missing")


def raised_by_a_worker(error: str) -> BaseException:
    loader = torch.utils.data.DataLoader(Failing(error), batch_size=2, num_workers=1)
    with pytest.raises(Exception) as caught:
        next(iter(loader))
    return caught.value


def test_a_workers_error_is_named_not_its_wrapping() -> None:
    error = raised_by_a_worker("value")
    assert str(error).startswith("Caught ValueError in DataLoader worker process 0")
    assert failure_reason(error) == "ValueError: label file for sample 0 is missing"


def test_a_workers_allocation_says_out_of_memory_and_what_the_batch_needs(
    tmp_path: Path,
) -> None:
    spec = PipelineSpec(tmp_path, batch_size=100_000, image_size=224)
    reason = failure_reason(raised_by_a_worker("memory"), spec, Backend.TORCH)
    assert reason.startswith(
        "out of memory (an allocation of 40 TB): batch 100000 x 3 x 224 x 224 float32 "
        "(60.2 GB) per batch; RuntimeError: "
    )
    assert "you tried to allocate 40 TB" in reason and "\n" not in reason


def test_dalis_critical_error_names_the_operator_and_its_error(tmp_path: Path) -> None:
    from nvidia.dali import fn, pipeline_def

    make_sample_dataset(tmp_path / "photos", SampleParams(count=8, classes=2, seed=1))

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)  # type: ignore[untyped-decorator]
    def huge() -> Any:
        jpegs, labels = fn.readers.file(file_root=str(tmp_path / "photos"), name="Reader")
        images = fn.decoders.image(jpegs, device="cpu")
        return fn.resize(images, resize_x=100_000, resize_y=100_000), labels

    pipe = huge()
    pipe.build()
    with pytest.raises(RuntimeError) as caught:
        pipe.run()
    assert str(caught.value).startswith("Critical error in pipeline:")
    spec = PipelineSpec(tmp_path, batch_size=4, image_size=100_000)
    assert failure_reason(caught.value, spec, Backend.DALI) == (
        "out of memory: batch 4 x 3 x 100000 x 100000 float32 (480 GB) per batch; "
        "DALI's fn.resize (CPU): std::bad_alloc"
    )
    # The failed pipeline, held by the exception's traceback, is freed here while its threads
    # live: a process forked later in this test process that collected it waited forever for
    # threads it does not have (a sample-data pool's worker, in a full run).
    del pipe, caught
    gc.collect()


@pytest.mark.parametrize(
    ("flags", "needed"),
    [
        (["--batch-size", "100000"], "batch 100000 x 3 x 224 x 224 float32 (60.2 GB)"),
        (["--image-size", "100000"], "batch 32 x 3 x 100000 x 100000 float32 (3.84 TB)"),
    ],
)
def test_a_batch_that_cannot_fit_is_refused_before_anything_starts(
    tmp_path: Path, flags: list[str], needed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"  # empty, as on a fresh machine: the sample data is not made
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    started = time.monotonic()
    result = probe_cli("run", "--gpus", "none", "--db", tmp_path / "s.db", *flags)
    assert time.monotonic() - started < 60  # no lane process, no pipeline built
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: one {needed} is more than this host's memory")
    assert not cache.exists() or not any(cache.rglob("*.jpg"))
    with Store(tmp_path / "s.db") as store:
        assert store.runs() == []


TRACEBACK = 'Traceback (most recent call last):\n  File "lane.py", line 1\nValueError: deep down\n'


def test_a_failed_lanes_traceback_is_kept_and_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "store.db"
    make_sample_dataset(tmp_path / "photos", SampleParams(count=16, classes=2, seed=4))
    recorded = probe_cli("run", "--gpus", "none", "--data", tmp_path / "photos", "--db", db,
                         "--batches", "2", "--batch-size", "4", "--workers", "0")  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    with Store(db) as store:  # its lane, as a lane that failed deep down leaves it
        (run,) = store.runs()
        store.update_lane(run.run_id, 0, status=RunStatus.FAILED,
                          reason="ValueError: deep down", traceback=TRACEBACK)  # fmt: skip
    assert main(["show", "last", "--db", str(db), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["lanes"][0]["traceback"] == TRACEBACK
    assert main(["show", "last", "--db", str(db)]) == 0
    assert f"probe show {run.run_id} --verbose" in capsys.readouterr().err
    assert main(["show", "last", "--db", str(db), "--verbose"]) == 0
    assert TRACEBACK.strip() in capsys.readouterr().err

    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("views/run.py")
    at.query_params["run"] = run.run_id
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [expander] = [e for e in at.expander if "where it failed" in e.label]
    assert TRACEBACK.strip() in [code.value.strip() for code in expander.code]


def test_dalis_gpu_allocation_failure_as_an_h100_gave_it() -> None:
    """The text of a DALI run of batch 100000 on an H100 (80 GB), as its lane caught it."""
    error = RuntimeError(
        "Critical error in pipeline:\nError in GPU operator "
        "`nvidia.dali.fn.crop_mirror_normalize`,\nwhich was used in the pipeline definition "
        'with the following traceback:\n\n  File "pipelines/dali_loader.py", line 190\n\n'
        "encountered:\n\nCan't allocate 60230205440 bytes on device 0.\n"
        "Current pipeline object is no longer valid."
    )
    spec = PipelineSpec(Path("/data"), batch_size=100_000, image_size=224, device=0)
    assert failure_reason(error, spec, Backend.DALI) == (
        "out of GPU memory (an allocation of 60.2 GB): batch 100000 x 3 x 224 x 224 float32 "
        "(60.2 GB) per batch; DALI's fn.crop_mirror_normalize (GPU): Can't allocate 60.2 GB on "
        "device 0."
    )


def test_a_run_cut_short_by_an_error_is_never_completed(tmp_path: Path) -> None:
    """The coordinating process stopped by an error (here, its display) while a lane measures:
    the run keeps what it recorded and says it did not complete."""
    from pipelines import DaliOptions, DataLoaderOptions
    from probe.measure.config import ProbeConfig, plan_lanes
    from probe.measure.consumers import parse_consumer
    from probe.measure.runner import run_probe

    make_sample_dataset(tmp_path / "photos", SampleParams(count=32, classes=2, seed=4))
    spec = PipelineSpec(tmp_path / "photos", batch_size=4, image_size=32,
                        dataloader=DataLoaderOptions(num_workers=1),
                        dali=DaliOptions(num_threads=1))  # fmt: skip
    config = ProbeConfig(backend=Backend.TORCH, spec=spec, lanes=plan_lanes(None, 1),
                         consumer=parse_consumer("sleep:10"), warmup=1, batches=None,
                         duration_s=30.0, sample_hz=10)  # fmt: skip

    def display(lanes: Any) -> None:
        if any(live.batches >= 5 for live in lanes):
            raise SystemExit("the display went away")

    with Store(tmp_path / "store.db") as store, pytest.raises(SystemExit):
        run_probe(config, store, on_update=display)
    with Store(tmp_path / "store.db") as store:
        (run,) = store.runs()
        (lane,) = store.lanes(run.run_id)
        kept = len(store.batches(run.run_id))
    assert run.status is RunStatus.INTERRUPTED and lane.status is RunStatus.INTERRUPTED
    assert run.reason == "lane 0: the run ended before the lane did"
    assert kept >= 5
