"""Live: the probes running now, refreshed every second from the store (every 3 s, in words
unless asked for charts, on a host of 4 cores or fewer: see SMALL_HOST).

One fragment reruns each second and decides what to show: the run recording now (per GPU its
busy-ness, hardware JPEG decoder and memory; per host CPU per core and the run's processes; per
lane images/s, batch latency and data-wait, reading only the rows recorded since its last
read); for a doctor or sweep, the points measured so far, from one to the next, and when the
session ends, its answer on the Session page; else the probes starting (the sample data's
progress, what they print) and how the last ones ended.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.measure.devices import host_cores
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present import charts as figures
from probe.present import launch
from probe.present.listing import running_runs
from probe.present.progress import last_progress
from probe.present.tables import pipeline_only
from probe.records import LaunchRecord, RunRecord
from probe.store.series import LiveSeries

# On a small host the page's own drawing (the server's and the browser's) takes CPU the probe
# needs, enough for the probe to judge its host busy (0.5 of 2 cores, measured with the charts
# redrawn every second): there, by default, the page tells the progress in words, less often.
SMALL_HOST_CORES = 4
CORES = host_cores()
SMALL_HOST = CORES <= SMALL_HOST_CORES
REFRESH_S = 3.0 if SMALL_HOST else 1.0


def follow(run: RunRecord, charts: bool) -> None:
    """A run recording now: its processes, and with `charts` its timelines, read
    incrementally."""
    key = f"live-{run.run_id}"
    if key not in st.session_state:
        st.session_state[key] = LiveSeries(run.run_id)
    live: LiveSeries = st.session_state[key]
    with common.store() as store:
        live.update(store)
        series = live.series(store)
    label = f" [{run.label}]" if run.label else ""
    st.info(f"Recording run {run.run_id}: {run.pipeline}, consumer {run.consumer}{label}")
    if series is None:
        st.caption("Waiting for the first samples (the lanes are starting).")
        return
    latest = [
        f"lane {lane}: {cpu / 100:.1f} cores, training loop {main:.0f}%, {processes} "
        f"process{'' if processes == 1 else 'es'}, {threads} thread{'' if threads == 1 else 's'}"
        for lane, (cpu, main, processes, threads) in sorted(live.processes.items())
    ]
    if latest:
        st.caption("Processes now: " + "; ".join(latest))
    if not charts:
        return
    phases = figures.run_phases(series)  # none once the window leaves the run's start
    capacity = pipeline_only(run.consumer)
    st.plotly_chart(
        figures.lane_timelines(series, phases, capacity), width="stretch", key=f"{key}-lanes"
    )
    st.plotly_chart(figures.throughput_timelines(series, phases), width="stretch", key=f"{key}-tp")
    if series.gpus:
        st.plotly_chart(figures.gpu_timelines(series, phases), width="stretch", key=f"{key}-gpu")
    if series.cpu is not None:
        strip = figures.cpu_heat_strip(series.cpu, series.span_s, phases)
        st.plotly_chart(strip, width="stretch", key=f"{key}-cpu")


def session_progress(session_id: str, now: RunRecord | None) -> None:
    """A session still measuring: the points it measured so far, and what it measures now."""
    rows = [r for r in common.runs_listing(common.db_path()) if r["session_id"] == session_id]
    done = [r for r in reversed(rows) if now is None or r["run_id"] != now.run_id]
    what = "doctor" if session_id.startswith("doctor-") else "sweep"
    step = f"measuring {now.label or now.pipeline}" if now is not None else "between points"
    count = f"{len(done)} point{'' if len(done) == 1 else 's'}"
    st.markdown(f"**{what.capitalize()} session {session_id}**: {count} so far; {step}")
    if done:  # in words, each whole (a table's cells are cut to its columns)
        st.markdown("\n".join(f"- {point_line(r)}" for r in done))


def point_line(row: dict[str, Any]) -> str:
    """A session's point measured, in Markdown: its setting, images/s and data-wait, how it
    ended, its run."""
    wait = f"{DATA_WAIT.label} {DATA_WAIT.text(row['data_wait_frac'])}"
    what = common.markdown_text(row["label"] or row["pipeline"])
    return (
        f"**{what}**: {IMAGES_PER_S.text(row['images_per_s'])}, {wait} "
        f"({row['status']}, run {row['run_id']})"
    )


def launch_state(launches: list[LaunchRecord]) -> bool:
    """The probes starting, and the last ones that ended (with why, where they failed);
    whether there was anything to show."""
    seen: set[str] = st.session_state.setdefault("live-launches", set())
    starting = [x for x in launches if x.status.value == "running"]
    seen.update(x.launch_id for x in starting)
    # those seen running here, and the newest where it failed: its reason, on any later visit
    newest_failed = launches[:1] if launches and launches[0].status.value == "failed" else []
    ended = [
        x
        for x in launches
        if x.status.value != "running" and (x.launch_id in seen or x in newest_failed)
    ]
    for item in starting:
        log = launch.log_tail(item, 12)
        progress = last_progress(log)
        st.info(f"{item.launch_id} (probe {item.command}) is starting; this page follows it.")
        if progress is not None and progress.done < progress.total:
            st.progress(progress.share, text=progress.line)
        st.code(log or "(nothing printed yet)", language=None, wrap_lines=True)
    for item in ended[:3]:
        if item.status.value == "failed":
            common.launch_failed(item, "live")
            continue
        exit_code = "" if item.exit_code is None else f", exit {item.exit_code}"
        message = f"{item.launch_id} ended ({item.status.value}{exit_code})."
        (st.success if item.status.value == "completed" else st.warning)(message)
    return bool(starting or ended)


def pick(running: list[RunRecord]) -> RunRecord:
    """The run to follow: the newest, where the runs are one probe's (a session's point ends
    as its next starts); else the one chosen."""
    if len({run.session_id or run.run_id for run in running}) == 1:
        return running[0]  # newest first
    by_id = {run.run_id: run for run in running}
    chosen = st.selectbox(
        "recording now",
        list(by_id),
        key="live-pick",
        format_func=lambda run_id: (
            f"{run_id}: {by_id[run_id].pipeline}, "
            f"{by_id[run_id].consumer}"
            + (f" [{by_id[run_id].label}]" if by_id[run_id].label else "")
        ),
    )
    return by_id[str(chosen)]


@st.fragment(run_every=REFRESH_S)
@common.page
def live() -> None:
    state = st.session_state
    with common.store() as store:
        running = running_runs(store)
        launches = launch.launches(store)
        session_id = state.get("live-session")
        ended = None
        if session_id and not running and session_id in {s.session_id for s in store.sessions()}:
            ended = session_id
        last_run = state.get("live-run")
        last = store.run(last_run) if last_run and not running else None
    if running:
        run = pick(running)
        state["live-run"] = run.run_id
        if run.session_id is not None:
            state["live-session"] = run.session_id
            session_progress(run.session_id, run)
        else:
            state.pop("live-session", None)
        follow(run, bool(state.get("live-charts", not SMALL_HOST)))
        return
    if ended is not None:  # the session answered: land on its answer, once
        if state.get("live-landed") != ended:
            state["live-landed"] = ended
            st.switch_page("views/session.py", query_params={"session": ended})
        st.success(f"Session {ended} ended.")
        st.page_link("views/session.py", label="Open its answer", query_params={"session": ended})
    elif session_id and any(x.status.value == "running" for x in launches):
        session_progress(session_id, None)
    elif last is not None and last.session_id is None:
        (st.success if last.status.value == "completed" else st.warning)(
            f"Run {last.run_id} ended ({last.status.value})."
        )
        st.page_link(
            "views/run.py", label=f"Open run {last.run_id}", query_params={"run": last.run_id}
        )
    if not launch_state(launches) and ended is None and last is None:
        st.info("No probe is running now.")
        st.page_link("views/launch.py", label="Start one on the Launch page")


@common.page
def main() -> None:
    st.title("Live")
    if SMALL_HOST:
        st.toggle(
            "live charts",
            value=False,
            key="live-charts",
            help=f"This host has {CORES} core{'' if CORES == 1 else 's'}: drawing the charts "
            "every second takes CPU the probe needs, and it would judge its host busy. Without "
            f"them the page tells the progress every {REFRESH_S:g} s; the Run page draws every "
            "chart after.",
        )
    live()


main()
