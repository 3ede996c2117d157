"""Probes started from the dashboard: `probe run`, `sweep` or `doctor`, each a process of its
own, tracked in the store (so that any page, and any later visit, sees it), stopped by SIGTERM
(which the probe turns into a clean stop that keeps what it recorded).

`check` validates a launch form with the checks the command itself makes, before anything
starts; `start` refuses a second launch on devices a probe is using. The launched process runs
`python -m probe.launch LAUNCH_ID DB ...`: the probe command in-process, then its exit status
recorded in the store.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines import Backend, InputError, PipelineSpec, check_backend, discover
from probe.consumers import check_model, parse_consumer
from probe.queries import running_runs
from probe.samplers.host import pid_alive
from probe.store import LaunchRecord, RunStatus, Store

COMMANDS = ("run", "sweep", "doctor")
_children: dict[str, subprocess.Popen[bytes]] = {}  # reaped as the dashboard looks at them


@dataclass(frozen=True)
class LaunchForm:
    """What the Launch page asks for; None means the command's default."""

    command: str = "run"
    pipeline: str = "torch"  # run and sweep
    gpus: tuple[int, ...] | None = None  # None: the CPU
    num_shards: int | None = None
    data_dir: str | None = None  # None: the built-in sample data
    batch_size: int = 128
    workers: int | None = None
    threads: int | None = None
    consumer: str = "none"
    duration_s: float | None = 10.0  # run
    batches: int | None = None  # run
    budget_s: float | None = None  # sweep and doctor
    label: str | None = None  # run

    @property
    def devices(self) -> list[str]:
        return ["cpu"] if self.gpus is None else [str(g) for g in self.gpus]

    def argv(self) -> list[str]:
        """The probe command's arguments."""
        out = [self.command]
        if self.command != "doctor":
            out += ["--pipeline", self.pipeline]
        out += ["--gpus", "none" if self.gpus is None else ",".join(map(str, self.gpus))]
        options: list[tuple[str, object]] = [
            ("--num-shards", self.num_shards),
            ("--data", self.data_dir),
            ("--batch-size", self.batch_size),
            ("--workers", self.workers),
            ("--threads", self.threads),
            ("--consumer", self.consumer),
        ]
        if self.command == "run":
            options += [
                ("--duration", self.duration_s),
                ("--batches", self.batches),
                ("--label", self.label),
            ]
        else:
            options.append(("--budget", self.budget_s))
        for flag, value in options:
            if value is not None:
                out += [flag, str(value)]
        return out


def check(form: LaunchForm) -> list[str]:
    """What is wrong with a launch form, one line each (nothing: it can start)."""
    problems = []
    if form.command not in COMMANDS:
        problems.append(f"unknown command {form.command!r} (choose from: {', '.join(COMMANDS)})")
    from probe.devices import cuda_devices, select_gpus
    from probe.runner import plan_lanes

    checks: list[Callable[[], object]] = [
        lambda: check_model(parse_consumer(form.consumer)),
        lambda: plan_lanes(
            select_gpus(
                "none" if form.gpus is None else ",".join(map(str, form.gpus)), cuda_devices()
            ),
            form.num_shards,
        ),
        lambda: PipelineSpec(
            Path(form.data_dir or "."), batch_size=form.batch_size, num_shards=form.num_shards or 1
        ),
        lambda: check_backend(form.pipeline),
    ]
    if form.data_dir:
        checks.append(lambda: discover(form.data_dir or "."))
    if form.workers is not None and form.workers < 0:
        problems.append(f"workers must be >= 0 (got {form.workers})")
    if form.threads is not None and form.threads < 1:
        problems.append(f"DALI threads must be >= 1 (got {form.threads})")
    if form.command == "run" and form.duration_s is not None and form.duration_s <= 0:
        problems.append(f"the duration must be > 0 seconds (got {form.duration_s})")
    if form.command == "run" and form.batches is not None and form.batches < 1:
        problems.append(f"batches must be >= 1 (got {form.batches})")
    if form.command != "run" and form.budget_s is not None:
        checks.append(lambda: _check_budget(form))
    for run_check in checks:
        try:
            run_check()
        except (InputError, ValueError) as error:
            problems.append(str(error))
    return problems


def _check_budget(form: LaunchForm) -> None:
    from probe.devices import cuda_devices, select_gpus
    from probe.runner import ProbeConfig, plan_lanes
    from probe.sweep import check_budget

    gpus = select_gpus(
        "none" if form.gpus is None else ",".join(map(str, form.gpus)), cuda_devices()
    )
    config = ProbeConfig(
        backend=Backend(form.pipeline),
        spec=PipelineSpec(Path(form.data_dir or ".")),
        lanes=plan_lanes(gpus, form.num_shards),
        consumer=parse_consumer(form.consumer),
    )
    if form.command == "sweep":
        check_budget(form.budget_s or 0.0, 2, config, "a sweep")
    else:
        check_budget(form.budget_s or 0.0, 1, config, "a diagnosis")


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
    busy = busy_devices(store)
    taken = [device for device in form.devices if device in busy]
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
    argv = form.argv()
    record = LaunchRecord(
        launch_id=launch_id,
        command=form.command,
        argv=argv,
        devices=form.devices,
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
            [sys.executable, "-m", "probe.launch", launch_id, str(store.path), *argv],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the dashboard's terminal does not reach it
        )
    _children[launch_id] = child
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
    for child in list(_children.values()):
        child.poll()  # reaps it if it ended
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


def _main(arguments: list[str]) -> int:
    """Runs a launched probe command, then records how it ended."""
    from probe.cli import main

    launch_id, db, argv = arguments[0], arguments[1], arguments[2:]
    try:
        main([*argv[:1], "--db", db, *argv[1:]])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
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
