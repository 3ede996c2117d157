"""What the `probe` command shows on a terminal: tables and verdicts built from documents.

Pure: documents in, rich renderables or lines of text out. Every GPU figure says which metric it
is: SM activity (GPM), or kernel-active (NVML utilization.gpu), which overstates busy-ness.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from probe.bench import BenchResult
from probe.steady import plus_minus
from probe.summary import images_per_s_error


def live_table(lanes: Sequence[Any]) -> Table:
    """The lanes of a run in progress (`LaneLive`), over the last 3 s."""
    now_ns = time.monotonic_ns()
    table = Table(title="live (last 3 s)", title_justify="left")
    for column in ("lane", "device", "shard", "state", "batches", "images/s", "data-wait"):
        table.add_column(column, justify="right" if column in _NUMERIC else "left")
    for lane in lanes:
        rate, wait = lane.images_per_s(now_ns), lane.data_wait_frac(now_ns)
        state = lane.state
        if state == "warming up":
            state = f"warming up ({lane.warmup_batches})"
        table.add_row(
            str(lane.lane), lane.device, lane.shard, state, str(lane.batches),
            "-" if rate is None else f"{rate:,.0f}", pct(wait, 0),
        )  # fmt: skip
    return table


def run_table(document: dict[str, Any]) -> Table:
    """One row per lane of a run document."""
    table = Table(
        title=f"run {document['run_id']}: {document['pipeline']}, consumer "
        f"{document['consumer']} ({document['status']})",
        caption=f"all lanes: {document['images_per_s']:,.0f} images/s; ± is the 95% interval; "
        "warm-up batches excluded",
    )
    for column in ("lane", "device", "shard", "status", "batches", "images/s", "data-wait",
                   "latency p50/p95/p99 ms", "GPU busy", "CPU %"):  # fmt: skip
        left = column in ("lane", "device", "status")
        table.add_column(column, justify="left" if left else "right")
    for lane in document["lanes"]:
        latency = lane["batch_latency_ms"]
        table.add_row(
            str(lane["lane"]),
            "cpu" if lane["gpu"] is None else f"cuda:{lane['gpu']}",
            f"{lane['shard_id']}/{lane['num_shards']}",
            lane["status"],
            str(lane["batches"]),
            plus_minus(lane["images_per_s"], lane.get("images_per_s_error")),
            pct_pm(lane["data_wait_frac"], lane.get("data_wait_frac_error")),
            "/".join(num(latency[k], 1) for k in ("p50", "p95", "p99")),
            gpu_busy(lane),
            num(lane.get("cpu_pct"), 0),
        )
    return table


def run_line(document: dict[str, Any]) -> str:
    """One run in a line: images/s with its error, the worst data-wait, what it took."""
    lanes = document["lanes"]
    waits = [x["data_wait_frac"] for x in lanes if x["data_wait_frac"] is not None]
    wait = f", data-wait {max(waits):.1%}" if waits else ""
    first = lanes[0] if lanes else {}
    took = ""
    if first.get("seconds"):
        warmup = first.get("warmup_s") or 0.0
        took = f"; {first['seconds']:.1f} s measured after {warmup:.1f} s of warm-up"
    if first.get("startup_s"):
        took += f" and {first['startup_s']:.1f} s to start the lane"
    rate = plus_minus(document["images_per_s"], images_per_s_error(lanes))
    return f"{rate} images/s{wait} ({document['status']}, run {document['run_id']}{took})"


def gpu_busy(lane: dict[str, Any]) -> str:
    """SM activity (GPM), and NVML's kernel-active beside it, each labelled."""
    if lane["sm_active_source"] == "gpm":
        kernel = lane.get("kernel_active_pct")
        nvml = "" if kernel is None else f", kernel-active {kernel:.0f}% (NVML)"
        return f"SM active {lane['sm_active_pct']:.0f}% (GPM){nvml}"
    if lane["sm_active_source"] == "nvml":
        return f"kernel-active {lane['sm_active_pct']:.0f}% (NVML)"
    return "-"


