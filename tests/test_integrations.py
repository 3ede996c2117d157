"""Where users already look, each against the real thing: a real Prometheus server scraping a
watched loop (and evaluating the Grafana dashboard's queries), TensorBoard's own reader, a
Lightning fit, and `probe watch --` running an ImageNet-shaped training script unchanged, alone
and under torchrun.

Without the `prometheus` binary (Debian's package) the Prometheus test is skipped, unless
FEEDSCOPE_REQUIRE_PROMETHEUS=1 (CI sets it), which turns the skip into an error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import free_port, probe_cli, run_captured, write_jpeg
from pipelines import InputError
from probe import watch
from probe.judge.diagnosis import diagnose_run
from probe.judge.verdicts import FED_KINDS
from probe.records import RunStatus
from probe.store.db import Store
from probe.store.documents import read_run

ROOT = Path(__file__).resolve().parents[1]
IMAGENET_SHAPED = ROOT / "tests" / "data" / "imagenet_shaped" / "main.py"
DASHBOARD = ROOT / "probe" / "present" / "assets" / "grafana-dashboard.json"
WAIT_S, STEP_S = 0.02, 0.03  # the scraped loop's: data-wait 40%


def run_events(db: Path, run_id: str) -> list[Any]:
    with Store(db) as store:
        return store.batches(run_id)


def first_lane(db: Path, run_id: str) -> dict[str, Any]:
    """The run's first lane as its JSON document has it: status, reason and figures."""
    with Store(db) as store:
        return read_run(store, run_id).to_json()["lanes"][0]  # type: ignore[no-any-return]


# -- Prometheus -------------------------------------------------------------------------------

