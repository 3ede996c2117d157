"""The `probe` command as users run it: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from PIL import Image

from helpers import probe_cli, solid, write_jpeg
from probe.steady import MAX_MEASURE_S

if TYPE_CHECKING:
    from probe.measure.config import ProbeConfig

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
    return probe_cli(*args, timeout=300, env=env)


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


def test_data_make_writes_images_of_the_size_asked_for(tmp_path: Path) -> None:
    result = probe("data", "make", str(tmp_path / "new"), "--count", "2", "--classes", "1",
                   "--width", "300-310", "--height", "200")  # fmt: skip
    assert result.returncode == 0, result.stderr
    for path in (tmp_path / "new").glob("class_*/*.jpg"):
        with Image.open(path) as image:
            assert 300 <= image.size[0] <= 310 and image.size[1] == 200
    assert_one_line_error(
        probe("data", "make", str(tmp_path / "bad"), "--width", "wide", "--height", "200"),
        "--width takes pixels as A-B or A, like 1600-2000 (got 'wide')",
    )
    assert not (tmp_path / "bad").exists()


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
    try:
        importlib.metadata.distribution("feedscope")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("feedscope is run from its checkout here, not installed")
    script = Path(sys.executable).with_name("probe")
    assert script.exists(), "the `probe` console script is installed beside python"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for command in ("bench", "data"):
        assert command in result.stdout
    assert_one_line_error(probe("frobnicate"), "No such command")


# --- in-process: exit codes, and the flags written back out ----------------------------------


def test_main_returns_the_exit_code_of_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from probe.present.cli import main

    assert main(["run", "--no-such-flag"]) == 2  # click's usage error, no SystemExit
    assert main(["bench", "--gpu", "first"]) == 2  # an InputError from the command
    usage, bad_input = capsys.readouterr().err.splitlines()
    assert usage.startswith("error: No such option") and "--no-such-flag" in usage
    assert bad_input == "error: --gpu takes a CUDA device index or 'none' (got 'first')"
    assert main(["--help"]) == 0


def test_exit_codes_follow_the_status() -> None:
    from probe.present.measuring import exit_code

    assert [exit_code(s) for s in ("completed", "failed", "interrupted")] == [0, 1, 130]


def test_the_flag_table_offers_what_the_probe_takes() -> None:
    from probe.measure.lane import Read
    from probe.present.options import READS

    assert tuple(r.value for r in Read) == READS  # written out: the CLI loads without torch


def parsed(monkeypatch: pytest.MonkeyPatch, words: list[str]) -> ProbeConfig:
    """The configuration `probe run ...` describes, as the CLI's own parser reads `words`."""
    from probe.present import measuring, options
    from probe.present.cli import main

    seen: list[ProbeConfig] = []

    def run(pipeline: Any, lanes: Any, as_json: bool, db: Any, backend: Any, batches: Any,
            duration: Any, label: Any, no_gather: bool, metrics_port: Any) -> int:  # fmt: skip
        seen.append(options.probe_config(pipeline, lanes, backend, batches, duration, label))
        return 0

    monkeypatch.setattr(measuring, "run", run)
    assert words[:2] == ["probe", "run"]
    assert main(words[1:]) == 0
    return seen[0]


def stored(config: ProbeConfig) -> dict[str, Any]:
    """`config` as a run's record holds it."""
    from probe.measure.config import Checked, config_dict

    return config_dict(config, Checked(2, {plan.lane: 40 for plan in config.lanes}))


def reproduced(config: ProbeConfig) -> list[str]:
    from probe.present.options import reproduce_command

    command = reproduce_command({"kind": "probe", "config": stored(config)})
    assert command is not None
    return shlex.split(command)