def run_notes(document: dict[str, Any]) -> list[str]:
    """How it read and warmed up, the transients, lane failures, skipped files, the consumer's
    note and unavailable metrics."""
    notes = []
    config = document["config"]
    read = config.get("read")
    if read:
        per_epoch = sorted({lane.get("batches_per_epoch") for lane in config.get("lanes", [])}
                           - {None})  # fmt: skip
        epochs = f", {'/'.join(map(str, per_epoch))} batches per epoch" if per_epoch else ""
        notes.append(f"read: {'one endless stream' if read == 'stream' else 'epoch by epoch'}"
                     f"{epochs}")  # fmt: skip
    for lane in document["lanes"]:
        notes += _transients(lane)
        if lane["reason"]:
            notes.append(f"lane {lane['lane']}: {lane['status']}: {lane['reason']}")
        if lane.get("skipped_files"):
            notes.append(f"lane {lane['lane']}: skipped {lane['skipped_files']} undecodable files")
    if document["config"].get("consumer_note"):
        notes.append(f"consumer: {document['config']['consumer_note']}")
    unavailable: dict[str, set[str]] = {}
    for item in document["unavailable_metrics"]:
        unavailable.setdefault(item["reason"], set()).add(item["metric"])
    notes += [f"unavailable: {', '.join(sorted(m))}: {r}" for r, m in unavailable.items()]
    if document["status"] == "running":
        notes.append("the run is still going: figures so far")
    return notes


def _transients(lane: dict[str, Any]) -> list[str]:
    """A lane's start-up, warm-up, epoch starts and consumer alone: measured, and apart from
    its steady figures."""
    parts = []
    if lane.get("startup_s"):
        parts.append(f"its process started in {lane['startup_s']:.1f} s")
    if lane.get("build_s"):
        parts.append(f"the pipeline built in {lane['build_s']:.1f} s")
    if lane.get("warmup_batches"):
        settled = {True: "", False: ", not settled", None: ""}[lane.get("warmup_settled")]
        parts.append(
            f"warm-up {lane['warmup_batches']} batches, {lane.get('warmup_s') or 0:.1f} s{settled}"
        )
    if lane.get("capped"):
        parts.append("measuring stopped at its time limit before images/s was as precise")
    out = [f"lane {lane['lane']}: " + "; ".join(parts)] if parts else []
    start = lane.get("epoch_start")
    if start:
        split = ""
        if start.get("loader_start_ms") is not None:
            split = (
                f" ({start['loader_start_ms']:,.0f} ms starting the loader, "
                f"{start['refill_ms']:,.0f} ms refilling its prefetch)"
            )
        out.append(
            f"lane {lane['lane']}: {start['starts']} epoch starts, {start['stall_ms']:,.0f} ms "
            f"each{split}: {start['share']:.1%} of the time"
        )
    alone = lane.get("consumer_alone")
    if alone and alone.get("images_per_s"):
        tuned = f" (tuned first, in {alone['tune_s']:.1f} s)" if alone.get("tune_s") else ""
        out.append(
            f"lane {lane['lane']}: the consumer alone{tuned}, on batches already on the device: "
            f"{plus_minus(alone['images_per_s'], alone.get('images_per_s_error'))} images/s"
        )
    return out


def runs_table(documents: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"Runs ({len(documents)} newest)")
    for column in ("run", "created (UTC)", "status", "pipeline", "consumer", "lanes", "images/s",
                   "data-wait", "label"):  # fmt: skip
        table.add_column(column, justify="right" if column in _NUMERIC else "left")
    for d in documents:
        table.add_row(
            d["run_id"], d["created"].replace("T", " ").rstrip("Z"), d["status"], d["pipeline"],
            d["consumer"], lanes_text(d), f"{d['images_per_s']:,.0f}",
            pct(mean_wait(d), 0), d["label"] or "",
        )  # fmt: skip
    return table


