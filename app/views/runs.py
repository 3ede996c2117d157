"""Runs: every recorded run with its verdict; filter them, open one.

A first visit with an empty store offers one button: a probe on the built-in sample data.
"""

from __future__ import annotations

import streamlit as st

from app import common
from probe.measure.devices import cuda_devices
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present import launch


def welcome() -> None:
    st.info(
        "No runs yet. A first probe measures the PyTorch DataLoader on the built-in sample data "
        "(1000 JPEGs, written into your cache folder the first time) for 10 seconds, on every "
        "visible GPU, or on the CPU."
    )
    if st.button("Run a probe on the built-in sample data", key="runs-first", type="primary"):
        gpus = tuple(d.index for d in cuda_devices()) or None
        with common.store() as store:
            launch.start(store, launch.LaunchForm(command="run", gpus=gpus))
        st.switch_page("views/live.py")


@common.page
def main() -> None:
    st.title("Runs")
    db = common.db_path()
    rows = common.runs_listing(db)
    if not rows:
        welcome()
        return
    left, middle, right = st.columns([2, 2, 3])
    statuses = sorted({row["status"] for row in rows})
    pipelines = sorted({row["pipeline"] for row in rows})
    chosen_status = left.multiselect("status", statuses, default=statuses, key="runs-status")
    chosen_pipeline = middle.multiselect(
        "pipeline", pipelines, default=pipelines, key="runs-pipeline"
    )
    text = right.text_input("run, label or consumer contains", key="runs-text").strip().lower()
    shown = [
        row
        for row in rows
        if row["status"] in chosen_status
        and row["pipeline"] in chosen_pipeline
        and (
            not text or any(text in (row[k] or "").lower() for k in ("run_id", "label", "consumer"))
        )
    ]
    if not shown:
        st.info(f"None of the {len(rows)} runs matches these filters.")
        return
    table = []
    for row in shown:
        verdict = common.diagnosis(db, row["run_id"], common.version_of(row)).verdict
        table.append(
            {
                "run": row["run_id"],
                "label": row["label"] or "",
                "status": row["status"],
                "pipeline": row["pipeline"],
                "consumer": row["consumer"],
                "devices": row["devices"],
                IMAGES_PER_S.heading: round(row["images_per_s"]),
                DATA_WAIT.heading: DATA_WAIT.cell(row["data_wait_frac"]),
                "verdict": verdict.title + (" (partial)" if verdict.partial else ""),
                "created (UTC)": row["created"].replace("T", " ").rstrip("Z"),
            }
        )
    st.caption(f"{len(shown)} of {len(rows)} runs; select one to open it")
    event = st.dataframe(
        table,
        key="runs-table",
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        column_config={"verdict": st.column_config.TextColumn(width="large")},
    )
    selected = event.selection.rows if event is not None else []
    if selected:
        run_id = table[selected[0]]["run"]
        if st.button(f"Open run {run_id}", key="runs-open", type="primary"):
            st.switch_page("views/run.py", query_params={"run": run_id})


main()
