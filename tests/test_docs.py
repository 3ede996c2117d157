"""The README says what the code does: its commands are the ones CI runs and the CLI has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from helpers import probe_cli, solid, write_jpeg

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = ROOT / "tests" / "benchmarks" / "results"
RESULTS_README = RESULTS / "README.md"
# The newcomer's path from a watched job to its fix, each step a command of the landing page.
WATCH_TO_FIX = ["probe watch --", "probe show last", "probe doctor --like RUN", "probe tune RUN"]
WATCH_TO_FIX += ["probe migrate RUN", "probe migrate RUN --to dataloader", "probe watch --loader"]


def bash_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL)]


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and inline code, where headings and links live."""
    text = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(markdown: str) -> set[str]:
    """The #anchors GitHub gives the headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered."""
    text = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.DOTALL | re.MULTILINE)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(markdown: str) -> list[str]:
    """Every link target that is not a web address: inline links and reference definitions."""
    text = prose(markdown)
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    targets += re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.MULTILINE)
    return [target for target in targets if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def broken_links(markdown: str, folder: Path) -> list[str]:
    """The relative links of a Markdown file in `folder` whose file or #anchor is not there."""
    broken = []
    for target in relative_links(markdown):
        path, _, anchor = target.partition("#")
        file = (folder / path).resolve() if path else None
        if file is not None and not file.exists():
            broken.append(target)
        elif anchor:
            text = markdown if file is None else file.read_text() if file.is_file() else ""
            if anchor not in anchors(text):
                broken.append(target)
    return broken


def sections(markdown: str) -> dict[str, str]:
    """Each `## ` section's text by its heading (the text before the first one left out)."""
    parts = re.split(r"^## +(.+)$", markdown, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def tables(markdown: str) -> int:
    """How many Markdown tables: their header's separator rows, outside code blocks."""
    text = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.DOTALL | re.MULTILINE)
    row = r"^ *\|? *:?-{3,}:? *(\| *:?-{3,}:? *)+\|? *$"
    return len(re.findall(row, text, re.MULTILINE))


def test_the_readme_is_a_landing_page_under_700_lines() -> None:
    assert len(README.splitlines()) < 700


def test_the_path_from_watch_to_the_fix_is_in_the_first_150_lines() -> None:
    start = "\n".join(README.splitlines()[:150])
    blocks = re.findall(r"```bash\n(.*?)```", start, re.DOTALL)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    missing = [step for step in WATCH_TO_FIX if not any(line.startswith(step) for line in lines)]
    assert missing == []


def test_the_readme_links_the_measured_results_and_holds_none_of_them() -> None:
    start = "\n".join(README.splitlines()[:20])
    assert "](tests/benchmarks/results/README.md)" in start
    assert not re.search(r"^#+ +Measured", README, re.MULTILINE)
    assert "## Commands" in README and tables(README.split("## Commands")[0]) == 0


def test_every_relative_link_in_the_readme_resolves() -> None:
    assert relative_links(README), "the README links its sections and the results"
    assert broken_links(README, ROOT) == []


def test_each_measured_case_is_one_section_with_one_table() -> None:
    results = RESULTS_README.read_text()
    cases = sections(results)
    assert len(cases) >= 10
    assert {heading: tables(text) for heading, text in cases.items() if tables(text) != 1} == {}
    assert broken_links(results, RESULTS) == []
    linked = {Path(target.split("#")[0]).parts[0] for target in relative_links(results)}
    folders = {path.name for path in RESULTS.iterdir() if path.is_dir()}
    assert folders - linked == set(), "every case's folder has its section"


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