def mean_wait(document: dict[str, Any]) -> float | None:
    waits = [x["data_wait_frac"] for x in document["lanes"] if x["data_wait_frac"] is not None]
    return sum(waits) / len(waits) if waits else None


def lanes_text(document: dict[str, Any]) -> str:
    gpus = [lane["gpu"] for lane in document["lanes"]]
    if all(g is None for g in gpus):
        return f"{len(gpus)} cpu"
    return "gpu " + ",".join(str(g) for g in gpus)


def diagnosis_lines(
    verdict: dict[str, Any], recommendations: Sequence[dict[str, Any]]
) -> list[str]:
    """A verdict with its evidence, then the recommendations, ranked."""
    severity = verdict["severity"]
    wait = verdict["data_wait_frac"]
    head = f"verdict: {verdict['title']}"
    if severity != "none":
        head += f" ({severity}: data-wait {pct(wait)})"
    if verdict.get("partial"):
        head += " [partial: the run did not complete]"
    if verdict.get("reliable") is False:
        head += " [not trusted: the host was busy]"
    lines = [head] + [f"  - {item['text']}" for item in verdict["evidence"]]
    if recommendations:
        lines.append("recommendations:")
    for rank, item in enumerate(recommendations, 1):
        predicted = item["predicted_images_per_s"]
        line = f"  {rank}. {item['setting']}: {item['action']}"
        if predicted is not None:
            shown = plus_minus(predicted, item.get("predicted_error"))
            line += f"; predicted {shown} images/s ({item['basis']})"
        else:
            line += f" ({item['basis']})"
        if item.get("measured_images_per_s") is not None:
            measured = item["measured_images_per_s"]
            change = f" ({measured / predicted - 1:+.1%})" if predicted else ""
            line += f"; verified: {measured:,.0f} images/s{change}"
        lines.append(line)
        lines += [f"     {note}" for note in item.get("notes", ())]
    return lines


def sweep_table(points: Sequence[dict[str, Any]], knob: str, document: dict[str, Any]) -> Table:
    """A sweep's points, its knee and what it flagged."""
    knee = (document.get("knee") or {}).get(knob)
    best = (document.get("best") or {}).get(knob)
    over = set(document.get("oversubscribed", []))
    table = Table(title=f"sweep of {knob}, consumer {document['consumer']}")
    table.caption = "± is the 95% interval of each point's images/s"
    for column in (knob, "images/s", "data-wait", "CPU cores", "", "run"):
        table.add_column(column, justify="left" if column in ("", "run") else "right")
    for point in points:
        marks = []
        if point[knob] == knee:
            marks.append("knee")
        if point[knob] == best:
            marks.append("best")
        if point[knob] in over:
            marks.append("oversubscribed: slower than the best")
        if point.get("host_busy"):
            marks.append("the host was busy: not trusted")
        cpu = point.get("cpu_pct")
        table.add_row(
            str(point[knob]), plus_minus(point["images_per_s"], point.get("images_per_s_error")),
            pct_pm(point["data_wait_frac"], point.get("data_wait_frac_error")),
            "-" if cpu is None else f"{cpu / 100:.1f}", ", ".join(marks), point["run_id"] or "",
        )  # fmt: skip
    for item in document.get("skipped", []):
        table.add_row(str(item["setting"]), "-", "-", "-", f"not run: {item['reason']}", "")
    return table


