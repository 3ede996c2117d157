"""The `probe` command as users run it: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import solid, write_jpeg

TINY_RUN = [
    "--batch-size",
    "4",
    "--warmup",
    "1",
    "--batches",
    "3",
    "--workers",
    "1",
    "--threads",
    "1",
]


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], *needles: str, alone: bool = True
) -> None:
    """Exit code 2 and one line `error: ...` naming the problem; with `alone`, nothing else."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if alone:
        assert len(lines) == 1, result.stderr
    assert lines[-1].startswith("error: ")
    assert sum(line.startswith("error: ") for line in lines) == 1
    for needle in needles:
        assert needle in lines[-1]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "data"
    for n in range(12):
        write_jpeg(root / f"c{n % 2}" / f"{n}.jpg", solid((10 * n, 50, 90)))
    return root


def test_bench_prints_one_json_document_for_both_pipelines(small_data: Path) -> None:
    result = probe("bench", "--data", str(small_data), "--gpu", "none", "--json", *TINY_RUN)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "feedscope.bench/1"
    assert document["images_in_dataset"] == 12
    assert document["device"] is None
    backends = [r["backend"] for r in document["results"]]
    assert backends == ["torch", "dali"]
    for row in document["results"]:
        assert row["batches"] == 3
        assert row["images"] == 12
        assert row["images_per_s"] > 0
    assert document["results"][0]["settings"] == "num_workers=1 float32"  # on the CPU
    assert document["results"][1]["settings"] == "decoder=cpu num_threads=1"


def test_bench_table_goes_to_stdout(small_data: Path) -> None:
    result = probe(
        "bench", "--data", str(small_data), "--gpu", "none", "--pipeline", "torch", *TINY_RUN
    )
    assert result.returncode == 0, result.stderr
    assert "images/s" in result.stdout
    assert "torch" in result.stdout
    assert "12 images, 2 classes" in result.stderr


def test_data_make_writes_a_dataset(tmp_path: Path) -> None:
    result = probe("data", "make", str(tmp_path / "new"), "--count", "6", "--classes", "3")
    assert result.returncode == 0, result.stderr
    assert "wrote 6 images in 3 classes" in result.stderr
    assert len(list((tmp_path / "new").glob("class_*/*.jpg"))) == 6


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--batch-size", "0"], ["batch size must be >= 1"]),
        (["--workers", "-1"], ["num_workers must be >= 0"]),
        (["--threads", "0"], ["DALI num_threads must be >= 1"]),
        (["--gpu", "first"], ["--gpu takes a CUDA device index or 'none'"]),
        (["--decoder", "mixed", "--gpu", "none"], ["DALI decoder 'mixed' needs a GPU"]),
        (["--duration", "0"], ["--duration"]),
        (["--no-such-flag"], ["No such option"]),
    ],
)
def test_bad_settings_are_one_line_errors(
    small_data: Path, args: list[str], needles: list[str]
) -> None:
    assert_one_line_error(probe("bench", "--data", str(small_data), *args), *needles)


def test_bad_dataset_folders_are_one_line_errors(tmp_path: Path) -> None:
    assert_one_line_error(
        probe("bench", "--data", str(tmp_path / "nope")), "dataset folder not found"
    )
    (tmp_path / "empty").mkdir()
    assert_one_line_error(
        probe("bench", "--data", str(tmp_path / "empty")), "dataset folder is empty"
    )
    (tmp_path / "texts" / "a").mkdir(parents=True)
    (tmp_path / "texts" / "a" / "x.txt").write_text("x")
    assert_one_line_error(probe("bench", "--data", str(tmp_path / "texts")), "no images found")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert_one_line_error(probe("data", "make", str(tmp_path / "full")), "not an empty folder")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_gpu_on_a_machine_without_cuda_is_a_one_line_error(small_data: Path) -> None:
    result = probe("bench", "--data", str(small_data), "--gpu", "0", *TINY_RUN)
    assert_one_line_error(result, "GPU 0 was asked for, but CUDA is not available")


def test_a_gpu_index_that_does_not_exist_is_a_one_line_error(small_data: Path) -> None:
    result = probe("bench", "--data", str(small_data), "--gpu", "99", *TINY_RUN)
    expected = "does not exist" if torch.cuda.is_available() else "CUDA is not available"
    assert_one_line_error(result, "GPU 99", expected)


def test_without_dali_it_says_how_to_install_it(small_data: Path, tmp_path: Path) -> None:
    # a module that hides DALI, loaded before anything else through sitecustomize
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['nvidia.dali'] = None\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    asked = probe(
        "bench",
        "--data",
        str(small_data),
        "--gpu",
        "none",
        "--pipeline",
        "dali",
        *TINY_RUN,
        env=env,
    )
    assert_one_line_error(asked, "NVIDIA DALI is not installed", "pip install 'feedscope[dali]'")
    default = probe(
        "bench", "--data", str(small_data), "--gpu", "none", "--json", *TINY_RUN, env=env
    )
    assert default.returncode == 0, default.stderr
    document = json.loads(default.stdout)
    assert [r["backend"] for r in document["results"]] == ["torch"]
    assert "not installed" in document["unavailable"]["dali"]


def test_a_corrupt_jpeg_is_named_or_skipped_and_counted(small_data: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(small_data, root)
    bad = root / "c1" / "broken.jpg"
    bad.write_bytes((root / "c1" / "1.jpg").read_bytes()[:300])
    for backend in ("torch", "dali"):
        result = probe(
            "bench", "--data", str(root), "--gpu", "none", "--pipeline", backend, *TINY_RUN
        )
        assert_one_line_error(result, "corrupt or truncated image", str(bad), alone=False)
        skipped = probe(
            "bench",
            "--data",
            str(root),
            "--gpu",
            "none",
            "--pipeline",
            backend,
            "--skip-corrupt",
            "--json",
            *TINY_RUN,
        )
        assert skipped.returncode == 0, skipped.stderr
        assert json.loads(skipped.stdout)["results"][0]["skipped_files"] == 1


def test_the_console_script_and_help() -> None:
    script = Path(sys.executable).with_name("probe")
    assert script.exists(), "the `probe` console script is installed beside python"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for command in ("bench", "data"):
        assert command in result.stdout
    assert_one_line_error(probe("frobnicate"), "No such command")