@pytest.mark.parametrize(
    "flags",
    [
        ["--gpus", "none", "--num-shards", "2", "--batch-size", "8", "--image-size", "64",
         "--workers", "3", "--dtype", "uint8", "--no-persistent-workers", "--start-method",
         "spawn", "--skip-corrupt", "--consumer", "sleep:5", "--read", "epochs", "--warmup",
         "4", "--duration", "7.5", "--sample-hz", "2.5"],
        ["--pipeline", "dali", "--gpus", "none", "--threads", "2", "--decoder", "cpu",
         "--precision", "2.5%", "--warmup", "auto", "--consumer", "none"],
        ["--gpus", "0,1", "--batches", "20", "--consumer", "sleep:12.5"],
        ["--pipeline", "dali", "--precision", "0.05"],  # every visible GPU
        ["--pipeline", "dali", "--gpus", "1", "--decoder", "mixed"],
        ["--pipeline", "dali", "--gpus", "0", "--threads", "2", "--hw-decoder-load", "0.95"],
    ],
)  # fmt: skip
def test_the_reproduced_command_parses_to_the_same_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: list[str]
) -> None:
    from probe.measure import devices

    gpus = [devices.CudaDevice(i, f"GPU-{i}", "NVIDIA H200", 143771.0) for i in range(2)]
    monkeypatch.setattr(devices, "cuda_devices", lambda: gpus)
    config = parsed(monkeypatch, ["probe", "run", "--data", str(tmp_path), *flags])
    words = reproduced(config)
    assert parsed(monkeypatch, words) == config
    assert reproduced(parsed(monkeypatch, words)) == words


def test_the_reproduced_command_has_no_float_noise_nor_a_session_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = parsed(monkeypatch, ["probe", "run", "--data", str(tmp_path), "--gpus", "none"])
    point = replace(config, max_s=7.233161)  # a session point: measured until precise, capped
    words = reproduced(point)
    assert "7.23" not in " ".join(words) and "--duration" not in words
    assert stored(parsed(monkeypatch, words)) == {**stored(point), "max_s": MAX_MEASURE_S}
    timed = reproduced(replace(config, duration_s=7.233161, precision=None))
    assert timed[timed.index("--duration") + 1] == "7.23"
    assert "--precision" not in timed


def test_a_launch_form_writes_the_flags_its_check_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from probe.present import options
    from probe.present.launch import LaunchForm, check

    form = LaunchForm(num_shards=2, data_dir=str(tmp_path), batch_size=8, workers=2, threads=3,
                      consumer="sleep:5", duration_s=2.5, label="from the page")  # fmt: skip
    argv = form.argv()
    assert argv[:4] == ["run", "--pipeline", "torch", "--data"]
    assert argv[argv.index("--duration") + 1] == "2.5"
    assert parsed(monkeypatch, ["probe", *argv]) == options.config_of("run", form.values())
    doctor = LaunchForm(command="doctor", consumer="sleep:30", budget_s=3.0)
    assert "--pipeline" not in doctor.argv() and "--duration" not in doctor.argv()
    (problem,) = check(doctor)
    assert problem.startswith("--budget 3 s cannot fit one trustworthy point")
    assert check(replace(form, consumer="sleep:soon", batch_size=0)) != []


def test_a_session_points_stored_length_is_no_flag_of_the_users(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from probe.present.options import reproduce_command

    config = parsed(monkeypatch, ["probe", "run", "--data", str(tmp_path), "--gpus", "none"])
    # a sweep's point as stores before `max_s` kept it: the session's cap in `duration_s`
    old = stored(replace(config, duration_s=7.233161, precision=None))
    del old["max_s"]
    point = reproduce_command({"kind": "probe", "config": old}, of_session=True)
    assert point is not None
    words = shlex.split(point)
    assert "--duration" not in words and "--batches" not in words
    assert parsed(monkeypatch, words).duration_s is None  # measured until precise
    mine = reproduce_command({"kind": "probe", "config": old})  # a run of the user's: as given
    assert mine is not None and "--duration 7.23 " in mine


def test_probe_runs_keeps_each_id_whole(small_data: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from probe.present.terminal import runs_table
    from probe.store.db import Store
    from probe.store.documents import read_run

    db = str(tmp_path / "store.db")
    ids = []
    for label in ("a label long enough to crowd the other columns out of the table " * 2, ""):
        ran = probe("run", "--data", str(small_data), "--db", db, "--gpus", "none", *TINY_RUN,
                    "--label", label, "--json")  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        ids.append(json.loads(ran.stdout)["run_id"])
    listed = probe("runs", "--db", db)  # stdout: a pipe
    assert listed.returncode == 0, listed.stderr
    assert all(run_id in listed.stdout for run_id in ids), listed.stdout
    with Store(db) as store:
        table = runs_table([read_run(store, run_id) for run_id in ids])
    for columns in (40, 60, 80, 120):
        written = io.StringIO()
        Console(width=columns, file=written).print(table)
        shown = written.getvalue()
        assert all(run_id in shown for run_id in ids), shown
        assert "images/s" in shown and "…" not in shown  # the rest wraps: nothing cut either
