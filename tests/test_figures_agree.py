"""One run, every output: the CLI's JSON and table, the report's JSON and Markdown, and the
dashboard's tables show the same data-wait, images/s and CPU figures, each lane's and the run's
(the run's data-wait is its worst lane's everywhere)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from helpers import probe_cli
from probe.metrics import CPU, DATA_WAIT, IMAGES_PER_S

APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")


def cli_json(*args: Any) -> Any:
    result = probe_cli(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def page(monkeypatch: pytest.MonkeyPatch, db: Path, name: str, **params: str) -> AppTest:
    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page(f"views/{name}.py")
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def rows(at: AppTest, column: str) -> list[dict[str, Any]]:
    frame = next(df.value for df in at.dataframe if column in df.value.columns)
    return list(frame.to_dict("records"))


def test_every_output_shows_the_same_figures(
    filled_store: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, run_id = filled_store["db"], filled_store["two"]["run_id"]
    shown = cli_json("show", run_id, "--db", db, "--json")
    report = cli_json("report", run_id, "--db", db, "--format", "json")["run"]
    listed = next(r for r in cli_json("runs", "--db", db, "--json") if r["run_id"] == run_id)
    lanes = shown["lanes"]
    assert len(lanes) == 2

    # the run-level figures: images/s adds up, data-wait is the worst lane's
    worst = max(lane["data_wait_frac"] for lane in lanes)
    assert shown["images_per_s"] == pytest.approx(sum(lane["images_per_s"] for lane in lanes))
    for document in (shown, report):
        assert document["data_wait_frac"] == worst
        assert document["images_per_s"] == shown["images_per_s"]
    assert listed["data_wait_frac"] == worst
    assert listed["images_per_s"] == shown["images_per_s"]

    # each lane's figures, in the report's JSON as in the CLI's
    keys = ("images_per_s", "images_per_s_error", "data_wait_frac", "data_wait_frac_error",
            "cpu_pct")  # fmt: skip
    for mine, theirs in zip(lanes, report["lanes"], strict=True):
        assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}
    assert all(lane["cpu_pct"] is not None for lane in lanes)

    # the CLI's table and the report's Markdown write them as the metric layer does
    table = probe_cli("runs", "--db", db)
    assert table.returncode == 0, table.stderr
    # the run's row, to the next run's: one line wide, or its words wrapped where the console
    # is too narrow for the columns
    after = table.stdout.split(run_id, 1)[1]
    record = re.split(r"\d{8}-\d{6}-[0-9a-f]{4}", after, maxsplit=1)[0]
    assert DATA_WAIT.cell(worst) in " ".join(record.replace("│", " ").split())
    markdown = probe_cli("report", run_id, "--db", db, "--format", "md").stdout
    for lane in lanes:
        cells = (
            IMAGES_PER_S.cell(lane["images_per_s"], lane["images_per_s_error"]),
            DATA_WAIT.cell(lane["data_wait_frac"], lane["data_wait_frac_error"]),
            CPU.cell(lane["cpu_pct"]),
        )
        md_row = next(r for r in markdown.splitlines() if r.startswith(f"| {lane['lane']} | cpu"))
        assert all(cell in md_row for cell in cells), (cells, md_row)

    # the dashboard's Run page: its lanes table and its headline
    run_page = page(monkeypatch, db, "run", run=run_id)
    for lane, row in zip(lanes, rows(run_page, CPU.heading), strict=True):
        assert row[IMAGES_PER_S.heading] == IMAGES_PER_S.cell(
            lane["images_per_s"], lane["images_per_s_error"]
        )
        assert row[DATA_WAIT.heading] == DATA_WAIT.cell(
            lane["data_wait_frac"], lane["data_wait_frac_error"]
        )
        assert row[CPU.heading] == CPU.cell(lane["cpu_pct"])
    headline = {m.label: m.value for m in run_page.metric}
    assert headline[f"{DATA_WAIT.label}, worst lane"] == DATA_WAIT.cell(worst)
    assert headline[f"{IMAGES_PER_S.heading}, all lanes"] == IMAGES_PER_S.cell(
        shown["images_per_s"]
    )

    # the dashboard's Runs page lists the run with the same run-level data-wait
    runs_page = page(monkeypatch, db, "runs")
    row = next(r for r in rows(runs_page, "verdict") if r["run"] == run_id)
    assert row[DATA_WAIT.heading] == DATA_WAIT.cell(worst)
    assert row[IMAGES_PER_S.heading] == round(shown["images_per_s"])
