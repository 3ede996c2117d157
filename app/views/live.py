"""Live: the probes running now, refreshed every second from the store.

A fragment reruns each second and reads only the rows recorded since its last read: per GPU its
busy-ness, hardware JPEG decoder and memory; per host CPU per core and the run's processes; per
lane images/s, batch latency and data-wait, over the last five minutes.
"""

from __future__ import annotations

import streamlit as st

from app import common
from probe.present import charts as figures
from probe.present import launch
from probe.present.listing import running_runs
from probe.store.series import LiveSeries


@st.fragment(run_every=1.0)
@common.page
def follow(run_id: str) -> None:
    key = f"live-{run_id}"
    if key not in st.session_state:
        st.session_state[key] = LiveSeries(run_id)
    live: LiveSeries = st.session_state[key]
    with common.store() as store:
        live.update(store)
        series = live.series(store)
        status = store.run(run_id).status.value
        others = [run for run in running_runs(store) if run.run_id != run_id]
    if status != "running":
        if others:
            st.rerun()  # the next run of a sweep, or another probe: follow it
        (st.success if status == "completed" else st.warning)(f"Run {run_id} ended ({status}).")
        st.page_link("views/run.py", label=f"Open run {run_id}", query_params={"run": run_id})
    if series is None:
        st.info("Waiting for the first samples (the lanes are starting).")
        return
    latest = [
        f"lane {lane}: {cpu / 100:.1f} cores, training loop {main:.0f}%, {processes} "
        f"processes, {threads} threads"
        for lane, (cpu, main, processes, threads) in sorted(live.processes.items())
    ]
    if latest:
        st.caption("Processes now: " + "; ".join(latest))
    st.plotly_chart(figures.lane_timelines(series), width="stretch", key=f"{key}-lanes")
    st.plotly_chart(figures.throughput_timelines(series), width="stretch", key=f"{key}-tp")
    if series.gpus:
        st.plotly_chart(figures.gpu_timelines(series), width="stretch", key=f"{key}-gpu")
    if series.cpu is not None:
        st.plotly_chart(
            figures.cpu_heat_strip(series.cpu, series.span_s), width="stretch", key=f"{key}-cpu"
        )


@st.fragment(run_every=1.0)
@common.page
def waiting() -> None:
    """Nothing records yet: the launched probes starting (what they print), until a run
    records (then the page follows it) or the launch ends (then how it ended)."""
    with common.store() as store:
        if running_runs(store):
            st.rerun()
        launches = launch.launches(store)
    seen: set[str] = st.session_state.setdefault("live-launches", set())
    starting = [x for x in launches if x.status.value == "running"]
    seen.update(x.launch_id for x in starting)
    ended = [x for x in launches if x.launch_id in seen and x.status.value != "running"]
    if not starting and not ended:
        st.info("No probe is running now.")
        st.page_link("views/launch.py", label="Start one on the Launch page")
        return
    for item in starting:
        st.info(f"{item.launch_id} is starting; this page follows it as soon as it records.")
        st.code(launch.log_tail(item, 12) or "(nothing printed yet)", language=None)
    for item in ended[:3]:
        exit_code = "" if item.exit_code is None else f", exit {item.exit_code}"
        st.warning(f"{item.launch_id} ended ({item.status.value}{exit_code}).")
        st.code(launch.log_tail(item, 12) or "(it printed nothing)", language=None)
    if ended:
        st.page_link("views/runs.py", label="See its runs on the Runs page")


@common.page
def main() -> None:
    st.title("Live")
    with common.store() as store:
        running = running_runs(store)
    if not running:
        waiting()
        return
    ids = [run.run_id for run in running]
    chosen = st.selectbox(
        "running now",
        ids,
        key="live-pick",
        format_func=lambda run_id: next(
            f"{r.run_id}: {r.pipeline}, {r.consumer}" + (f" [{r.label}]" if r.label else "")
            for r in running
            if r.run_id == run_id
        ),
    )
    follow(str(chosen))  # ids is not empty: a run is chosen


main()
