"""Faults found by trying to break feedscope, each held: symlink loops in a dataset, nonsense
thresholds, NaN in JSON, a run missing lanes, reports on file systems that refuse them, a
Ctrl-C while the command starts, skipped files counted once, unreadable files named so."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli, solid, write_jpeg
from pipelines import (
    Backend,
    CorruptImageError,
    DaliOptions,
    DataLoaderOptions,
    PipelineSpec,
    build_pipeline,
)
from pipelines.dali_loader import _unreadable_reason
from pipelines.dataset import discover
from probe.present.cli import main
from probe.store.db import Store


def strict(text: str) -> Any:
    """JSON as a strict parser reads it: NaN and infinities are errors."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def tree(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    for c in range(classes):
        for i in range(per_class):
            write_jpeg(root / f"class_{c}" / f"img_{i}.jpg", solid((10 * i, 20 * c, 99), 16, 16))
    return root


def test_a_symlink_loop_is_read_once_and_named(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    (root / "class_0" / "up").symlink_to("..")  # the dataset again, under class_0
    dataset = discover(root)
    assert len(dataset) == 6
    assert [Path(f).parent.name for f in dataset.files] == ["class_0"] * 3 + ["class_1"] * 3
    assert dataset.labels == (0, 0, 0, 1, 1, 1)
    assert dataset.skipped_links == (str(root / "class_0" / "up"),)


def test_two_symlink_loops_end_at_once(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    (root / "class_0" / "up").symlink_to("..")
    (root / "class_1" / "again").symlink_to(root / "class_1")
    started = time.monotonic()
    dataset = discover(root)
    assert time.monotonic() - started < 5
    assert len(dataset) == 6 and len(dataset.skipped_links) == 2


def test_links_out_of_the_tree_are_followed_once(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    outside = tree(tmp_path / "elsewhere", classes=1, per_class=2) / "class_0"
    (root / "class_1" / "more").symlink_to(outside)
    (root / "class_1" / "also").symlink_to(outside)  # the same folder twice: read once
    (root / "class_0" / "one.jpg").symlink_to(outside / "img_0.jpg")  # a file: allowed
    dataset = discover(root)
    assert dataset.labels.count(0) == 4 and dataset.labels.count(1) == 5
    assert len(dataset.skipped_links) == 1


def test_a_probe_on_a_looping_dataset_says_what_it_skipped(tmp_path: Path) -> None:
    root = tree(tmp_path / "data", classes=2, per_class=8)
    (root / "class_0" / "up").symlink_to("..")
    (root / "class_1" / "up").symlink_to("..")
    result = probe_cli("run", "--gpus", "none", "--data", root, "--db", tmp_path / "s.db",
                       "--batches", "4", "--batch-size", "4", "--workers", "1", "--json",
                       timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = strict(result.stdout)
    [note] = [n for n in document["config"]["data_notes"] if "link" in n]
    assert note.startswith("skipped 2 link(s)")
    assert document["config"]["lanes"][0]["images"] == 16
    shown = probe_cli("show", "last", "--db", tmp_path / "s.db")
    assert "data: skipped 2 link(s)" in shown.stderr + shown.stdout


@pytest.mark.parametrize(
    "flags",
    [
        ["--min-images-per-s", "nan"],
        ["--max-batch-latency-p99-ms", "nan"],
        ["--min-images-per-s", "inf"],
        ["--max-batch-latency-p99-ms", "-5"],
        ["--min-images-per-s", "-1"],
        ["--max-data-wait", "nan"],
        ["--max-data-wait", "-10%"],
    ],
)
def test_nonsense_thresholds_are_refused(
    filled_store: dict[str, Any], flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["check", "last", "--db", str(filled_store["db"]), "--json", *flags])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    assert line.startswith("error: ") and flags[0] in line


def test_every_json_document_is_strict_json(
    filled_store: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(filled_store["db"])
    for name in ("doctor", "two", "failed", "sweep", "hostile"):  # run, sweep, doctor --json
        json.dumps(filled_store[name], allow_nan=False)  # read back without a NaN in it
    subjects = [row["run_id"] for row in strict(run_main(["runs", "--db", db, "--json"], capsys))]
    subjects += [filled_store["doctor"]["session_id"], filled_store["sweep"]["session_id"]]
    for subject in subjects:
        strict(run_main(["show", subject, "--db", db, "--json"], capsys))
        strict(run_main(["report", subject, "--db", db, "--format", "json"], capsys))
        strict(run_main(["check", subject, "--db", db, "--json", "--max-data-wait", "99%"],
                        capsys, codes=(0, 1)))  # fmt: skip
    bench = probe_cli("bench", "--data", filled_store["photos"], "--json", "--batches", "3",
                      "--batch-size", "4", "--workers", "1", "--pipeline", "torch")  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    strict(bench.stdout)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], codes: tuple[int, ...] = (0,)
             ) -> str:  # fmt: skip
    code = main(argv)
    captured = capsys.readouterr()
    assert code in codes, captured.err
    return captured.out


def test_a_run_missing_lanes_fails_the_check(
    filled_store: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = filled_store["two"]["run_id"]
    db = tmp_path / "store.db"
    db.write_bytes(Path(filled_store["db"]).read_bytes())
    with sqlite3.connect(db) as store:  # one node's store of a two-node run, not merged yet
        store.execute("DELETE FROM lanes WHERE run_id = ? AND lane = 1", (run_id,))
    code = main(["check", run_id, "--db", str(db), "--json", "--max-data-wait", "100%"])
    document = strict(capsys.readouterr().out)
    assert code == 1 and not document["passed"]
    assert any("holds 1 of its 2 lanes" in miss for miss in document["misses"])


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EACCES])
def test_a_report_that_cannot_be_written_ends_in_one_line(
    filled_store: dict[str, Any], tmp_path: Path, code: int,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    def refuse(*_: Any, **__: Any) -> Any:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "write_text", refuse)
    monkeypatch.setattr(Path, "unlink", refuse)  # a read-only file system refuses cleanup too
    target = tmp_path / "report.html"
    status = main(["report", "last", "--db", str(filled_store["db"]), "-o", str(target)])
    err = capsys.readouterr().err
    assert status == (1 if code == errno.ENOSPC else 2)  # a full disk is the machine's failure
    assert err.strip() == f"error: cannot write {target}: {os.strerror(code)}"


STARTING = """
import sys
from probe.__main__ import run  # what the `probe` script does first: light, imports nothing
print("up", file=sys.stderr, flush=True)
sys.exit(run())
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_a_ctrl_c_while_the_command_starts_is_quiet(tmp_path: Path, delay: float) -> None:
    """From the moment the command's code runs (the heavy imports: torch, rich, click) until it
    ends, no traceback. A signal in Python's own start-up, its first few ms, is Python's."""
    Store(tmp_path / "s.db").close()
    command = subprocess.Popen(
        [sys.executable, "-c", STARTING, "runs", "--db", str(tmp_path / "s.db")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert command.stderr is not None and command.stderr.readline() == "up\n"
    time.sleep(delay)
    command.send_signal(signal.SIGINT)
    _, stderr = command.communicate(timeout=60)
    assert "Traceback" not in stderr
    # done before the signal, stopped by it, or (-SIGINT) stopped by it as Python shut down
    assert command.returncode in (0, 130, -signal.SIGINT)
    if command.returncode == 130:
        assert stderr.strip() == "interrupted"


def test_strict_json_writes_null_for_what_is_not_a_number() -> None:
    from probe.present.jsontext import json_text

    text = json_text({"a": math.nan, "b": [math.inf, 1.5], "c": (-math.inf,)})
    assert strict(text) == {"a": None, "b": [None, 1.5], "c": [None]}


def broken_dataset(root: Path) -> Path:
    tree(root, classes=2, per_class=6)
    bad = root / "class_1" / "img_5.jpg"
    bad.write_bytes(bad.read_bytes()[:60])  # truncated in its header
    return bad


@pytest.mark.parametrize("backend", [Backend.TORCH, Backend.DALI])
def test_a_skipped_file_is_counted_once_over_epochs(tmp_path: Path, backend: Backend) -> None:
    bad = broken_dataset(tmp_path / "data")
    spec = PipelineSpec(tmp_path / "data", batch_size=4, image_size=16, skip_corrupt=True,
                        dataloader=DataLoaderOptions(num_workers=0),
                        dali=DaliOptions(num_threads=1))  # fmt: skip
    with build_pipeline(spec, backend) as pipeline:
        for _ in range(3):  # three epochs
            list(pipeline)
        assert pipeline.skipped_files == [str(bad)]


def test_an_unreadable_file_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tree(tmp_path / "data") / "class_1" / "img_2.jpg"
    real_open = open

    def refuse(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(bad):  # what a file without read permission answers
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("pipelines.torch_loader.open", refuse, raising=False)
    monkeypatch.setattr("pipelines.dali_loader.open", refuse, raising=False)
    spec = PipelineSpec(tmp_path / "data", batch_size=2, image_size=16, shuffle=False,
                        dataloader=DataLoaderOptions(num_workers=0))  # fmt: skip
    with pytest.raises(CorruptImageError) as caught, build_pipeline(spec, Backend.TORCH) as p:
        list(p)
    message = str(caught.value)
    assert message.startswith(f"image file that cannot be read: {bad} (PermissionError:")
    assert "give this user read access to it" in message and "corrupt or" not in message
    assert _unreadable_reason(str(bad)) == "PermissionError: Permission denied"  # DALI's naming


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_dali_names_an_unreadable_file(tmp_path: Path) -> None:
    bad = tree(tmp_path / "data") / "class_1" / "img_2.jpg"
    bad.chmod(0)
    spec = PipelineSpec(tmp_path / "data", batch_size=2, image_size=16, shuffle=False,
                        dali=DaliOptions(num_threads=1))  # fmt: skip
    with (
        pytest.raises(CorruptImageError, match="image file that cannot be read"),
        build_pipeline(spec, Backend.DALI) as pipeline,
    ):
        list(pipeline)
