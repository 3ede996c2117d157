"""Compare: runs side by side."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.present import charts as figures
from probe.present.tables import brief_grid
from probe.store.documents import RunBrief


def opening(rows: list[dict[str, Any]]) -> list[str]:
    """The runs Compare opens on: the newest session's, all of them, where the newest run is a
    session's point; else the newest two."""
    session = rows[0]["session_id"]
    chosen = [row["run_id"] for row in rows if session and row["session_id"] == session]
    return chosen if len(chosen) >= 2 else [row["run_id"] for row in rows[:2]]


def compare_runs(db: str, rows: list[dict[str, Any]]) -> None:
    by_id = {row["run_id"]: row for row in rows}
    chosen = st.multiselect(
        "runs (two or more)",
        list(by_id),
        default=opening(rows),
        key="compare-runs",
        format_func=lambda run_id: (
            f"{run_id}  {by_id[run_id]['pipeline']}, "
            f"{by_id[run_id]['consumer']}"
            + (f" [{by_id[run_id]['label']}]" if by_id[run_id]["label"] else "")
        ),
    )
    if len(chosen) < 2:
        st.info("Pick two or more runs.")
        return
    briefs = [
        RunBrief.of(common.document(db, run_id, common.version_of(by_id[run_id])))
        for run_id in chosen
    ]
    st.plotly_chart(figures.compare_bars(briefs), width="stretch", key="compare-bars")
    st.dataframe(
        brief_grid(briefs).records(), hide_index=True, width="stretch", key="compare-table"
    )
    pipelines = {b.pipeline for b in briefs}
    if pipelines == {"torch", "dali"}:
        best = {p: max(b.images_per_s for b in briefs if b.pipeline == p) for p in pipelines}
        st.markdown(
            f"**DataLoader against DALI**, of the {len(briefs)} runs shown: the best DataLoader "
            f"run {best['torch']:,.0f} images/s, the best DALI run {best['dali']:,.0f} "
            f"({best['dali'] / best['torch']:.2f}x)."
        )
        if len({b.consumer for b in briefs}) > 1:
            st.caption("These runs fed different consumers: compare runs of one consumer.")


@common.page
def main() -> None:
    st.title("Compare")
    st.caption("Doctor and sweep sessions, with their curves, open on the Session page.")
    rows = common.runs_listing(common.db_path())
    if len(rows) < 2:
        st.info("Two or more runs are needed to compare.")
        return
    compare_runs(common.db_path(), rows)


main()
