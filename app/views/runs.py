"""Runs: every doctor and sweep session with its answer, and every recorded run with its
verdict; filter them, open one.

A first visit with an empty store offers one button: the doctor on the built-in sample data.
Where the newest launch failed, the page says why, with the click that runs it again.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.measure.devices import cuda_devices
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present import launch
from probe.present.options import DOCTOR_BUDGET_S, DOCTOR_CONSUMER
from probe.present.tables import PIPELINE_ONLY_WAIT, pipeline_only


def welcome() -> None:
    devices = cuda_devices()
    where = f"{len(devices)} visible GPU(s)" if devices else "the CPU (no CUDA GPU is visible)"
    budget = DOCTOR_BUDGET_S["gpu" if devices else "cpu"]
    st.info(
        "No runs yet. Is your GPU waiting for data? The doctor finds out on the built-in sample "
        f"data (1000 JPEGs, written into your cache folder the first time), on {where}: it "
        "measures the PyTorch DataLoader at your setting and around its knee, then DALI, "
        f"feeding a training step of {DOCTOR_CONSUMER.split(':')[1]} ms per batch (what "
        "ResNet-50 takes on one H200), and says whether the step starves, why, and what to "
        f"change, with the images/s it predicts and then verifies. About {budget:.0f} s."
    )
    if st.button("Run the doctor on the built-in sample data", key="runs-first", type="primary"):
        gpus = tuple(d.index for d in devices) or None
        with common.store() as store:
            launch.start(store, launch.LaunchForm(command="doctor", gpus=gpus))
        st.switch_page("views/live.py")


def sessions(rows: list[dict[str, Any]]) -> None:
    """The doctor and sweep sessions, newest first; one opens on the Session page."""
    st.subheader("Sessions")
    table = [
        {
            "session": row["session_id"],
            "status": row["status"],
            "consumer": row["consumer"],
            "devices": row["devices"],
            "answer": row["answer"],
            "top recommendation": row["recommendation"],
            "runs": row["runs"],
            "created (UTC)": row["created"].replace("T", " ").rstrip("Z"),
        }
        for row in rows
    ]
    opener(table, "session", "runs-sessions", ("answer", "top recommendation"))


def opener(table: list[dict[str, Any]], what: str, key: str, long: tuple[str, ...]) -> None:
    """A table of runs or sessions, one selectable; a button opens the one selected on its
    page (the Run or Session page; `what` is the id's column and the page's parameter)."""
    event = st.dataframe(
        table,
        key=key,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        column_config={column: st.column_config.TextColumn(width="large") for column in long},
    )
    selected = event.selection.rows if event is not None else []
    if selected:
        chosen = table[selected[0]][what]
        if st.button(f"Open {what} {chosen}", key=f"{key}-open", type="primary"):
            st.switch_page(f"views/{what}.py", query_params={what: chosen})


@common.page
def main() -> None:
    st.title("Runs")
    db = common.db_path()
    with common.store() as store:
        last = next(iter(launch.launches(store)), None)
    if last is not None and last.status.value == "failed":  # the newest launch: why it failed
        common.launch_failed(last, "runs")
    rows = common.runs_listing(db)
    session_list = common.sessions_listing(db)
    if session_list:
        sessions(session_list)
    if not rows:
        if not session_list:
            welcome()
        return
    if session_list:
        st.subheader("Runs")
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
                DATA_WAIT.heading: PIPELINE_ONLY_WAIT
                if pipeline_only(row["consumer"])
                else DATA_WAIT.cell(row["data_wait_frac"]),
                "verdict": verdict.title + (" (partial)" if verdict.partial else ""),
                "session": row["session_id"] or "",
                "created (UTC)": row["created"].replace("T", " ").rstrip("Z"),
            }
        )
    st.caption(f"{len(shown)} of {len(rows)} runs; select one to open it")
    opener(table, "run", "runs-table", ("verdict",))


main()