SCRAPED_LOOP = """
import sys, time
import torch
from probe import watch

db, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def loader():
    while True:
        time.sleep({wait})
        yield torch.zeros(4, 3)

watched = watch(loader(), name="scraped", db=db, metrics_port=port)
end = time.monotonic() + seconds
for batch in watched:
    time.sleep({step})
    if time.monotonic() > end:
        break
watched.close()
print(watched.run_id, time.time(), flush=True)
time.sleep(300)  # serving until stopped
"""


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real Prometheus scraping 127.0.0.1:PORT every second: (its URL, PORT)."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("FEEDSCOPE_REQUIRE_PROMETHEUS") == "1":
            raise RuntimeError("no prometheus binary, and FEEDSCOPE_REQUIRE_PROMETHEUS=1")
        pytest.skip("no prometheus binary (Debian's prometheus package)")
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""\
        global:
          scrape_interval: 1s
          evaluation_interval: 1s
        scrape_configs:
          - job_name: training
            honor_labels: true
            static_configs:
              - targets: ["127.0.0.1:{target}"]
        """))  # fmt: skip
    server = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("Prometheus did not start") from None
                time.sleep(0.3)
        yield url, target
    finally:
        server.terminate()
        server.wait(timeout=30)


def query(url: str, expression: str, at: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expression, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as answer:
        document = json.load(answer)
    assert document["status"] == "success", (expression, document)
    return list(document["data"]["result"])


def test_prometheus_scrapes_a_watched_loop_and_finds_its_data_wait(
    tmp_path: Path, prometheus: tuple[str, int]
) -> None:
    url, port = prometheus
    db = tmp_path / "store.db"
    script = tmp_path / "loop.py"
    script.write_text(SCRAPED_LOOP.format(wait=WAIT_S, step=STEP_S))
    loop = subprocess.Popen([sys.executable, str(script), str(db), str(port), "25"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert loop.stdout is not None
        run_id, ended = loop.stdout.readline().split()
        time.sleep(3)  # the last scrapes
        at = float(ended) - 1
        wait = "feedscope_data_wait_seconds_total"
        share = f"rate({wait}[15s]) / (rate({wait}[15s]) + rate(feedscope_step_seconds_total[15s]))"
        found = query(url, share, at)
        waited = query(url, f"rate({wait}[15s])", at)
        dashboard = json.loads(DASHBOARD.read_text())
        for panel in dashboard["panels"]:  # every query of the dashboard, as Grafana sends it
            for target in panel["targets"]:
                expression = target["expr"].replace("$__rate_interval", "15s")
                query(url, expression.replace("$job", ".*"), at)
        starving = next(p for p in dashboard["panels"] if p["title"].startswith("Jobs starving"))
        now = query(url, starving["targets"][0]["expr"].replace("$job", ".*"), at)
    finally:
        loop.kill()
        loop.wait()
    lane = first_lane(db, run_id)
    assert lane["status"] == RunStatus.COMPLETED.value
    stored, error = lane["data_wait_frac"], lane["data_wait_frac_error"]
    assert len(found) == 1
    labels = found[0]["metric"]
    assert labels["job"] == "scraped"
    assert labels["rank"] == labels["local_rank"] == "0"
    assert "gpu" not in labels and "UUID" not in labels  # on the CPU: empty, which is none
    assert labels["Hostname"] == socket.gethostname()
    scraped = float(found[0]["value"][1])
    # Prometheus' window (15 s of the steady loop) against the run's figure and its error.
    assert abs(scraped - stored) <= error + 0.01, (scraped, stored, error)
    assert abs(float(waited[0]["value"][1]) - stored) <= 0.05  # wait seconds a second = share
    assert [r["metric"]["job"] for r in now] == ["scraped"]  # 40% > 20%: starving now


# -- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_gets_the_figures_every_n_batches(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )
    from torch.utils.tensorboard import SummaryWriter

    def loader() -> Iterator[torch.Tensor]:
        for _ in range(125):
            time.sleep(0.004)
            yield torch.zeros(8, 3)

    db, folder = tmp_path / "store.db", tmp_path / "tb"
    writer = SummaryWriter(str(folder))  # the user's own, left open
    watched = watch(loader(), name="boarded", db=db, tensorboard=writer, tensorboard_every=40)
    for _ in watched:
        time.sleep(0.006)
    watched.close()
    writer.add_scalar("loss", 1.0, 0)  # still the user's to write to
    writer.close()
    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"feedscope/data_wait_pct", "feedscope/images_per_s", "feedscope/step_ms",
            "feedscope/epoch_start_stall_s", "loss"} <= tags  # fmt: skip
    points = events.Scalars("feedscope/data_wait_pct")
    assert [p.step for p in points] == [45, 85, 125]  # 5 warm-up batches, then 40 a point
    assert run_id_of(watched) is not None
    lane = first_lane(db, str(run_id_of(watched)))
    mean = sum(p.value for p in points) / len(points) / 100
    assert abs(mean - lane["data_wait_frac"]) <= 0.02  # equal blocks of the same batches
    rates = events.Scalars("feedscope/images_per_s")
    assert all(abs(r.value / lane["images_per_s"] - 1) < 0.25 for r in rates)


def run_id_of(watched: Any) -> str | None:
    return watched.run_id  # type: ignore[no-any-return]


# -- Lightning --------------------------------------------------------------------------------


def test_a_lightning_fit_is_one_run_with_its_epochs(tmp_path: Path) -> None:
    import lightning as L

    from probe import FeedscopeCallback

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(6, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            time.sleep(0.003)
            loss: torch.Tensor = ((self.layer(x).squeeze(-1) - y) ** 2).mean()
            return loss

        def validation_step(self, batch: Any, index: int) -> None:
            time.sleep(0.01)  # slow validation: not the training loop's wait

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(320, 6), torch.randn(320))
    db = tmp_path / "store.db"
    callback = FeedscopeCallback(
        "lit", db=db, tensorboard=tmp_path / "tb", tensorboard_every=20, answer=False
    )  # its answer: the next test's
    trainer = L.Trainer(max_epochs=3, callbacks=[callback], accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(Regression(), DataLoader(data, batch_size=16),
                DataLoader(data, batch_size=32))  # fmt: skip
    with Store(db) as store:
        runs = store.runs()
    assert len(runs) == 1 and runs[0].kind == "watch" and runs[0].label == "lit"
    run_id = runs[0].run_id
    events = run_events(db, run_id)
    assert len(events) == 3 * 20  # the training batches alone, validation's left out
    assert sorted({e.epoch for e in events}) == [0, 1, 2]
    assert first_lane(db, run_id)["status"] == RunStatus.COMPLETED.value
    # validation (10 ms a batch, 10 batches) between epochs is in no batch's wait
    assert max(e.wait_s for e in events if not e.warmup) < 0.05
    assert any((tmp_path / "tb").iterdir())


LIGHTNING_FIT = """
import sys, time
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset
from probe import FeedscopeCallback

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(6, 1)
    def training_step(self, batch, index):
        x, y = batch
        time.sleep(0.003)
        return ((self.layer(x).squeeze(-1) - y) ** 2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = TensorDataset(torch.randn(320, 6), torch.randn(320))
trainer = L.Trainer(max_epochs=2, callbacks=[FeedscopeCallback("lit", db=sys.argv[1])],
                    accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regression(), DataLoader(data, batch_size=16))
"""


def test_a_lightning_fit_tells_its_answer_when_it_ends(tmp_path: Path) -> None:
    """As `watch` does at exit: the verdict and the `probe show` that gives the rest."""
    script = tmp_path / "fit.py"
    script.write_text(LIGHTNING_FIT)
    db = tmp_path / "store.db"
    result = run_captured([sys.executable, script, db], timeout=300)
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        (run,) = store.runs()
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    assert told[0].startswith("feedscope: lit, 35 batches measured: ")
    assert told[-1] == f"feedscope:   probe show {run.run_id}"


# -- probe watch --: no code change -----------------------------------------------------------


@pytest.fixture(scope="module")
def imagenet_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIR/train (4 classes of 12) and DIR/val (4 of 4), natural-ish JPEGs."""
    root = tmp_path_factory.mktemp("imagenet")
    generator = np.random.default_rng(3)
    for split, count in (("train", 12), ("val", 4)):
        for label in range(4):
            for n in range(count):
                pixels = generator.integers(0, 255, (96, 128, 3), dtype=np.uint8)
                write_jpeg(root / split / f"n0{label}" / f"{n:03d}.jpg", pixels)
    return root


def test_probe_watch_runs_an_imagenet_shaped_script_unchanged(
    tmp_path: Path, imagenet_folder: Path
) -> None:
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", "python", IMAGENET_SHAPED, imagenet_folder,
                       "-j", "2", "--epochs", "2", "-b", "8")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    meter = [float(x) for x in re.findall(r"Epoch \d data time ([\d.]+) s", result.stdout)]
    with Store(db) as store:
        runs = {run.label: run for run in store.runs()}
    assert set(runs) == {"main.py", "main.py (loader 2)"}  # train, then val
    train = run_events(db, runs["main.py"].run_id)
    assert len(train) == 2 * 6 and sorted({e.epoch for e in train}) == [0, 1]
    assert sum(e.size for e in train) == 2 * 48
    # The script's own meter of its data time against feedscope's, warm-up batches included: in
    # the second epoch, within a millisecond a batch; in the first, the script's also holds
    # the recording's start (the store, the samplers), which is in no batch's wait.
    waits = [sum(e.wait_s for e in train if e.epoch == epoch) for epoch in (0, 1)]
    assert abs(waits[1] - meter[1]) <= 0.001 * 6 + 0.002, (waits, meter)
    assert 0 <= meter[0] - waits[0] < 1.0, (waits, meter)
    val = run_events(db, runs["main.py (loader 2)"].run_id)
    assert len(val) == 2 * 2
    for run in runs.values():
        assert first_lane(db, run.run_id)["status"] == RunStatus.COMPLETED.value
    # the answer when the script ends: the training loader (the most batches) first
    train_id, val_id = runs["main.py"].run_id, runs["main.py (loader 2)"].run_id
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    assert told[0].startswith("feedscope: main.py, the training loader, 7 batches measured: ")
    assert told[-3] == "feedscope:   probe show " + train_id
    assert told[-2] == (
        "feedscope: main.py (loader 2), 0 batches measured: too few batches to judge: lane 0 "
        "measured no batch (completed; its 4 were warm-up)"
    )
    assert told[-1] == "feedscope:   probe show " + val_id
    shown = probe_cli("show", "last", "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert f"run {train_id} (completed)" in shown.stdout + shown.stderr
    other = f"the script's other loader: main.py (loader 2), run {val_id} (`probe show {val_id}`)"
    assert other in shown.stderr


def test_probe_watch_watches_a_dali_iterator(tmp_path: Path, imagenet_folder: Path) -> None:
    pytest.importorskip("nvidia.dali")
    script = tmp_path / "dali_train.py"
    script.write_text(textwrap.dedent(f"""\
        from nvidia.dali import fn, pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=8, num_threads=1, device_id=None)
        def images():
            jpegs, labels = fn.readers.file(file_root="{imagenet_folder / 'train'}", name="Reader")
            return fn.resize(fn.decoders.image(jpegs, device="cpu"), size=(32, 32)), labels

        pipe = images()
        pipe.build()
        loader = DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader",
                                     last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
        for epoch in range(2):
            for batch in loader:
                pass
        """))  # fmt: skip
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", script)
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        (run,) = store.runs()
        events = store.batches(run.run_id)
    assert run.pipeline == "dali" and run.label == "dali_train.py"
    assert [sum(e.size for e in events if e.epoch == epoch) for epoch in (0, 1)] == [48, 48]


def test_probe_watch_passes_the_scripts_exit_code_on(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""\
        import sys, torch
        from torch.utils.data import DataLoader
        for batch in DataLoader(torch.zeros(40, 3), batch_size=4):
            pass
        sys.exit(3)
        """))  # fmt: skip
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", script)
    assert result.returncode == 3
    with Store(db) as store:
        (run,) = store.runs()
    lane = first_lane(db, run.run_id)
    assert lane["status"] == RunStatus.INTERRUPTED.value
    assert lane["reason"] == "the script exited with code 3"
    missing = probe_cli("watch", "--db", db, "--", "python", tmp_path / "nothere.py")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: no script {tmp_path / 'nothere.py'}: the file is not there"
    ]


def test_a_loader_made_anew_each_epoch_ends_its_run_when_dropped(tmp_path: Path) -> None:
    """A script that makes its DataLoader anew each epoch (as Lightning's
    reload_dataloaders_every_n_epochs does): each loader it drops ends its run, and its
    samplers and writer, once collected. They were kept to the exit: a sampler set and a writer
    more each epoch, until they took the job's CPU and the store's lock."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import gc, threading, time
        import torch
        from torch.utils.data import DataLoader
        def writers():
            return sum(t.name == "feedscope-watch" for t in threading.enumerate())
        for epoch in range(6):
            gc.collect()  # the loaders dropped end their runs; their writers, soon after
            waited = time.monotonic() + 10
            while writers() > 1 and time.monotonic() < waited:
                time.sleep(0.05)
            print(writers())
            loader = DataLoader(torch.zeros(16, 3), batch_size=4)
            for batch in loader:
                pass
        """))  # fmt: skip
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", script)
    assert result.returncode == 0, result.stderr
    # the loader of the epoch before is still the script's `loader`; those before it are gone
    assert result.stdout.split()[:6] == ["0", "1", "1", "1", "1", "1"], result.stdout
    with Store(db) as store:
        runs = store.runs()
        assert len(runs) == 6
        for run in runs:
            (lane,) = store.lanes(run.run_id)
            assert lane.status is RunStatus.COMPLETED, (run.label, lane.reason)


def test_a_loop_stopped_by_ctrl_c_while_it_waits_reads_interrupted(tmp_path: Path) -> None:
    """Ctrl-C while the loop waits for a batch (where a starved job spends its time): the run
    reads interrupted, not completed, though the script goes on and drops its loader."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""\
        import gc
        from probe import watch
        def batches():
            for step in range(40):
                if step == 5:
                    raise KeyboardInterrupt  # as a Ctrl-C in the loader's next()
                yield step
        loop = watch(batches(), name="stopped", db={str(tmp_path / "store.db")!r}, answer=False)
        try:
            for batch in loop:
                pass
        except KeyboardInterrupt:
            pass
        del loop
        gc.collect()
        """))  # fmt: skip
    result = run_captured([sys.executable, script], timeout=300)
    assert result.returncode == 0, result.stderr
    with Store(tmp_path / "store.db") as store:
        (run,) = store.runs()
    lane = first_lane(tmp_path / "store.db", run.run_id)
    assert (lane["status"], lane["reason"]) == ("interrupted", "interrupted (Ctrl-C)")


def test_a_loader_the_script_watches_itself_is_one_run(tmp_path: Path) -> None:
    script = tmp_path / "watched.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader
        from probe import watch
        for epoch in range(2):
            for batch in watch(DataLoader(torch.zeros(40, 3), batch_size=4), name="mine"):
                pass
        """))  # fmt: skip
    db = tmp_path / "store.db"
    result = probe_cli("watch", "--db", db, "--", script)
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        assert sorted(run.label or "" for run in store.runs()) == ["mine", "mine"]


