"""Run: one run, its lanes on one time axis, its diagnosis, config and host, exports."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe import figures
from probe.steady import plus_minus
from probe.summary import reproduce_command
from probe.terminal import gpu_busy, pct, pct_pm, run_notes


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


def header(doc: dict[str, Any]) -> None:
    st.subheader(f"{doc['run_id']}: {doc['pipeline']}, consumer {doc['consumer']}")
    created = doc["created"].replace("T", " ").rstrip("Z")
    label = f", label {doc['label']}" if doc["label"] else ""
    st.caption(f"created {created} UTC on {doc['host'].get('hostname', '?')}{label}")
    reason = f": {doc['reason']}" if doc["reason"] else ""
    message = f"{doc['status']}{reason}"
    if doc["status"] == "completed":
        st.success(message)
    elif doc["status"] == "running":
        st.info(message + " (figures so far; the Live page follows it)")
    else:
        st.warning(message)
    waits = [x["data_wait_frac"] for x in doc["lanes"] if x["data_wait_frac"] is not None]
    cols = st.columns(4)
    cols[0].metric("images/s, all lanes", f"{doc['images_per_s']:,.0f}")
    cols[1].metric("worst data-wait", pct(max(waits) if waits else None))
    cols[2].metric("lanes", len(doc["lanes"]))
    seconds = doc["seconds"]
    cols[3].metric("run took", "-" if seconds is None else f"{seconds:,.1f} s")
    st.dataframe(
        [
            {
                "lane": x["lane"],
                "device": "cpu" if x["gpu"] is None else f"cuda:{x['gpu']}",
                "shard": f"{x['shard_id']}/{x['num_shards']}",
                "status": x["status"],
                "batches": x["batches"],
                "images/s": plus_minus(x["images_per_s"], x.get("images_per_s_error")),
                "data-wait": pct_pm(x["data_wait_frac"], x.get("data_wait_frac_error")),
                "latency p50/p95/p99 ms": "/".join(
                    "-" if x["batch_latency_ms"][k] is None else f"{x['batch_latency_ms'][k]:.1f}"
                    for k in ("p50", "p95", "p99")
                ),
                "GPU busy": gpu_busy(x),
                "CPU cores": "-" if x.get("cpu_pct") is None else f"{x['cpu_pct'] / 100:.1f}",
                "reason": x["reason"] or "",
            }
            for x in doc["lanes"]
        ],
        hide_index=True,
        width="stretch",
        key="run-lanes",
    )
    notes = run_notes(doc)
    if notes:
        st.caption("  \n".join(notes))


def diagnosis(diag: dict[str, Any], session: dict[str, Any] | None) -> None:
    st.subheader("Diagnosis")
    verdict = diag["verdict"]
    title = verdict["title"]
    if verdict["severity"] != "none":
        title += f" ({verdict['severity']}: data-wait {pct(verdict['data_wait_frac'])})"
    if diag["partial"]:
        title += " - partial: the run did not complete"
    if verdict.get("reliable") is False:
        title += " - not trusted: the host was busy"
    (st.error if verdict["severity"] == "high" else st.warning if verdict["severity"] ==
     "moderate" else st.success)(title)  # fmt: skip
    st.markdown("\n".join(f"- {item['text']}" for item in verdict["evidence"]))
    for finding in diag["findings"]:
        st.warning(finding["title"] + ": " + "; ".join(i["text"] for i in finding["evidence"]))
    recommendations = diag["recommendations"]
    basis = "from this run alone"
    if session is not None:
        recommendations = session["recommendations"]
        basis = f"from the doctor session {session['session_id']} this run belongs to"
    if recommendations:
        st.markdown(f"**Recommendations** ({basis})")
        st.dataframe(
            [
                {
                    "#": rank,
                    "change": item["setting"],
                    "predicted images/s": "-"
                    if item["predicted_images_per_s"] is None
                    else plus_minus(item["predicted_images_per_s"], item.get("predicted_error")),
                    "verified images/s": _round(item.get("measured_images_per_s")),
                    "what": item["action"],
                    "basis": item["basis"],
                    "notes": "; ".join(item.get("notes", ())),
                }
                for rank, item in enumerate(recommendations, 1)
            ],
            hide_index=True,
            width="stretch",
            key="run-recommendations",
        )


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


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
            session = store.session(row["session_id"]).document
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
        for index, figure in enumerate(figures.run_figures(series, view["histogram"])):
            st.plotly_chart(figure, width="stretch", key=f"run-figure-{index}")
    unavailable = doc["unavailable_metrics"]
    if unavailable:
        st.caption(
            "Unavailable here: "
            + "; ".join(f"{u['metric']} ({u['reason']})" for u in unavailable[:12])
        )
    with st.expander("Configuration (to reproduce the run)"):
        command = reproduce_command(doc)
        if command is not None:
            st.code(command, language="bash")
        st.json(doc["config"])
    with st.expander("Host"):
        st.json(doc["host"])
    st.markdown("**Export** (the same reports as `probe report`)")
    common.export_buttons(db, run_id, "run-export")


main()
