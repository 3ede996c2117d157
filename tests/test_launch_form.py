"""The Launch page's form: each command's fields open on that command's defaults as the `probe`
CLI defines them, an unchanged form starts what the CLI does with no flags, and a failed launch
says why."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from pipelines import Backend, InputError
from pipelines.errors import error_line
from probe.present import launch, options
from probe.present.cli import cli
from probe.present.launch import LaunchForm, failure_reason
from probe.records import LaunchRecord, RunStatus
from probe.store.db import Store

APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
WIDGETS = ("radio", "selectbox", "number_input", "text_input", "checkbox")


def launch_page(monkeypatch: pytest.MonkeyPatch, db: Path) -> AppTest:
    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])  # the CPU alone
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("views/launch.py")
    return at.run()


def fields(at: AppTest, command: str) -> dict[str, Any]:
    """The form's fields for `command`, by flag name ("batch-size")."""
    prefix = f"launch-{command}-"
    return {
        widget.key[len(prefix) :]: widget
        for kind in WIDGETS
        for widget in at.get(kind)
        if widget.key and widget.key.startswith(prefix)
    }


def cli_defaults(command: str) -> dict[str, Any]:
    """The `probe COMMAND` options' defaults, by flag name, as click holds them."""
    return {
        option.opts[0][2:]: option.default
        for option in cli.commands[command].params
        if option.name in options.defaults(command)
    }


def check_defaults(at: AppTest, command: str, pipeline: str | None) -> None:
    """Each field shows the CLI's default; a default decided by the lanes shows as an empty
    field that says how the CLI decides it."""
    shown = fields(at, command)
    other_pipeline = {
        flag.name[2:]
        for flag in options.flags(command)
        if pipeline is not None and flag.backend not in (None, Backend(pipeline))
    }
    expected = {
        name: default
        for name, default in cli_defaults(command).items()
        if name != "gpus" and name not in other_pipeline  # gpus: the devices field
    }
    if "pipeline" in expected:
        expected["pipeline"] = pipeline  # as chosen
    assert set(shown) == set(expected), command
    for name, default in expected.items():
        widget = shown[name]
        if default is None:
            assert widget.value in (None, ""), (command, name)
            note = next(f for f in options.flags(command) if f.name == f"--{name}").default_note
            if note is not None:  # said whole where it fits, else the help says it
                text = f"default: {note}"
                assert widget.proto.placeholder in (text, "default: see the ? above")
                assert f"[{text}]" in widget.proto.help, (command, name)
        else:
            assert widget.value == default, (command, name)


def test_each_command_opens_on_its_cli_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    at = launch_page(monkeypatch, tmp_path / "store.db")
    assert not at.exception
    assert at.radio(key="launch-command").value == "doctor"  # the answer first
    at.radio(key="launch-command").set_value("run").run()
    assert cli_defaults("run")["pipeline"] == cli_defaults("sweep")["pipeline"] == "torch"
    check_defaults(at, "run", "torch")
    cpu, gpu = options.CPU_BATCH_SIZE, options.GPU_BATCH_SIZE
    assert f"[default: {gpu} on a GPU, {cpu} on the CPU]" in fields(at, "run")["batch-size"].help
    assert "threads" not in fields(at, "run")  # DALI's
    at.number_input(key="launch-run-batch-size").set_value(8)
    at.text_input(key="launch-run-consumer").input("sleep:5")

    at.radio(key="launch-command").set_value("doctor").run()
    check_defaults(at, "doctor", None)  # the doctor measures both pipelines
    doctor = fields(at, "doctor")
    assert doctor["consumer"].value == options.DOCTOR_CONSUMER
    assert doctor["budget"].value is None
    assert f"[default: {options.DOCTOR_BUDGET_S:g}]" in doctor["budget"].help
    assert {"pipeline", "duration", "batches", "label", "values"}.isdisjoint(doctor)

    at.radio(key="launch-command").set_value("sweep").run()
    check_defaults(at, "sweep", "torch")
    assert fields(at, "sweep")["budget"].value == options.SWEEP_BUDGET_S
    at.selectbox(key="launch-sweep-pipeline").set_value("dali").run()
    check_defaults(at, "sweep", "dali")
    assert "workers" not in fields(at, "sweep") and "threads" in fields(at, "sweep")

    at.radio(key="launch-command").set_value("run").run()  # back: what was typed is gone
    check_defaults(at, "run", "torch")
    assert not at.exception


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[LaunchForm]:
    """The forms the page starts, recorded instead of started."""
    forms: list[LaunchForm] = []

    def start(store: Store, form: LaunchForm) -> LaunchRecord:
        forms.append(form)
        return LaunchRecord("launch-test", form.command, form.argv(), form.devices, "now",
                            None, RunStatus.COMPLETED, 0, "", None)  # fmt: skip

    monkeypatch.setattr(launch, "start", start)
    return forms