@pytest.mark.parametrize("answer", [True, False])
def test_watch_tells_the_answer_when_the_process_exits(tmp_path: Path, answer: bool) -> None:
    db = tmp_path / "store.db"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""\
        import time, torch
        from torch.utils.data import DataLoader
        from probe import watch
        val = DataLoader(torch.zeros(8, 3), batch_size=4)
        train = DataLoader(torch.zeros(160, 3), batch_size=4)
        for batch in watch(val, name="val", db={str(db)!r}, answer={answer}):
            pass
        for batch in watch(train, name="train", db={str(db)!r}, answer={answer}):
            time.sleep(0.002)
        print("the script's own last line")
        """))  # fmt: skip
    result = run_captured([sys.executable, script], timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "the script's own last line\n"
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    if not answer:
        assert told == []
        return
    with Store(db) as store:
        runs = {run.label: run.run_id for run in store.runs()}
    # the training loader (the most batches) first, though it was iterated second
    assert told[0].startswith("feedscope: train, the training loader, 35 batches measured: ")
    assert told[-3] == "feedscope:   probe show " + runs["train"]
    assert told[-2] == (
        "feedscope: val, 0 batches measured: too few batches to judge: lane 0 measured no "
        "batch (completed; its 2 were warm-up)"
    )
    assert told[-1] == "feedscope:   probe show " + runs["val"]


def test_the_answer_at_exit_is_of_the_loaders_that_asked_for_it(tmp_path: Path) -> None:
    """A loader watched with answer=False into one store, then one with the answer into
    another: the answer at exit is told from the second's store, not the first's."""
    quiet, asked = tmp_path / "quiet.db", tmp_path / "asked.db"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""\
        import torch
        from torch.utils.data import DataLoader
        from probe import watch
        for batch in watch(DataLoader(torch.zeros(8, 3), batch_size=4), name="quiet",
                           db={str(quiet)!r}, answer=False):
            pass
        for batch in watch(DataLoader(torch.zeros(8, 3), batch_size=4), name="asked",
                           db={str(asked)!r}):
            pass
        """))  # fmt: skip
    result = run_captured([sys.executable, script], timeout=300)
    assert result.returncode == 0, result.stderr
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    with Store(asked) as store:
        (run,) = store.runs()
    assert told and told[0].startswith("feedscope: asked, ") and "quiet" not in result.stderr
    assert told[-1] == f"feedscope:   probe show {run.run_id}"


