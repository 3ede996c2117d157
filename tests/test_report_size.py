"""What an HTML report weighs: plotly.js's cartesian bundle inlined gzipped, its figures' data
as many points as a chart shows and numbers to 4 significant digits; a 10 s CPU run's report
under 1 MB, and every trace type the charts draw in the bundle."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from plotly.offline import get_plotlyjs_version

from helpers import probe_cli
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.present import charts

MAX_POINTS = 1000  # per trace: a chart is about a thousand pixels wide


def bundled_traces() -> tuple[set[str], str]:
    """The trace types the vendored bundle registers, and its plotly.js version."""
    bundle = gzip.decompress(charts.PLOTLY_BUNDLE.read_bytes()).decode()
    version = re.search(r"plotly\.js \(cartesian - minified\) v(\S+)", bundle)
    assert version is not None
    return set(re.findall(r'moduleType:"trace",name:"(\w+)"', bundle)), version.group(1)


def test_every_trace_type_the_charts_draw_is_in_the_bundle() -> None:
    registered, version = bundled_traces()
    source = "".join(path.read_text() for path in Path(charts.__file__).parent.glob("*.py"))
    drawn = {name.lower() for name in re.findall(r"\bgo\.(\w+)\(", source)} - {"figure"}
    assert drawn == {"scatter", "bar", "heatmap"}
    assert drawn <= registered
    # the figures' JSON is written by plotly.py for the plotly.js it bundles: the same major
    assert version.split(".")[0] == get_plotlyjs_version().split(".")[0]


def numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return [value] if isinstance(value, float) else []


@pytest.fixture(scope="module")
def ten_second_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The HTML report of a 10 s run on the CPU."""
    root = tmp_path_factory.mktemp("size")
    make_sample_dataset(root / "data", SampleParams(count=48, classes=4, seed=3))
    db, page = root / "store.db", root / "report.html"
    ran = probe_cli("run", "--data", root / "data", "--db", db, "--gpus", "none",
                    "--image-size", "64", "--duration", "10")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    written = probe_cli("report", "last", "--db", db, "-o", page)
    assert written.returncode == 0, written.stderr
    return page.read_text()


def test_a_ten_second_cpu_runs_html_report_is_under_a_megabyte(ten_second_report: str) -> None:
    assert len(ten_second_report.encode()) < 1_000_000
    assert "<script src=" not in ten_second_report


def test_its_figures_carry_what_the_charts_show_and_no_more(ten_second_report: str) -> None:
    found = re.findall(r'<script type="application/json">(.*?)</script>', ten_second_report)
    figures = [json.loads(text) for text in found]
    assert len(figures) >= 4
    registered, _ = bundled_traces()
    for figure in figures:
        assert "template" not in figure["layout"]  # the page holds it once
        assert "bdata" not in json.dumps(figure)  # numbers as rounded text, not binary
        for trace in figure["data"]:
            assert trace.get("type", "scatter") in registered
            for axis in ("x", "y"):
                assert len(trace.get(axis) or []) <= MAX_POINTS
            assert all(len(row) <= MAX_POINTS for row in trace.get("z") or [])
        assert all(float(f"{n:.4g}") == n for n in numbers(figure))
    assert sum(map(len, found)) < 100_000
