"""Launch: start `probe run`, `probe sweep` or `probe doctor`, each a process of its own,
tracked in the store; stop it; see what it printed."""

from __future__ import annotations

import streamlit as st

from app import common
from probe.measure.devices import cuda_devices
from probe.present import launch
from probe.present import options as flags


def form() -> launch.LaunchForm | None:
    devices = cuda_devices()
    options = ["CPU"] + [f"GPU {d.index} ({d.name})" for d in devices]
    command = str(st.radio("command", list(launch.COMMANDS), horizontal=True, key="launch-command"))
    with st.form("launch-form"):
        chosen = st.multiselect(
            "devices (one lane per GPU; or the CPU)",
            options,
            default=options[1:] or ["CPU"],
            key="launch-devices",
        )
        cols = st.columns(3)
        pipeline = str(
            cols[0].selectbox(
                "pipeline", ["torch", "dali"], key="launch-pipeline", disabled=command == "doctor"
            )
        )
        shards = cols[1].number_input(
            "dataset shards (0: one per lane; on the CPU, the lanes)",
            min_value=0,
            value=0,
            step=1,
            key="launch-shards",
        )
        batch_size = cols[2].number_input(
            "batch size", min_value=1, value=flags.GPU_BATCH_SIZE, step=1, key="launch-batch"
        )
        cols = st.columns(3)
        workers = cols[0].number_input(
            "DataLoader workers (0: default)", min_value=0, value=0, step=1, key="launch-workers"
        )
        threads = cols[1].number_input(
            "DALI threads (0: default)", min_value=0, value=0, step=1, key="launch-threads"
        )
        consumer = cols[2].text_input(
            "consumer (none, sleep:MS, model:NAME)",
            value=flags.DOCTOR_CONSUMER if command == "doctor" else "none",
            key="launch-consumer",
        )
        data = st.text_input(
            "dataset folder (empty: the built-in sample data)", key="launch-data"
        ).strip()
        cols = st.columns(3)
        if command == "run":
            duration = cols[0].number_input(
                "seconds measured per lane", min_value=0.5, value=10.0, key="launch-duration"
            )
            label = cols[1].text_input("label", key="launch-label").strip()
            budget = None
        else:
            duration, label = None, ""
            budget = cols[0].number_input(
                "budget, seconds (start-ups included)",
                min_value=1.0,
                value=45.0 if command == "doctor" else flags.SWEEP_BUDGET_S,
                key="launch-budget",
            )
        submitted = st.form_submit_button("Start", type="primary")
    if not submitted:
        return None
    gpus = tuple(int(o.split()[1]) for o in chosen if o.startswith("GPU"))
    if "CPU" in chosen and gpus:
        st.error("Choose GPUs or the CPU, not both.")
        return None
    if not chosen:
        st.error("Choose at least one device.")
        return None
    return launch.LaunchForm(
        command=command,
        pipeline=pipeline,
        gpus=gpus or None,
        num_shards=int(shards) or None,
        data_dir=data or None,
        batch_size=int(batch_size),
        workers=int(workers) or None,
        threads=int(threads) or None,
        consumer=consumer.strip() or "none",
        duration_s=float(duration) if duration is not None else None,
        budget_s=float(budget) if budget is not None else None,
        label=label or None,
    )


@st.fragment(run_every=2.0)
@common.page
def launches() -> None:
    """The launches, newest first, with what each printed last (refreshed every 2 s)."""
    with common.store() as store:
        records = launch.launches(store)
    if not records:
        return
    st.subheader("Launches")
    for record in records[:20]:
        devices = ", ".join("CPU" if d == "cpu" else f"GPU {d}" for d in record.devices)
        title = f"{record.launch_id}: probe {' '.join(record.argv)} - {record.status.value}" + (
            "" if record.exit_code is None else f" (exit {record.exit_code})"
        )
        with st.expander(title, expanded=record.status.value == "running"):
            st.caption(f"devices: {devices}; started {record.created}")
            if record.status.value == "running" and st.button(
                "Stop (keeps what it recorded)", key=f"launch-stop-{record.launch_id}"
            ):
                with common.store() as store:
                    launch.stop(store, record.launch_id)
                st.rerun()
            st.code(launch.log_tail(record) or "(nothing printed yet)", language=None)


@common.page
def main() -> None:
    st.title("Launch")
    st.caption(
        "Each probe runs as a process of its own, recorded in the store: it goes on if this "
        "page is closed. One probe at a time per device: two would measure each other."
    )
    request = form()
    if request is not None:
        problems = launch.check(request)
        if problems:
            for problem in problems:
                st.error(problem)
        else:
            with common.store() as store:
                record = launch.start(store, request)
            st.success(f"Started {record.launch_id}: probe {' '.join(record.argv)}")
            st.page_link("views/live.py", label="Follow it on the Live page")
    launches()


main()