@pytest.mark.skipif(
    shutil.which("taskset") is None or (os.cpu_count() or 1) < 2,
    reason="taskset keeps the job to one core of two or more",
)
def test_like_last_measures_the_training_loader_on_the_lanes_and_cores_the_job_had(
    tmp_path: Path, imagenet_folder: Path
) -> None:
    """`probe doctor --like last` after a script with a training and a validation loader, run
    on one core (`taskset -c 0`): the training loader's files (DIR/train, though the validation
    loader was iterated last), on one lane on the CPU, kept to core 0; its first line says each
    thing it copied."""
    db = tmp_path / "store.db"
    watched = run_captured(
        ["taskset", "-c", "0", sys.executable, "-m", "probe", "watch", "--db", db, "--",
         IMAGENET_SHAPED, imagenet_folder, "-j", "1", "--epochs", "1", "-b", "8"],
        timeout=300,
    )  # fmt: skip
    assert watched.returncode == 0, watched.stderr
    result = probe_cli("doctor", "--like", "last", "--db", db, "--budget", "40", "--json")
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        train = next(run for run in store.runs() if run.label == "main.py")
    said = result.stderr.splitlines()[0]
    assert said.startswith(
        f"like run {train.run_id} (main.py, the training loader of its 2): copied data "
        f"{imagenet_folder / 'train'} (its 48 files), "
    ), said
    assert ", gpus none, num shards 1, cores 0, batch size 8, image size 64, workers 1, " in said
    session = json.loads(result.stdout)
    with Store(db) as store:
        measured = [read_run(store, run_id) for run_id in session["run_ids"]]
    assert measured
    for document in measured:
        assert document.config["spec"]["data_dir"] == str(imagenet_folder / "train")
        assert document.config["cores"] == "0"
        assert document.host["cpu_limits"]["cpu_set"] == "0"
        assert len(document.lanes) == 1 and document.lanes[0].gpu is None


