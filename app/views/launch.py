"""Launch: start `probe run`, `probe sweep` or `probe doctor`, each a process of its own,
tracked in the store; stop it; see what it printed, and why it failed.

The form's fields are the command's flags (`probe.present.options.FLAGS`), each opening on
that command's default; a field left at its default is not sent, so the command decides as it
would with no flag.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common
from probe.measure.devices import cuda_devices
from probe.present import launch, options
from probe.records import RunStatus


def key(command: str, flag: options.Flag) -> str:
    """A field's widget key: one per command, so that each command's form opens on its own
    defaults."""
    return f"launch-{command}-{flag.name[2:]}"


PLACEHOLDER_CHARS = 32  # what a field of the form shows whole at 1,400 px


def placeholder(flag: options.Flag) -> str | None:
    """What an empty field means: the command's default, where it fits the field; else a
    pointer to the field's help, which says how the default is decided."""
    note = flag.default if flag.default is not None else flag.default_note
    if note is None:
        return None
    text = f"default: {note}"
    return text if len(text) <= PLACEHOLDER_CHARS else "default: see the ? above"


def field(column: Any, command: str, flag: options.Flag) -> Any:
    """A flag's field, showing `command`'s default; its value, None where that is the default
    (the flag is left out and the command decides, as it would with no flag)."""
    shared: dict[str, Any] = {"help": flag.help, "key": key(command, flag)}
    if flag.type is bool:
        value = column.checkbox(flag.label, value=flag.default, **shared)
    elif isinstance(flag.type, tuple):
        value = column.selectbox(
            flag.label,
            flag.type,
            index=None if flag.default is None else flag.type.index(flag.default),
            placeholder=placeholder(flag),
            **shared,
        )
    elif flag.type in (int, float):
        value = column.number_input(
            flag.label,
            min_value=flag.type(0),
            value=flag.default,
            step=flag.type(1),
            placeholder=placeholder(flag),
            **shared,
        )
    else:
        text = column.text_input(
            flag.label, value=flag.default or "", placeholder=placeholder(flag), **shared
        )
        value = text.strip() or None
    return None if value == flag.default else value


def form() -> launch.LaunchForm | None:
    devices = cuda_devices()
    choices = ["CPU"] + [f"GPU {d.index} ({d.name})" for d in devices]
    command = str(
        st.radio(
            "command",
            list(launch.COMMANDS),
            index=launch.COMMANDS.index("doctor"),  # the answer; run and sweep measure parts
            horizontal=True,
            key="launch-command",
        )
    )
    values: dict[str, Any] = {}
    backend = None  # the doctor's: it measures both pipelines
    for flag in options.flags(command):
        if flag.dest == "backend":  # outside the form: it decides which fields the form shows
            values[flag.dest] = field(st, command, flag)
            backend = values[flag.dest] or flag.default
    with st.form("launch-form"):
        chosen = st.multiselect(
            "devices (one lane per GPU; or the CPU)",
            choices,
            default=choices[1:] or ["CPU"],
            key="launch-devices",
        )
        columns = st.columns(3)
        for i, flag in enumerate(options.form_flags(command, backend)):
            values[flag.dest] = field(columns[i % len(columns)], command, flag)
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
    return launch.LaunchForm(command=command, gpus=gpus or None, flags=values)


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
        reason = launch.failure_reason(record) if record.status is RunStatus.FAILED else None
        if reason is not None:
            title += f": {reason}"
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
