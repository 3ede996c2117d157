"""Probes started from the dashboard: `probe run`, `sweep` or `doctor`, each a process of its
own, tracked in the store (so that any page, and any later visit, sees it), stopped by SIGTERM
(which the probe turns into a clean stop that keeps what it recorded).

`check` validates a launch form with the checks the command itself makes, before anything
starts; `start` refuses a second launch on devices a probe is using. The launched process
runs `python -m probe.present.launch LAUNCH_ID DB ...`: the probe command in-process, then its
exit status recorded in the store.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipelines import InputError, discover
from pipelines.errors import error_line
from probe.measure.samplers.host import pid_alive
from probe.present import options
from probe.present.listing import running_runs
from probe.records import LaunchRecord, RunStatus
from probe.store.db import Store

COMMANDS = ("run", "sweep", "doctor")


@dataclass(frozen=True)
class LaunchForm:
    """What the Launch page asks for: a command, its devices and its flags' values; None
    means the command's default (the flag is left out, and the command decides)."""

    command: str = "run"
    gpus: tuple[int, ...] | None = None  # None: the CPU
    pipeline: str | None = "torch"  # run and sweep
    num_shards: int | None = None
    data_dir: str | None = None  # None: the built-in sample data
    batch_size: int | None = None
    workers: int | None = None
    threads: int | None = None
    consumer: str | None = None
    duration_s: float | None = None  # run
    batches: int | None = None  # run
    budget_s: float | None = None  # sweep and doctor
    label: str | None = None  # run
    flags: Mapping[str, Any] = field(default_factory=dict)  # by dest, in place of the above

    @property
    def devices(self) -> list[str]:
        return ["cpu"] if self.gpus is None else [str(g) for g in self.gpus]

    def values(self) -> dict[str, Any]:
        """The form as the command's flag values (by `probe.present.options.FLAGS`' `dest`):
        those the command takes and the form gives."""
        named = {
            "backend": self.pipeline,
            "gpus": "none" if self.gpus is None else ",".join(map(str, self.gpus)),
            "num_shards": self.num_shards,
            "data_dir": self.data_dir,
            "batch_size": self.batch_size,
            "workers": self.workers,
            "threads": self.threads,
            "consumer": self.consumer,
            "duration": self.duration_s,
            "batches": self.batches,
            "label": self.label,
            "budget": self.budget_s,
        }
        takes = options.defaults(self.command)
        return {
            dest: value
            for dest, value in {**named, **self.flags}.items()
            if dest in takes and value is not None
        }

    def argv(self) -> list[str]:
        """The probe command's arguments."""
        return [self.command, *options.argv(self.command, self.values())]


def check(form: LaunchForm) -> list[str]:
    """What is wrong with a launch form, one line each (nothing: it can start): the checks the
    command makes of its flags, the dataset's, and whether a session's budget (given, or the
    command's default) fits."""
    if form.command not in COMMANDS:
        return [f"unknown command {form.command!r} (choose from: {', '.join(COMMANDS)})"]
    problems = []
    values = form.values()
    config = None
    try:
        config = options.config_of(form.command, values)
    except (InputError, ValueError) as error:
        problems.append(str(error))
    if values.get("data_dir"):
        try:
            discover(values["data_dir"])
        except (InputError, ValueError) as error:
            problems.append(str(error))
    if config is not None and form.command != "run":
        budget = values.get("budget", options.defaults(form.command)["budget"])
        if budget is None:
            lanes = options.LaneArgs.of(values, form.command)
            budget = options.doctor_budget(lanes, bool(values.get("scaling")), len(config.lanes))
        try:
            options.check_budget(form.command, budget, config)
        except InputError as error:
            problems.append(str(error))
    return problems


def busy_devices(store: Store) -> dict[str, str]:
    """Devices a probe uses now ("cpu" or a GPU index) and what uses them."""
    busy = {}
    for launch in launches(store):
        if launch.status is RunStatus.RUNNING:
            for device in launch.devices:
                busy[device] = f"launch {launch.launch_id} ({launch.command})"
    for run in running_runs(store):
        for lane in store.lanes(run.run_id):
            device = "cpu" if lane.gpu_index is None else str(lane.gpu_index)
            busy.setdefault(device, f"run {run.run_id}")
    return busy


def start(store: Store, form: LaunchForm) -> LaunchRecord:
    """Starts the probe command in a new process; returns its record.

    Raises:
        InputError: the form has a problem, or a probe is using one of its devices.
    """
    problems = check(form)
    if problems:
        raise InputError("; ".join(problems))
    return _spawn(store, form.command, form.argv(), form.devices)