def test_a_script_that_keeps_up_is_told_fed_and_a_loader_of_4_batches_too_few(
    tmp_path: Path,
) -> None:
    """Fed is a verdict: a short step and a fast loader (data-wait of a few percent) over about
    100 batches is told fed at exit, with its data-wait; a validation loader of 4 batches still
    gets "too few batches"."""
    db = tmp_path / "store.db"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import time, torch
        from torch.utils.data import DataLoader, Dataset

        class Quick(Dataset):
            def __init__(self, n):
                self.n = n
            def __len__(self):
                return self.n
            def __getitem__(self, i):
                time.sleep(0.0001)
                return torch.zeros(3)

        train = DataLoader(Quick(104), batch_size=2, shuffle=True)
        val = DataLoader(Quick(16), batch_size=4)
        for epoch in range(2):
            for batch in train:
                time.sleep(0.025)
            for batch in val:
                pass
        """))  # fmt: skip
    result = probe_cli("watch", "--db", db, "--", script)
    assert result.returncode == 0, result.stderr
    told = [line for line in result.stderr.splitlines() if line.startswith("feedscope: ")]
    assert told[0].startswith("feedscope: train.py, the training loader, "), told
    assert ": fed" in told[0] and "data-wait" in told[0], told
    assert "first change: no change: " in told[1], told
    (val,) = [line for line in told if line.startswith("feedscope: train.py (loader 2), ")]
    assert "too few batches to judge" in val, val
    with Store(db) as store:
        train = max(store.runs(), key=lambda run: run.started_ns if run.label == "train.py" else 0)
        verdict = diagnose_run(store, train.run_id).verdict
    assert verdict.kind in FED_KINDS, verdict


def test_probe_watch_under_torchrun_makes_one_run_of_two_lanes(
    tmp_path: Path, imagenet_folder: Path
) -> None:
    db = tmp_path / "store.db"
    result = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), "-m", "probe", "watch", "--db", str(db), "--",
         str(IMAGENET_SHAPED), str(imagenet_folder), "-j", "1", "--epochs", "1", "-b", "8"],
        timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with Store(db) as store:
        train = next(run for run in store.runs() if run.label == "main.py")
        lanes = store.lanes(train.run_id)
    assert sorted(lane.lane for lane in lanes) == [0, 1]
    assert all(lane.status is RunStatus.COMPLETED for lane in lanes)


# -- optional extras --------------------------------------------------------------------------


def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    for module in ("prometheus_client", "tensorboard", "lightning", "nvidia"):
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(f"raise ImportError('no {module} here')\n")
    env = {"PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"}
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    for flag, extra in (("--metrics-port=9400", "prometheus"), ("--tensorboard=tb", "tensorboard")):
        result = probe_cli("watch", flag, "--", script, env=env)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and f"pip install 'feedscope[{extra}]'" in line
        assert "ran" not in result.stdout
    plain = probe_cli("watch", "--db", tmp_path / "store.db", "--", script, env=env)
    assert plain.returncode == 0 and plain.stdout == "ran\n", plain.stderr  # DALI is an extra too
    lightning = subprocess.run(
        [sys.executable, "-c", "from probe import FeedscopeCallback"],
        capture_output=True, text=True, env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert "pip install 'feedscope[lightning]'" in lightning.stderr.strip().splitlines()[-1]
    with pytest.raises(InputError, match="metrics_port 0"):
        watch([], metrics_port=0)


def test_probe_run_serves_its_lanes_while_it_measures(tmp_path: Path, sample_cache: Path) -> None:
    port = free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(sample_cache)}
    command = [sys.executable, "-m", "probe", "run", "--db", str(tmp_path / "store.db"),
               "--gpus", "none", "--batch-size", "8", "--image-size", "64", "--duration", "6",
               "--metrics-port", str(port), "--label", "served"]  # fmt: skip
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)  # fmt: skip
    scraped: dict[str, float] = {}
    while run.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
                text = page.read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        for name, labels, value in re.findall(r"^(feedscope_\w+)\{([^}]*)\} (\S+)$", text, re.M):
            assert 'job="served"' in labels and 'rank="0"' in labels
            scraped[name] = float(value)
        time.sleep(0.2)
    _, stderr = run.communicate()
    assert run.returncode == 0, stderr
    with Store(tmp_path / "store.db") as store:
        (stored,) = store.runs()
        measured = [e for e in store.batches(stored.run_id) if not e.warmup]
    assert 0 < scraped["feedscope_batches_total"] <= len(measured) + 1000
    assert scraped["feedscope_images_total"] == 8 * scraped["feedscope_batches_total"]
    assert scraped["feedscope_loader_workers"] >= 1
    assert scraped["feedscope_cpu_cores"] > 0
    with socket.socket() as taken:  # another server on it
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("", port))
        taken.listen()
        refused = probe_cli("run", "--db", tmp_path / "store.db", "--gpus", "none",
                            "--metrics-port", port)  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: --metrics-port: port {port}: Address already in use"
    ]


def test_probe_grafana_prints_the_dashboard() -> None:
    result = probe_cli("grafana")
    assert result.returncode == 0, result.stderr
    dashboard = json.loads(result.stdout)
    assert result.stdout == DASHBOARD.read_text()
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any("DCGM_FI_PROF_SM_ACTIVE" in e and "on (UUID)" in e for e in expressions)
