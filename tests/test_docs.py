"""The README says what the code does: its commands are the ones CI runs and the CLI has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from helpers import probe_cli, solid, write_jpeg

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def bash_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL)]


def test_the_two_set_up_commands_come_first_and_ci_runs_the_test_command() -> None:
    main_job, tests = bash_blocks()[:2]
    venv = "python3 -m venv .venv && . .venv/bin/activate && pip install "
    assert main_job.startswith(venv) and main_job.endswith("streamlit run app")
    assert tests.startswith(venv) and tests.endswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()


def test_the_dashboard_section_names_every_page() -> None:
    pages = re.findall(r'st.Page\(.*title="(\w+)"', (ROOT / "app" / "streamlit_app.py").read_text())
    section = README.split("## The dashboard")[1].split("\n## ")[0]
    assert pages == re.findall(r"^- \*\*(\w+)\*\*", section, re.MULTILINE)


def test_every_documented_command_exists() -> None:
    commands = {
        line.split()[1]
        for block in bash_blocks()
        for line in block.splitlines()
        if line.startswith("probe ")
    }
    assert commands >= {"doctor", "sweep", "run", "bench", "data"}
    for command in commands:
        result = probe_cli(command, "--help")
        assert result.returncode == 0, (command, result.stderr)


def test_every_measuring_flag_is_documented() -> None:
    from probe.present.options import FLAGS

    section = README.split("## Commands")[1].split("\n## ")[0]
    assert {flag.name for flag in FLAGS if flag.name not in section} == set()
    switches = [flag.off for flag in FLAGS if flag.type is bool and flag.default]
    assert [name for name in switches if name not in section] == []


def test_documented_bench_json_keys_are_the_real_ones(tmp_path: Path) -> None:
    example = re.search(r'```json\n(\{"schema": "feedscope.bench/1".*?)```', README, re.DOTALL)
    assert example is not None
    documented = set(re.findall(r'"(\w+)":', example.group(1)))
    for n in range(4):
        write_jpeg(tmp_path / "data" / "a" / f"{n}.jpg", solid((40 * n, 90, 90)))
    result = probe_cli("bench", "--data", tmp_path / "data", "--gpu", "none", "--json",
                       "--batch-size", 2, "--batches", 2, "--warmup", 1, "--workers", 0,
                       "--threads", 1)  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    real = set(document) | {key for row in document["results"] for key in row}
    assert documented == real


def test_documented_run_json_keys_are_the_real_ones(tmp_path: Path) -> None:
    example = re.search(r'```json\n(\{"schema": "feedscope.run/1".*?)```', README, re.DOTALL)
    assert example is not None
    documented = set(re.findall(r'"(\w+)":', example.group(1))) - {"..."}
    for n in range(4):
        write_jpeg(tmp_path / "data" / "a" / f"{n}.jpg", solid((40 * n, 90, 90)))
    result = probe_cli("run", "--data", tmp_path / "data", "--gpus", "none", "--db",
                       tmp_path / "s.db", "--json", "--batch-size", 2, "--batches", 4, "--warmup",
                       1, "--workers", 0, "--image-size", 32, "--read", "epochs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    lane = document["lanes"][0]
    real = set(document) | set(lane) | set(lane["batch_latency_ms"]) | set(document["samples"])
    real |= set(document["config"]) | set(document["config"]["lanes"][0])
    real |= set(lane["epoch_start"])
    real |= {"hostname", "cpus", "gpus", "driver", "index", "uuid", "name", "memory_mib"}
    real |= {"source", "device", "metric", "reason"}  # an unavailable metric's keys
    assert documented <= real, documented - real
    assert set(lane) <= documented, "every lane key is documented"


def test_documented_report_json_keys_are_the_real_ones(filled_store: dict[str, Any]) -> None:
    example = re.search(r'```json\n(\{"schema": "feedscope.report/1".*?)```', README, re.DOTALL)
    assert example is not None
    documented = set(re.findall(r'"(\w+)":', example.group(1)))
    result = probe_cli("report", filled_store["two"]["run_id"], "--db", filled_store["db"],
                       "--format", "json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    series, histogram = report["series"], report["latency_histogram"]
    real = set(report) | set(series) | set(series["lanes"][0]) | set(series["cpu"])
    real |= set(histogram) | set(histogram["lanes"][0])
    shown = {"kind", "severity", "data_wait_frac", "title"}  # of the verdict's keys
    assert shown <= set(report["verdict"])
    assert documented == real | shown
