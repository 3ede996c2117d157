"""Run: one run, its lanes on one time axis, its diagnosis, config and host, exports.

Under the lanes table, where each image's CPU time goes (where the lanes timed their stages);
in the lanes' timelines of a run of several, the worst rank's data-wait and which lane it was,
and under them how often each lane was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import streamlit as st

from app import common
from probe import InputError
from probe.judge.changes import Recommendation
from probe.judge.diagnosis import RunDiagnosis
from probe.metrics import DATA_WAIT, IMAGES_PER_S, job_scope
from probe.present import charts as figures
from probe.present import launch
from probe.present.offer import migrate_offer, tune_line
from probe.present.options import reproduce_command, watched_folder
from probe.present.tables import (
    PIPELINE_ONLY_WAIT,
    headline,
    lane_grid,
    pipeline_only,
    run_devices,
    run_notes,
)
from probe.store.documents import RunDocument
from probe.store.series import slowest_lanes


def describe(row: dict[str, Any]) -> str:
    label = f"  [{row['label']}]" if row["label"] else ""
    return f"{row['run_id']}  {row['pipeline']}, {row['consumer']}, {row['status']}{label}"


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
    if pipeline_only(doc.consumer):  # no consumer: its capacity, and nothing starves
        cols[0].metric(
            f"capacity, {IMAGES_PER_S.heading}, all lanes", IMAGES_PER_S.cell(doc.images_per_s)
        )
        cols[1].metric(
            DATA_WAIT.label,
            PIPELINE_ONLY_WAIT,
            help="With no consumer the loop only waits for data: that is the pipeline's "
            "capacity at work, not starvation. Give a consumer (model:NAME or sleep:MS), or run "
            "the doctor, to see whether a training step would starve.",
        )
    else:
        cols[0].metric(f"{IMAGES_PER_S.heading}, all lanes", IMAGES_PER_S.cell(doc.images_per_s))
        cols[1].metric(f"{DATA_WAIT.label}, worst lane", DATA_WAIT.cell(doc.data_wait_frac))
    cols[2].metric("lanes", len(doc.lanes))
    cols[3].metric("run took", "-" if doc.seconds is None else f"{doc.seconds:,.1f} s")
    st.dataframe(lane_grid(doc).records(), hide_index=True, width="stretch", key="run-lanes")
    notes = run_notes(doc)
    if notes:
        st.caption("  \n".join(notes))
    for lane in doc.lanes:
        if lane.traceback:
            with st.expander(f"lane {lane.lane}: where it failed (traceback)"):
                st.code(lane.traceback, language="text")
    stages = figures.stage_bars(doc.lanes)
    if stages is not None:
        st.plotly_chart(stages, width="stretch", key="run-stages")
        st.caption(figures.stage_line(doc.lanes) or "")


def diagnosis(diag: RunDiagnosis, session_id: str | None, scope: str = "") -> None:
    """A run's verdict, its findings and what to change (`scope`: whose images/s)."""
    st.subheader("Diagnosis")
    verdict = replace(diag.verdict, partial=diag.partial)
    common.verdict_box(verdict)
    st.markdown("\n".join(f"- {common.markdown_text(item.text)}" for item in verdict.evidence))
    for finding in diag.findings:
        st.warning(
            common.markdown_text(headline(finding))
            + ": "
            + "; ".join(common.markdown_text(i.text) for i in finding.evidence)
        )
    if session_id is not None:
        st.page_link(
            "views/session.py",
            label=f"This run is a point of session {session_id}, whose verdict governs (it "
            "weighs every point, and the host while they ran): open its answer",
            query_params={"session": session_id},
        )
    if diag.recommendations or diag.asides:
        basis = "from this run alone"
        if diag.answered_by is not None:
            basis = f"the doctor session's, measured: {diag.answered_by}"
        st.markdown(f"**Recommendations** ({basis})")
        common.recommendation_list(diag.recommendations, diag.asides, scope, diag.verified)


def like_offer(doc: RunDocument) -> None:
    """A watched job's what-if, measured on its own files: the doctor run like it, with the
    click that starts it; where its dataset named no files, what to pass instead."""
    st.markdown("**Measure the changes on this job's own files**")
    try:
        folder = watched_folder(doc)
    except InputError as error:
        st.caption(f"{error}: `probe doctor --data DIR` measures them there.")
        return
    st.caption(
        "The doctor measures the DataLoader's workers and DALI on the files this job read, "
        "with its batch size, image size and measured step as the consumer: what each change "
        "would give your script."
    )
    st.code(f"probe doctor --like {doc.run_id}", language="bash")
    if st.button("Run the doctor like this job", key="run-like"):
        gpus = tuple(sorted({lane.gpu for lane in doc.lanes if lane.gpu is not None})) or None
        form = launch.LaunchForm(
            command="doctor", gpus=gpus, data_dir=str(folder),
            flags={"like": doc.run_id},
        )  # fmt: skip
        try:
            with common.store() as store:
                launch.start(store, form)
        except InputError as error:
            st.error(str(error))
            return
        st.switch_page("views/live.py")


def migrate_lines(
    doc: RunDocument, recommendations: Sequence[Recommendation], tuned: str | None = None
) -> None:
    """Where DALI or feedscope's DataLoader recipe is the answer for a watched DataLoader: the
    command that writes its loader, and the line of the script to change."""
    offer = migrate_offer(doc, recommendations, tuned)
    tune = tune_line(doc, tuned)
    knob = recommendations[0].change.knob if recommendations else None
    if offer is None and tune and (knob is not None or tuned):
        st.caption(tune)
    if offer is not None:
        st.markdown(f"**Write this loader as {offer.what}**")
        st.code(offer.command, language="bash")
        st.caption(offer.change)
        if offer.tune:
            st.caption(offer.tune)


@common.page
def main() -> None:
    st.title("Run")
    db = common.db_path()
    rows = common.runs_listing(db)
    if not rows:
        st.info("No runs yet: start one on the Launch page, or from the Runs page.")
        return
    run_id = common.pick(rows, "run", describe)
    row = next(r for r in rows if r["run_id"] == run_id)
    version = common.version_of(row, str(db))
    view = common.run_view(db, run_id, version)
    doc = view["document"]
    header(doc)
    diagnosis(view["diagnosis"], row["session_id"], job_scope(run_devices(doc)))
    if doc.kind == "watch":
        what_if = view["diagnosis"].what_if
        if what_if is None:
            like_offer(doc)
        else:  # measured already: quoted, not offered again
            st.markdown("**The changes, measured on this job's own files**")
            st.caption(common.markdown_text(what_if))
        migrate_lines(doc, view["diagnosis"].recommendations, view["tuned"])

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
        drawn = figures.run_figures(
            series, view["histogram"], doc.lanes, pipeline_only(doc.consumer)
        )
        for index, figure in enumerate(drawn):
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
        command = reproduce_command(doc, of_session=row["session_id"] is not None)
        if command is not None:
            st.code(command, language="bash")
        st.json(dict(doc.config))
    with st.expander("Host"):
        st.json(dict(doc.host))
    st.markdown("**Export** (the same reports as `probe report`)")
    common.export_buttons(db, run_id, version, "run-export")


main()
