"""Session: a doctor's or a sweep's answer, as `probe show SESSION` gives it.

A doctor: is the GPU starved, why, and what to change (the recommendations, measured, and the
first one run again: "verified" only where it held), with the DataLoader against DALI. Then the
points it measured (the curve its first run predicted told in words under them), its runs (each
opens on the Run page) and the exports.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.judge.changes import workers
from probe.judge.results import Session, SessionKind, Shown
from probe.metrics import DATA_WAIT, IMAGES_PER_S, counted, job_scope
from probe.present import charts as figures
from probe.present.doctor_tables import (
    dali_grid,
    doctor_notes,
    scaling_grid,
    scaling_lines,
)
from probe.present.tables import (
    curve_lines,
    measured_again,
    point_grid,
    verification_summary,
)


def describe(row: dict[str, Any]) -> str:
    return f"{row['session_id']}  {row['kind']}, consumer {row['consumer']}, {row['status']}"


def tile(
    column: Any, label: str, setting: str, value: str, help: str, delta: str | None = None
) -> None:
    """A figure side by side with others: a short label (a metric's is cut to one line), the
    figure, and under it the setting it is of, whole, wrapped where it is long."""
    column.metric(label, value, delta=delta, help=help)
    column.caption(common.markdown_text(setting))


def cell(figure: Shown) -> str:
    return IMAGES_PER_S.cell(figure.images_per_s, figure.error)


def answer(session: Session) -> None:
    """The doctor's verdict, its figures side by side, and what to change."""
    verdict = session.verdict
    if verdict is None:
        st.warning(f"No answer: {session.reason}")
        return
    common.verdict_box(verdict)
    st.markdown("\n".join(f"- {common.markdown_text(item.text)}" for item in verdict.evidence))
    yours = next((p for p in session.points if p.run_id == session.verdict_run_id), None)
    best, dali = session.best, session.dali
    top = session.recommendations[0] if session.recommendations else None
    scope = job_scope(session.devices)  # whose images/s: the job's, on several lanes
    agreed = session.verify is None or session.verify.verified
    # one figure a setting: the settings measured in alternation their runs pooled
    # (`Session.shown`, the answer's too), "no change" one tile, and the best is not yours again
    kept = top is not None and yours is not None and top.change == workers(yours.setting)
    cols = st.columns(4)
    if yours is not None and not kept:
        mine = session.shown(workers(yours.setting).setting)
        assert mine is not None  # measured
        tile(
            cols[0], "yours", f"num_workers={yours.setting}", cell(mine),
            help=f"images/s{scope}, {mine.source}; {DATA_WAIT.label} "
            f"{DATA_WAIT.text(yours.data_wait_frac)} (run {yours.run_id})",
        )  # fmt: skip
    if best is not None and yours is not None and best.setting != yours.setting:
        theirs = session.shown(workers(best.setting).setting)
        assert theirs is not None  # measured
        tile(
            cols[1], "best DataLoader", f"num_workers={best.setting}", cell(theirs),
            help=f"images/s{scope}, the best setting the doctor measured; {theirs.source}",
        )  # fmt: skip
    if dali is not None:
        measured = session.shown(dali.change.setting) if dali.judged else None
        tile(
            cols[2], "DALI", f"{dali.decoder} decoder, {counted(dali.num_threads, 'thread')}"
            + ("" if dali.hw_decoder_load is None else f", share {dali.hw_decoder_load:g}"),
            "not measured" if measured is None else cell(measured),
            help=dali.reason or f"images/s{scope}, DALI on the same lanes and consumer"
            + ("" if measured is None else f"; {measured.source}"),
        )  # fmt: skip
    if top is not None and top.predicted_images_per_s is not None:
        figure = IMAGES_PER_S.cell(top.predicted_images_per_s, top.predicted_error)
        what = f"images/s{scope} predicted ({top.basis})"  # its runs in alternation, if any
        tile(
            cols[3] if not kept else cols[0],
            "yours, the answer" if kept else "recommended", top.setting, figure,
            # a delta's arrow reads its sign: only a verified figure has one
            delta=measured_again(top, agreed, delta=True) if agreed else None,
            help=f"{what}; verified: run again, known within the precision asked, and agreeing"
            + ("" if agreed else f"; {measured_again(top, agreed) or 'not run again'}"),
        )  # fmt: skip
    if session.recommendations or session.asides:
        summary = verification_summary(session)
        st.markdown(f"**Recommendations** (measured by the doctor; {summary})")
        common.recommendation_list(session.recommendations, session.asides, scope, agreed)
    notes = doctor_notes(session)
    if notes:
        st.markdown("\n".join(f"- {common.markdown_text(line)}" for line in notes))
    if dali is not None and len(dali.tried) > 1:
        st.markdown("**DALI's settings searched** (each chosen by what the ones before measured)")
        st.dataframe(
            dali_grid(dali, session.devices).records(), hide_index=True, width="stretch",
            key="session-dali-search",
        )  # fmt: skip
    if session.scaling is not None:
        scaling = session.scaling
        st.markdown(f"**From 1 {scaling.device} to {scaling.lanes}** (on this host's cores)")
        st.plotly_chart(figures.scaling_chart(scaling), width="stretch", key="session-scaling")
        st.dataframe(
            scaling_grid(scaling).records(), hide_index=True, width="stretch",
            key="session-scaling-table",
        )  # fmt: skip
        st.caption("  \n".join(common.markdown_text(line) for line in scaling_lines(scaling)))


def points(session: Session) -> None:
    """The settings measured, with the curve predicted from the first one told under them."""
    st.subheader(f"The {session.knob} settings measured")
    if len(session.points) == 1:  # the chart's one point, and why no other
        why = "; ".join(sorted({item.reason for item in session.skipped}))
        st.caption(
            common.markdown_text(
                "One setting measured, yours"
                + (f"; the others were not measured: {why}" if why else "")
            )
        )
    if session.points:
        st.plotly_chart(figures.sweep_curve(session), width="stretch", key="session-curve")
    grid = point_grid(session)
    if grid.rows:
        st.dataframe(grid.records(), hide_index=True, width="stretch", key="session-points")
    lines = curve_lines(session)
    if lines:
        st.caption("  \n".join(common.markdown_text(line) for line in lines))


def runs(session: Session, rows: list[dict[str, Any]]) -> None:
    """The session's runs; each opens on the Run page."""
    mine = [row for row in rows if row["session_id"] == session.session_id]
    if not mine:
        return
    st.subheader("Its runs")
    st.dataframe(
        [
            {
                "run": row["run_id"],
                "what": row["label"] or "",
                "pipeline": row["pipeline"],
                IMAGES_PER_S.heading: IMAGES_PER_S.cell(row["images_per_s"]),
                DATA_WAIT.heading: DATA_WAIT.cell(row["data_wait_frac"]),
                "status": row["status"],
            }
            for row in mine
        ],
        hide_index=True,
        width="stretch",
        key="session-runs",
    )
    for row in mine:
        st.page_link(
            "views/run.py",
            label=f"Open run {row['run_id']} ({row['label'] or row['pipeline']})",
            query_params={"run": row["run_id"]},
        )


@common.page
def main() -> None:
    st.title("Session")
    db = common.db_path()
    rows = common.sessions_listing(db)
    if not rows:
        st.info("No doctor or sweep session yet: start one on the Runs or the Launch page.")
        return
    session_id = common.pick(rows, "session", describe)
    row = next(r for r in rows if r["session_id"] == session_id)
    session = common.session(db, session_id, row["status"])
    kind = "doctor" if session.kind is SessionKind.DOCTOR else f"sweep of {session.knob}"
    st.subheader(f"{session.session_id}: {kind}, consumer {session.consumer}")
    created = session.created.replace("T", " ").rstrip("Z")
    devices = ", ".join(session.devices) or "-"
    st.caption(
        f"created {created} UTC on {devices}; {session.status.value}"
        + (f": {session.reason}" if session.reason else "")
        + f"; took {session.elapsed_s:,.0f} s of a {session.budget_s:,.0f} s budget"
    )
    if session.kind is SessionKind.DOCTOR:
        answer(session)
    points(session)
    runs(session, common.runs_listing(db))
    st.markdown("**Export** (the same reports as `probe report`)")
    common.export_buttons(db, session_id, row["status"], "session-export")


main()