@pytest.mark.parametrize("command", launch.COMMANDS)
def test_an_unchanged_form_starts_what_the_cli_does_with_no_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, started: list[LaunchForm], command: str
) -> None:
    at = launch_page(monkeypatch, tmp_path / "store.db")
    at.radio(key="launch-command").set_value(command).run()
    at.button[0].click().run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    (form,) = started
    assert form.argv() == [command, "--gpus", "none"]
    config = options.config_of(command, form.values())
    assert config.spec.batch_size == options.CPU_BATCH_SIZE  # decided by the CLI, on the CPU
    assert config.consumer == options.config_of(command, {"gpus": "none"}).consumer


def test_a_changed_field_is_the_only_flag_sent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, started: list[LaunchForm]
) -> None:
    at = launch_page(monkeypatch, tmp_path / "store.db")
    at.radio(key="launch-command").set_value("doctor").run()
    at.number_input(key="launch-doctor-budget").set_value(90.0)
    at.checkbox(key="launch-doctor-persistent-workers").uncheck()
    at.button[0].click().run()
    at.radio(key="launch-command").set_value("run").run()
    at.selectbox(key="launch-run-pipeline").set_value("dali").run()
    at.number_input(key="launch-run-threads").set_value(2)
    at.text_input(key="launch-run-consumer").input("")  # cleared: the CLI's default
    at.button[0].click().run()
    at.radio(key="launch-command").set_value("sweep").run()
    at.selectbox(key="launch-sweep-pipeline").set_value("dali").run()
    at.number_input(key="launch-sweep-hw-decoder-load").set_value(0.9)
    at.button[0].click().run()
    assert not at.exception
    assert [form.argv() for form in started] == [
        ["doctor", "--gpus", "none", "--no-persistent-workers", "--budget", "90"],
        ["run", "--pipeline", "dali", "--gpus", "none", "--threads", "2"],
        ["sweep", "--pipeline", "dali", "--gpus", "none", "--hw-decoder-load", "0.9"],
    ]


def test_the_failure_reason_is_the_last_error_line() -> None:
    assert error_line("run r1\nerror: --budget 3 s cannot fit one point\n\n") == (
        "error: --budget 3 s cannot fit one point"
    )
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "probe/x.py", line 3, in run\n'
        "    raise ValueError(reason)\n"
        "ValueError: no images under /data\n"
    )
    assert (
        error_line("lanes 1/2\r lanes 2/2\r\n" + traceback) == "ValueError: no images under /data"
    )
    assert error_line("lane 0: failed: image file is truncated\nimages/s 120\n") == (
        "lane 0: failed: image file is truncated"
    )
    assert error_line("run r1\nimages/s 120\n") is None
    assert error_line("") is None
    no_answer = (
        "no answer: your setting, num_workers=2, was not measured: what was left of the "
        "budget, 3 s, cannot fit it (it takes at least about 7 s here): --budget 100 would "
        "(session doctor-1)"
    )
    assert error_line(f"doctor: yours first\n{no_answer}\n") == no_answer
    assert launch.budget_hint(no_answer) == 100
    assert launch.budget_hint("error: no images under /data") is None


def test_a_session_runs_again_as_it_was_with_the_budget_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The one click on from a failed session: its arguments, the budget replaced."""
    spawned: list[list[str]] = []
    monkeypatch.setattr(
        launch, "_spawn", lambda store, command, argv, devices: spawned.append(argv)
    )
    record = LaunchRecord("launch-1", "doctor", ["doctor", "--gpus", "none", "--budget", "90"],
                          ["cpu"], "now", None, RunStatus.FAILED, 1, "", "later")  # fmt: skip
    with Store(tmp_path / "store.db") as store:
        launch.again(store, record, 130)
        launch.again(store, record)
        with pytest.raises(InputError, match="has no budget"):
            launch.again(store, replace(record, command="run", argv=["run"]), 130)
    assert spawned == [
        ["doctor", "--gpus", "none", "--budget", "130"],
        ["doctor", "--gpus", "none", "--budget", "90"],
    ]


def failed_launch(tmp_path: Path, log: str | None) -> LaunchRecord:
    path = tmp_path / "launch.log"
    if log is not None:
        path.write_text(log)
    return LaunchRecord("launch-1", "run", ["run", "--gpus", "none"], ["cpu"], "now", None,
                        RunStatus.FAILED, 1, str(path), "later")  # fmt: skip


def test_a_failed_launch_shows_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert failure_reason(failed_launch(tmp_path, None)) is None  # no log
    record = failed_launch(tmp_path, "run r1\nRuntimeError: DataLoader worker killed\nbye\n")
    assert failure_reason(record) == "RuntimeError: DataLoader worker killed"
    db = tmp_path / "store.db"
    with Store(db) as store:
        store.save_launch(record)
    at = launch_page(monkeypatch, db)
    assert not at.exception
    (shown,) = at.expander
    assert shown.label.endswith("failed (exit 1): RuntimeError: DataLoader worker killed")
