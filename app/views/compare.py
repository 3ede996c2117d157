"""Compare: runs side by side, or a sweep or doctor session with its curve and knee."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.metrics import CPU, DATA_WAIT, IMAGES_PER_S
from probe.present import charts as figures
from probe.present.tables import brief_grid, epochs_lines
from probe.store.documents import RunBrief


def compare_runs(db: str, rows: list[dict[str, Any]]) -> None:
    by_id = {row["run_id"]: row for row in rows}
    chosen = st.multiselect(
        "runs (two or more)",
        list(by_id),
        default=list(by_id)[:2],
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
            f"**DataLoader against DALI**: the best DataLoader run {best['torch']:,.0f} images/s, "
            f"the best DALI run {best['dali']:,.0f} ({best['dali'] / best['torch']:.2f}x)."
        )
        if len({b.consumer for b in briefs}) > 1:
            st.caption("These runs fed different consumers: compare runs of one consumer.")


def compare_session() -> None:
    with common.store() as store:
        sessions = store.sessions()
    if not sessions:
        st.info(
            "No sweep or doctor session yet: `probe sweep`, `probe doctor`, or the Launch page."
        )
        return
    chosen = st.selectbox(
        "session",
        [s.session_id for s in sessions],
        key="compare-session",
        format_func=lambda sid: next(
            f"{s.session_id} ({s.status.value}, consumer {s.document.get('consumer')})"
            for s in sessions
            if s.session_id == sid
        ),
    )
    doc = next(s.document for s in sessions if s.session_id == chosen)
    common.export_buttons(common.db_path(), str(chosen), "compare-export")
    doctor = doc["schema"].startswith("feedscope.doctor")
    points = doc["sweep"] if doctor else doc["points"]
    knob = "num_workers" if doctor else doc.get("knob", "num_workers")
    dali = doc.get("dali") or {}
    if points:
        st.plotly_chart(
            figures.sweep_curve(
                points, knob, (doc.get("knee") or {}).get(knob), doc.get("oversubscribed", []),
                dali.get("images_per_s"), dali.get("setting", "DALI"),
            ),
            width="stretch",
            key="compare-sweep",
        )  # fmt: skip
        st.dataframe(
            [
                {
                    knob: p[knob],
                    IMAGES_PER_S.heading: IMAGES_PER_S.cell(
                        p["images_per_s"], p.get("images_per_s_error")
                    ),
                    DATA_WAIT.heading: DATA_WAIT.cell(
                        p["data_wait_frac"], p.get("data_wait_frac_error")
                    ),
                    CPU.heading: CPU.cell(p["cpu_pct"]),
                    "run": p["run_id"],
                }
                for p in points
            ],
            hide_index=True,
            width="stretch",
            key="compare-points",
        )
    for item in doc.get("skipped", []):
        st.caption(f"{knob}={item['setting']} not run: {item['reason']}")
    if doctor and doc["verdict"] is None:
        st.warning(f"No answer: {doc['reason']}")
    elif doctor:
        verdict = doc["verdict"]
        trusted = "" if verdict.get("reliable", True) else "; not trusted: the host was busy"
        st.markdown(f"**Verdict**: {verdict['title']} ({verdict['severity']}{trusted})")
        st.markdown("\n".join(f"- {item['text']}" for item in verdict["evidence"]))
        for line in epochs_lines(doc.get("epochs")):
            st.markdown(line)
        if dali.get("images_per_s") is not None:
            st.markdown(
                f"**DataLoader against DALI**: best DataLoader {doc['knee']['images_per_s']:,.0f} "
                f"images/s at the knee; {dali['setting']} {dali['images_per_s']:,.0f} images/s"
                + (f". {dali['advice']}" if dali.get("advice") else "")
            )
        for rank, item in enumerate(doc["recommendations"], 1):
            verified = item.get("measured_images_per_s")
            predicted = item["predicted_images_per_s"]
            shown = (
                "not predicted"
                if predicted is None
                else f"predicted {IMAGES_PER_S.text(predicted, item.get('predicted_error'))}"
            )
            st.markdown(
                f"{rank}. `{item['setting']}`: {item['action']}; {shown}"
                + (f", verified {verified:,.0f}" if verified is not None else "")
            )


@common.page
def main() -> None:
    st.title("Compare")
    mode = str(
        st.radio(
            "compare", ["runs", "a sweep or doctor session"], horizontal=True, key="compare-mode"
        )
    )
    if mode == "runs":
        rows = common.runs_listing(common.db_path())
        if len(rows) < 2:
            st.info("Two or more runs are needed to compare.")
            return
        compare_runs(common.db_path(), rows)
    else:
        compare_session()


main()
