"""Run: one run, its lanes on one time axis, its diagnosis, config and host, exports.

Under the lanes table, where each image's CPU time goes (where the lanes timed their stages);
under the lanes' timelines of a run of several, which lane waited most for data, and how often.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from app import common
from probe.judge.diagnosis import RunDiagnosis
from probe.judge.results import Session, read_session
from probe.judge.thresholds import Severity
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present import charts as figures
from probe.present.options import reproduce_command
from probe.present.tables import headline, lane_grid, recommendation_grid, run_notes
from probe.store.documents import RunDocument
from probe.store.series import slowest_lanes


def pick_run(rows: list[dict[str, Any]]) -> str | None:
    ids = [row["run_id"] for row in rows]
    wanted = st.query_params.get("run")
    if wanted and wanted not in ids:
        st.warning(f"No run {wanted} in the store; showing the newest.")
        wanted = None
    chosen = st.selectbox(
        "run",
        ids,
        index=ids.index(wanted) if wanted else 0,
        key="run-pick",
        format_func=lambda run_id: next(
            f"{r['run_id']}  {r['pipeline']}, {r['consumer']}, {r['status']}"
            + (f"  [{r['label']}]" if r["label"] else "")
            for r in rows
            if r["run_id"] == run_id
        ),
    )
    if chosen is None:
        return None
    if chosen != st.query_params.get("run"):
        st.query_params["run"] = chosen
    return str(chosen)


def header(doc: RunDocument) -> None:
    st.subheader(f"{doc.run_id}: {doc.pipeline}, consumer {doc.consumer}")
    created = doc.created.replace("T", " ").rstrip("Z")
    label = f", label {doc.label}" if doc.label else ""
    st.caption(f"created {created} UTC on {doc.host.get('hostname', '?')}{label}")
    reason = f": {doc.reason}" if doc.reason else ""
    message = f"{doc.status}{reason}"
    if doc.status == "completed":
        st.success(message)
    elif doc.status == "running":
        st.info(message + " (figures so far; the Live page follows it)")
    else:
        st.warning(message)
    cols = st.columns(4)
    cols[0].metric(f"{IMAGES_PER_S.heading}, all lanes", IMAGES_PER_S.cell(doc.images_per_s))
    cols[1].metric(f"{DATA_WAIT.label}, worst lane", DATA_WAIT.cell(doc.data_wait_frac))
    cols[2].metric("lanes", len(doc.lanes))
    cols[3].metric("run took", "-" if doc.seconds is None else f"{doc.seconds:,.1f} s")
    st.dataframe(lane_grid(doc).records(), hide_index=True, width="stretch", key="run-lanes")
    notes = run_notes(doc)
    if notes:
        st.caption("  \n".join(notes))
    stages = figures.stage_bars(doc.lanes)
    if stages is not None:
        st.plotly_chart(stages, width="stretch", key="run-stages")
        st.caption(figures.stage_line(doc.lanes) or "")


def diagnosis(diag: RunDiagnosis, session: Session | None) -> None:
    st.subheader("Diagnosis")
    verdict = replace(diag.verdict, partial=diag.partial)
    show = {Severity.HIGH: st.error, Severity.MODERATE: st.warning}.get(
        verdict.severity, st.success
    )
    show(headline(verdict))
    st.markdown("\n".join(f"- {item.text}" for item in verdict.evidence))
    for finding in diag.findings:
        st.warning(finding.title + ": " + "; ".join(i.text for i in finding.evidence))
    recommendations = diag.recommendations
    basis = "from this run alone"
    if session is not None:
        recommendations = session.recommendations
        basis = f"from the doctor session {session.session_id} this run belongs to"
    if recommendations:
        st.markdown(f"**Recommendations** ({basis})")
        st.dataframe(
            recommendation_grid(recommendations).records(),
            hide_index=True,
            width="stretch",
            key="run-recommendations",
        )


@common.page
def main() -> None:
    st.title("Run")
    db = common.db_path()
    rows = common.runs_listing(db)
    if not rows:
        st.info("No runs yet: start one on the Launch page, or from the Runs page.")
        return
    run_id = pick_run(rows)
    if run_id is None:
        return
    row = next(r for r in rows if r["run_id"] == run_id)
    version = common.version_of(row)
    view = common.run_view(db, run_id, version)
    doc = view["document"]
    header(doc)
    session = None
    if row["session_id"] and row["session_id"].startswith("doctor-"):
        with common.store() as store:
            session = read_session(store, row["session_id"])
    diagnosis(view["diagnosis"], session)

    series = view["series"]
    if series is None or not any(lane.t_s for lane in series.lanes):
        st.info("No measured batch recorded yet.")
    else:
        if series.bucket_s > 0.15:
            st.caption(
                f"Downsampled to {series.bucket_s:.1f} s intervals: shaded bands run from each "
                "interval's lowest to its highest sample, so peaks and dips stay visible."
            )
        slowest = slowest_lanes(series)
        for index, figure in enumerate(figures.run_figures(series, view["histogram"])):
            st.plotly_chart(figure, width="stretch", key=f"run-figure-{index}")
            if index == 0 and slowest is not None:  # the lanes' timelines come first
                st.caption(figures.slowest_line(slowest))
    unavailable = doc.unavailable_metrics
    if unavailable:
        st.caption(
            "Unavailable here: "
            + "; ".join(f"{u['metric']} ({u['reason']})" for u in unavailable[:12])
        )
    with st.expander("Configuration (to reproduce the run)"):
        command = reproduce_command(doc)
        if command is not None:
            st.code(command, language="bash")
        st.json(dict(doc.config))
    with st.expander("Host"):
        st.json(dict(doc.host))
    st.markdown("**Export** (the same reports as `probe report`)")
    common.export_buttons(db, run_id, "run-export")


main()
