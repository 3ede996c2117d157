"""Compare: runs side by side."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.judge.results import Session, SessionKind
from probe.present import charts as figures
from probe.present.doctor_tables import dataloader_against_dali
from probe.present.tables import brief_grid
from probe.store.documents import RunBrief


def opening(rows: list[dict[str, Any]]) -> list[str]:
    """The runs Compare opens on: the newest session's, all of them, where the newest run is a
    session's point; else the newest two."""
    session = rows[0]["session_id"]
    chosen = [row["run_id"] for row in rows if session and row["session_id"] == session]
    return chosen if len(chosen) >= 2 else [row["run_id"] for row in rows[:2]]


def doctor_session(db: str, rows: list[dict[str, Any]]) -> Session | None:
    """The doctor session every one of these runs belongs to; None where they are not all one
    doctor session's."""
    ids = {row["session_id"] for row in rows}
    if len(ids) != 1 or None in ids:
        return None
    (session_id,) = ids
    listed = next((r for r in common.sessions_listing(db) if r["session_id"] == session_id), None)
    if listed is None or listed["kind"] != SessionKind.DOCTOR.value:
        return None
    return common.session(db, session_id, listed["status"])


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
    try:
        st.plotly_chart(figures.compare_bars(briefs), width="stretch", key="compare-bars")
    except ValueError as error:  # a figure that cannot be: said, not drawn
        st.warning(str(error))
    names = figures.bar_names(briefs)
    table = [  # each run named as its bars are (its label, in the name), its id beside
        {"run": name, "run id": brief.run}
        | {column: cell for column, cell in row.items() if column not in ("run", "setting")}
        for name, brief, row in zip(names, briefs, brief_grid(briefs).records(), strict=True)
    ]
    st.dataframe(table, hide_index=True, width="stretch", key="compare-table")
    pipelines = {b.pipeline for b in briefs}
    if pipelines == {"torch", "dali"}:
        session = doctor_session(db, [by_id[run_id] for run_id in chosen])
        line = None if session is None else dataloader_against_dali(session)
        if session is not None and line is not None:
            st.markdown(
                f"**DataLoader against DALI**, as doctor session {session.session_id} "
                "measured them (the figures of its Session page; its runs again, to verify or "
                f"in turn, are not counted as rivals): {line}."
            )
        else:
            best = {p: max(b.images_per_s for b in briefs if b.pipeline == p) for p in pipelines}
            st.markdown(
                f"**DataLoader against DALI**, of the {len(briefs)} runs shown: the best "
                f"DataLoader run {best['torch']:,.0f} images/s, the best DALI run "
                f"{best['dali']:,.0f} ({best['dali'] / best['torch']:.2f}x)."
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
