"""Probes across ranks (torchrun on the CPU, gloo) and joining stores with `probe merge`."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import probe_cli, run_captured, stop_group
from pipelines import discover
from pipelines.dataset import read_order, shard
from probe.records import RunExport
from probe.store.db import Store
from probe.store.documents import read_run
from probe.store.merge import export_run, import_run


def test_torchrun_gives_one_run_with_a_lane_per_rank_on_disjoint_shards(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    db = tmp_path / "ranks.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "probe", "run", "--gpus", "none", "--data", str(filled_store["photos"]),
         "--batches", "5", "--warmup", "1", "--batch-size", "4", "--workers", "0",
         "--image-size", "32", "--sample-hz", "5", "--db", str(db), "--json"],
        timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # rank 0 alone prints it
    assert "rank 1: lane 1 of run" in result.stderr
    with Store(db) as store:
        (run,) = store.runs()
        assert run.run_id == document["run_id"] and run.status.value == "completed"
        assert {event.lane for event in store.batches(run.run_id)} == {0, 1}
    assert [(x["lane"], x["shard_id"], x["num_shards"]) for x in document["lanes"]] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert all(x["batches"] == 5 and x["images"] == 20 for x in document["lanes"])
    assert document["config"]["torchrun"] is True and document["config"]["world_size"] == 2
    files = read_order(discover(filled_store["photos"]), shuffle=True, seed=0)
    first, second = (set(shard(files, i, 2).files) for i in (0, 1))
    assert first and second and not first & second
    report = json.loads(probe_cli("report", "last", "--db", db, "--format", "json").stdout)
    assert report["reproduce"].startswith("torchrun --nproc-per-node=2 -m probe run")
    assert "--gpus none" in report["reproduce"] and "--num-shards" not in report["reproduce"]


def test_merge_joins_the_lanes_each_node_recorded(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    """A two-lane run split as two nodes would have recorded it, one lane each, on hosts whose
    monotonic clocks differ by an hour, joins back into the run it was."""
    run_id = filled_store["two"]["run_id"]
    with Store(filled_store["db"]) as store:
        whole = export_run(store, run_id)
    hour = 3600 * 10**9
    for lane, name in ((0, "node-a"), (1, "node-b")):
        shift = 0 if lane == 0 else hour
        host = {**whole.run.host, "hostname": name}
        host["clock"] = {"monotonic_ns": shift, "unix_ns": 0}
        part = RunExport(
            dataclasses.replace(whole.run, hostname=name, host=host,
                                started_ns=whole.run.started_ns + shift),
            [dataclasses.replace(x, hostname=name) for x in whole.lanes if x.lane == lane],
            [dataclasses.replace(e, t_ns=e.t_ns + shift) for e in whole.batches if e.lane == lane],
            [], {name: [dataclasses.replace(h, t_ns=h.t_ns + shift)
                        for h in whole.host[whole.run.hostname]]},
            [dataclasses.replace(c, t_ns=c.t_ns + shift) for c in whole.lane_cpu if c.lane == lane],
            [],
        )  # fmt: skip
        with Store(tmp_path / f"{name}.db") as node:
            import_run(node, part)
    with Store(tmp_path / "node-a.db") as node:
        alone = node.run(run_id)
    assert "1 of 2 lanes recorded here (missing: 1" in str(alone.reason)

    merged = probe_cli("merge", tmp_path / "node-a.db", tmp_path / "node-b.db",
                       "--db", tmp_path / "all.db")  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    assert f"node-b.db: run {run_id}: lanes 1" in merged.stderr
    with Store(tmp_path / "all.db") as store:
        run = store.run(run_id)
        document = read_run(store, run_id).to_json()
        batches = store.batches(run_id)
    assert run.status.value == "completed" and run.reason is None
    assert [x["hostname"] for x in document["lanes"]] == ["node-a", "node-b"]
    assert set(run.host["nodes"]) == {"node-b"}
    assert batches == whole.batches  # node-b's times moved back onto node-a's clock
    for lane, original in zip(document["lanes"], filled_store["two"]["lanes"], strict=True):
        assert lane["images_per_s"] == original["images_per_s"]
    again = probe_cli("merge", tmp_path / "node-b.db", "--db", tmp_path / "all.db")
    assert again.returncode == 0 and "nothing new" in again.stderr


def test_merge_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    missing = probe_cli("merge", tmp_path / "nowhere.db", "--db", tmp_path / "all.db")
    assert missing.returncode == 2
    assert missing.stderr == f"error: no store at {tmp_path / 'nowhere.db'}\n"
    (tmp_path / "notes.db").write_text("not a database, just notes\n" * 100)
    bad = probe_cli("merge", tmp_path / "notes.db", "--db", tmp_path / "all.db")
    assert bad.returncode == 2 and bad.stderr.startswith("error: cannot use")
    assert bad.stderr.count("\n") == 1


def two_nodes(photos: Path, stores: tuple[Path, Path]) -> list[subprocess.CompletedProcess[str]]:
    """A two-node torchrun launch on this host: two launchers (node ranks 0 and 1) meeting by c10d
    rendezvous on a free port, one CPU rank each (gloo), each with its own --db."""
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launchers = []
    for rank in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "-m", "probe", "run", "--gpus", "none", "--data", str(photos), "--batches", "5",
            "--warmup", "1", "--batch-size", "4", "--workers", "0", "--image-size", "32",
            "--sample-hz", "5", "--db", str(stores[rank]),
        ]  # fmt: skip
        launchers.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True))  # fmt: skip
    try:
        outputs = [launcher.communicate(timeout=300) for launcher in launchers]
    except BaseException:  # Ctrl-C, or the timeout: nothing they started outlives the test
        for launcher in launchers:
            stop_group(launcher)
        raise
    return [
        subprocess.CompletedProcess(x.args, x.returncode, out, err)
        for x, (out, err) in zip(launchers, outputs, strict=True)
    ]


def test_two_nodes_sharing_one_store_record_one_run(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    """On a cluster the default store is often on a shared file system: both nodes open (and
    the first time, create) the same file at once."""
    for attempt in range(2):
        shared = tmp_path / f"shared-{attempt}.db"
        for node in two_nodes(filled_store["photos"], (shared, shared)):
            assert node.returncode == 0, node.stderr
            assert "Traceback" not in node.stderr and "error" not in node.stderr
        with Store(shared) as store:
            (run,) = store.runs()
            lanes = [(x.lane, x.shard_id, x.num_shards) for x in store.lanes(run.run_id)]
        assert run.status.value == "completed" and lanes == [(0, 0, 2), (1, 1, 2)]


def test_two_nodes_with_a_store_each_record_one_run(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    stores = (tmp_path / "node-0.db", tmp_path / "node-1.db")
    for node in two_nodes(filled_store["photos"], stores):
        assert node.returncode == 0, node.stderr
        assert "Traceback" not in node.stderr
    with Store(stores[0]) as store:  # rank 0 records every rank's lane
        (run,) = store.runs()
        lanes = [(x.lane, x.shard_id, x.num_shards) for x in store.lanes(run.run_id)]
    assert run.status.value == "completed" and lanes == [(0, 0, 2), (1, 1, 2)]