def doctor_lines(document: dict[str, Any]) -> list[str]:
    """The doctor's answer: verdict, DALI, the epoch reading, recommendations and
    verification, as text."""
    lines = diagnosis_lines(document["verdict"], document["recommendations"])
    dali = document["dali"]
    if dali["images_per_s"] is not None:
        shown = plus_minus(dali["images_per_s"], dali.get("images_per_s_error"))
        dali_line = f"DALI ({dali['setting']}): {shown} images/s"
        dali_line += f", data-wait {pct(dali['data_wait_frac'])}"
        lines.append(dali_line + (f": {dali['advice']}" if dali.get("advice") else ""))
    else:
        lines.append(f"DALI: not measured: {dali['reason']}")
    lines += epochs_lines(document.get("epochs"))
    verify = document.get("verify")
    if verify is None:
        lines.append("not verified: the budget ran out, the run was stopped, or nothing to run")
    elif verify["error_frac"] is not None:
        agrees = (
            "within their errors and the drift between runs"
            if verify.get("agrees")
            else "more than their errors and the drift between runs"
        )
        predicted = plus_minus(
            verify["predicted_images_per_s"], verify.get("predicted_images_per_s_error")
        )
        measured = plus_minus(
            verify["measured_images_per_s"], verify.get("measured_images_per_s_error")
        )
        lines.append(
            f"verified {verify['setting']}: predicted {predicted}, measured {measured} images/s "
            f"({verify['error_frac']:+.1%}: {agrees}; run {verify['run_id']})"
        )
    start = document.get("startup_s")
    if start:
        lines.append(
            f"the lanes started, with the consumer tuned and timed alone, in {start:.1f} s"
        )
    if document.get("consumer_note"):
        lines.append(f"consumer: {document['consumer_note']}")
    return lines


def epochs_lines(epochs: dict[str, Any] | None) -> list[str]:
    """Your setting read epoch by epoch, against the same read as one stream."""
    if not epochs:
        return []
    if epochs.get("images_per_s") is None:
        return [f"epoch by epoch: not measured: {epochs.get('reason')}"]
    shown = plus_minus(epochs["images_per_s"], epochs.get("images_per_s_error"))
    line = (
        f"epoch by epoch ({epochs['setting']}, {epochs['batches_per_epoch']} batches per epoch, "
        f"as a `for` loop per epoch reads it): {shown} images/s"
    )
    if epochs.get("cost_frac") is not None:
        line += f", {epochs['cost_frac']:.1%} below the same read as one stream"
    start = epochs.get("epoch_start")
    if start:
        line += f"; each epoch start {start['stall_ms']:,.0f} ms, {start['share']:.1%} of the time"
    return [line]


def bench_table(results: Sequence[BenchResult]) -> Table:
    table = Table(title="Input pipelines alone (no consumer), warm-up excluded")
    for column in ("pipeline", "device", "settings", "batches", "images/s",
                   "batch p50 ms", "batch p95 ms", "start-up s"):  # fmt: skip
        left = column in ("pipeline", "device", "settings")
        table.add_column(column, justify="left" if left else "right")
    for r in results:
        table.add_row(
            r.backend.value, r.device, r.settings, str(r.batches), f"{r.images_per_s:,.0f}",
            f"{r.batch_interval_ms_p50:.1f}", f"{r.batch_interval_ms_p95:.1f}",
            f"{r.startup_s:.1f}",
        )  # fmt: skip
    if len(results) == 2 and results[0].images_per_s > 0:
        ratio = results[1].images_per_s / results[0].images_per_s
        table.caption = f"{results[1].backend.value} / {results[0].backend.value}: {ratio:.2f}x"
    return table


_NUMERIC = {"batches", "images/s", "data-wait"}


def pct_pm(value: float | None, error: float | None) -> str:
    """A share with its error, '31.0% ± 1.2%'; '-' for none."""
    if value is None:
        return "-"
    return pct(value) if error is None else f"{value:.1%} ± {error:.1%}"


def pct(value: float | None, digits: int = 1) -> str:
    """A share as a percentage; '-' for none."""
    return "-" if value is None else f"{value:.{digits}%}"


def num(value: float | None, digits: int) -> str:
    """A number with thousands separators; '-' for none."""
    return "-" if value is None else f"{value:,.{digits}f}"
