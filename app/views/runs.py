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
from probe.present.options import (
    CPU_BATCH_SIZE,
    DOCTOR_BUDGET_S,
    GPU_BATCH_SIZE,
    doctor_consumer_note,
)
from probe.present.tables import PIPELINE_ONLY_WAIT, pipeline_only, short


def welcome() -> None:
    devices = cuda_devices()
    where = f"{len(devices)} visible GPU(s)" if devices else "the CPU (no CUDA GPU is visible)"
    batch = GPU_BATCH_SIZE if devices else CPU_BATCH_SIZE
    st.info(
        "No runs yet. Is your GPU waiting for data? The doctor finds out on the built-in sample "
        f"data (1000 JPEGs, written into your cache folder the first time), on {where}: it "
        "measures the PyTorch DataLoader at your setting, then DALI and other worker counts "
        "around the knee, first whichever your run says may gain more (the workers not at all "
        "where DALI already measures worth the migration), feeding "
        f"{doctor_consumer_note(batch)}; it says whether the step starves, why, "
        "and what to change, with the images/s it predicts, and checks that by running it again "
        "(a close call between two answers: by measuring the two in turn). About "
        f"{DOCTOR_BUDGET_S:.0f} s."
    )
    if st.button("Run the doctor on the built-in sample data", key="runs-first", type="primary"):
        gpus = tuple(d.index for d in devices) or None
        with common.store() as store:
            launch.start(store, launch.LaunchForm(command="doctor", gpus=gpus))
        st.switch_page("views/live.py")


# The tables fit a window 1,400 px wide (the page's 938 px beside the sidebar) whole: a verdict's
# cell and a label's are set as wide as these many characters (a label longer is `short`), and
# what else a run has is said under the table for the one selected.
VERDICT_CHARS = 34
LABEL_CHARS = 48
CHAR_PX, CELL_PADDING_PX = 6.5, 18  # a table's characters: 6.3 px on the average, capitals wider
SESSIONS_IN_FULL = 5  # the newest sessions whose answers are written out under their table


def sessions(rows: list[dict[str, Any]]) -> None:
    """The doctor and sweep sessions, newest first; one opens on the Session page. The table's
    answers are `short`; under it the newest ones (and the one selected) are written whole, with
    their first recommendations. A session's id says when it started (UTC)."""
    st.subheader("Sessions")
    table = [
        {
            "session": row["session_id"],
            "answer": short(row["answer"], clauses=False),
            "status": row["status"],
            "consumer": row["consumer"],
            "devices": row["devices"],
            "runs": row["runs"],
        }
        for row in rows
    ]
    chosen = opener(table, "session", "runs-sessions")
    whole = rows[:SESSIONS_IN_FULL] + [
        row for row in rows[SESSIONS_IN_FULL:] if row["session_id"] == chosen
    ]
    st.markdown("\n".join(f"- {answer_line(row)}" for row in whole))
    if len(rows) > len(whole):
        st.caption(
            f"The answers of the {SESSIONS_IN_FULL} newest sessions; select another to read its "
            "answer here, or open it on the Session page."
        )


def answer_line(row: dict[str, Any]) -> str:
    """A session's answer whole, in Markdown: its verdict (a sweep's knee), and a doctor's
    first recommendation with its images/s."""
    text = f"**{row['session_id']}**: {common.markdown_text(row['answer'])}"
    if row["recommendation"] != "-":
        text += f"; first recommendation: {common.markdown_text(row['recommendation'])}"
    return text


def opener(
    table: list[dict[str, Any]], what: str, key: str, chars: dict[str, int] | None = None
) -> str | None:
    """A table of runs or sessions, one selectable; a button opens the one selected on its
    page (the Run or Session page; `what` is the id's column and the page's parameter). The
    id of the one selected, if any. `chars`: columns set as wide as so many characters (the
    table sizes the others to what its first rows hold)."""
    event = st.dataframe(
        table,
        key=key,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        column_config={
            column: st.column_config.TextColumn(width=round(CELL_PADDING_PX + CHAR_PX * count))
            for column, count in (chars or {}).items()
        },
    )
    selected = event.selection.rows if event is not None else []
    if not selected:
        return None
    chosen = str(table[selected[0]][what])
    if st.button(f"Open {what} {chosen}", key=f"{key}-open", type="primary"):
        st.switch_page(f"views/{what}.py", query_params={what: chosen})
    return chosen


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
        none = "The one run does not" if len(rows) == 1 else f"None of the {len(rows)} runs"
        st.info(f"{none} match{'' if len(rows) == 1 else 'es'} these filters.")
        return
    table, verdicts = [], {}
    for row in shown:
        verdict = common.diagnosis(db, row["run_id"], common.version_of(row)).verdict
        mark = " (partial)" if verdict.partial else ""
        cell = short(verdict.title, VERDICT_CHARS - len(mark), clauses=False)
        verdicts[cell] = verdict.title
        table.append(
            {
                "run": row["run_id"],
                "verdict": cell + mark,
                IMAGES_PER_S.heading: round(row["images_per_s"]),
                DATA_WAIT.heading: PIPELINE_ONLY_WAIT
                if pipeline_only(row["consumer"])
                else DATA_WAIT.cell(row["data_wait_frac"]),
                "label": short(row["label"] or "", LABEL_CHARS, clauses=False),
            }
        )
    st.caption(
        f"{len(shown)} of {len(rows)} run{'' if len(rows) == 1 else 's'}; select one for its "
        "pipeline, status, consumer and session, and to open it"
    )
    chosen = opener(table, "run", "runs-table", {"verdict": VERDICT_CHARS, "label": LABEL_CHARS})
    if chosen is not None:
        st.caption(run_line(next(row for row in shown if row["run_id"] == chosen)))
    whole = [whole_text(head, title) for head, title in sorted(verdicts.items()) if head != title]
    if whole:  # the verdicts the table shortens
        st.markdown("\n".join(f"- {line}" for line in whole))


def run_line(row: dict[str, Any]) -> str:
    """What the runs' table leaves out of a run: its pipeline, status, consumer, devices,
    session and start."""
    created = row["created"].replace("T", " ").rstrip("Z")
    return common.markdown_text(
        f"{row['run_id']}: {row['pipeline']}, {row['status']}, consumer {row['consumer']} on "
        f"{row['devices']}"
        + (f", of session {row['session_id']}" if row["session_id"] else "")
        + f"; started {created} UTC"
    )


def whole_text(head: str, text: str) -> str:
    """A text a table cell shortens (`short`: `head`), whole in Markdown: what the cell shows
    in bold, then the rest."""
    shown = head.removesuffix("…")
    return f"**{common.markdown_text(shown)}**{common.markdown_text(text[len(shown) :])}"


main()