def _spawn(store: Store, command: str, argv: list[str], devices: list[str]) -> LaunchRecord:
    """Starts `probe` with `argv` in a new process where no probe uses `devices`."""
    busy = busy_devices(store)
    taken = [device for device in devices if device in busy]
    if taken:
        what = "the CPU" if taken[0] == "cpu" else f"GPU {taken[0]}"
        raise InputError(
            f"{what} is in use by {busy[taken[0]]}: stop it or wait for it before starting "
            "another probe there (two would measure each other)"
        )
    launch_id = (
        "launch-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
    )
    log = store.path.parent / "launches" / f"{launch_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    record = LaunchRecord(
        launch_id=launch_id,
        command=command,
        argv=argv,
        devices=devices,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        pid=None,
        status=RunStatus.RUNNING,
        exit_code=None,
        log_path=str(log),
        ended=None,
    )
    store.save_launch(record)
    with open(log, "wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-m", "probe.present.launch", launch_id, str(store.path), *argv],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the dashboard's terminal does not reach it
        )
    # reaped as it ends, not left a zombie of the dashboard until someone looks at launches
    threading.Thread(target=child.wait, name=f"reap {launch_id}", daemon=True).start()
    record = replace(record, pid=child.pid)
    store.save_launch(record)
    return record


def stop(store: Store, launch_id: str) -> None:
    """Asks a launched probe to stop (SIGTERM: it stops its lanes and keeps what it recorded)."""
    launch = next((x for x in store.launches() if x.launch_id == launch_id), None)
    if launch is None:
        raise InputError(f"no launch {launch_id!r}")
    if launch.pid is not None and launch.status is RunStatus.RUNNING and pid_alive(launch.pid):
        os.kill(launch.pid, signal.SIGTERM)


def launches(store: Store) -> list[LaunchRecord]:
    """The launches, newest first, with those whose process ended unseen marked failed."""
    out = []
    for record in store.launches():
        if record.status is RunStatus.RUNNING and (record.pid is None or not pid_alive(record.pid)):
            ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record = replace(record, status=RunStatus.FAILED, ended=ended)  # noqa: PLW2901
            store.save_launch(record)
        out.append(record)
    return out


def log_tail(launch: LaunchRecord, lines: int = 30) -> str:
    """The last lines the launched probe printed."""
    try:
        text = Path(launch.log_path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


# The budget a reason says would have fitted ("... --budget 130 would ...").
_BUDGET_HINT = re.compile(r"--budget (\d+)")


def failure_reason(launch: LaunchRecord) -> str | None:
    """Why a launched probe failed: the last error line it printed (None if it printed none)."""
    try:
        return error_line(Path(launch.log_path).read_text(errors="replace"))
    except OSError:
        return None


def budget_hint(reason: str | None) -> int | None:
    """The budget, in seconds, that a failure's reason says would have fitted (None: it names
    none)."""
    found = _BUDGET_HINT.findall(reason or "")
    return int(found[-1]) if found else None


def again(store: Store, launch: LaunchRecord, budget_s: int | None = None) -> LaunchRecord:
    """Starts a launch again as it was; a sweep or doctor with `budget_s` as its budget where
    one is given.

    Raises:
        InputError: a budget for a probe run, or a probe is using one of its devices.
    """
    argv = list(launch.argv)
    if budget_s is not None:
        if launch.command not in ("sweep", "doctor"):
            raise InputError(f"{launch.launch_id} is a probe {launch.command}: it has no budget")
        if "--budget" in argv:
            position = argv.index("--budget")
            del argv[position : position + 2]
        argv += ["--budget", str(budget_s)]
    return _spawn(store, launch.command, argv, launch.devices)


def _main(arguments: list[str]) -> int:
    """Runs a launched probe command, then records how it ended."""
    from probe.present.cli import main  # here: the dashboard needs none of the CLI

    launch_id, db, argv = arguments[0], arguments[1], arguments[2:]
    code = main([*argv[:1], "--db", db, *argv[1:]])
    status = {0: RunStatus.COMPLETED, 130: RunStatus.INTERRUPTED}.get(code, RunStatus.FAILED)
    with Store(db) as store:
        record = next((x for x in store.launches() if x.launch_id == launch_id), None)
        if record is not None:
            ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            store.save_launch(
                LaunchRecord(
                    **{**record.__dict__, "status": status, "exit_code": code, "ended": ended}
                )
            )
    return code


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
