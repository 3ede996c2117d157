"""The Prometheus endpoint: `/metrics`, served from the training process by the official client
(`prometheus-client`, the `prometheus` extra), for a Prometheus that scrapes the fleet.

Each scrape reads the lanes' running totals (`probe.measure.live.Live`) as they stand; nothing
is computed on the batch path. One endpoint per process and port: several watched loaders of
one process (a training and a validation loader) share it, told apart by `job`.

    feedscope_data_wait_seconds_total        the loop's wait for batches (measured batches)
    feedscope_step_seconds_total             its steps
    feedscope_images_total, feedscope_batches_total
    feedscope_warmup_batches_total           the first batches, left out of the above
    feedscope_epoch_starts_total, feedscope_epoch_start_stall_seconds_total
    feedscope_cpu_cores                      the lane's processes, its workers included (gauge)
    feedscope_loader_workers                 the loader's workers (gauge)

`rate(wait) / (rate(wait) + rate(step))` over any window is the data-wait share of that window.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from probe.measure.live import Live

LABELS = ("job", "rank", "local_rank", "Hostname", "gpu", "UUID")
COUNTERS = (  # name (without `_total`), help, the Live total
    ("feedscope_data_wait_seconds", "Time the training loop waited for batches.", "wait_s"),
    ("feedscope_step_seconds", "Time the training loop spent on its steps.", "step_s"),
    ("feedscope_images", "Images the training loop took.", "images"),
    ("feedscope_batches", "Batches the training loop took (warm-up left out).", "batches"),
    ("feedscope_warmup_batches", "The first batches, left out of the other totals.",
     "warmup_batches"),
    ("feedscope_epoch_starts", "Epoch starts measured (after the warm-up).", "stalls.starts"),
    ("feedscope_epoch_start_stall_seconds",
     "Wait of the batches that open an epoch beyond the steady wait.", "stalls.stall_s"),
)  # fmt: skip
_lock = threading.Lock()  # the endpoints' table; never taken by a training loop
_endpoints: dict[int, _Collector] = {}


class _Collector:
    """Every lane this endpoint serves, read at each scrape."""

    def __init__(self) -> None:
        self.lives: list[Live] = []

    def collect(self) -> Iterator[Metric]:
        lives = list(self.lives)
        for name, text, total in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=LABELS)
            for live in lives:
                counter.add_metric(_values(live), float(_read(live, total)))
            yield counter
        cores = GaugeMetricFamily(
            "feedscope_cpu_cores", "CPU cores used by the lane's processes.", labels=LABELS
        )
        workers = GaugeMetricFamily(
            "feedscope_loader_workers", "The loader's worker processes.", labels=LABELS
        )
        for live in lives:
            if live.cpu_cores is not None:
                cores.add_metric(_values(live), live.cpu_cores)
            if live.workers is not None:
                workers.add_metric(_values(live), float(live.workers))
        yield cores
        yield workers


def serve(port: int, live: Live) -> None:
    """Serves `live` on `port` (all interfaces), starting the endpoint if this process has none
    there yet. Raises OSError where the port cannot be had."""
    with _lock:
        collector = _endpoints.get(port)
        if collector is None:
            collector = _Collector()
            registry = CollectorRegistry(auto_describe=True)
            registry.register(collector)
            start_http_server(port, registry=registry)
            _endpoints[port] = collector
        collector.lives.append(live)


def _values(live: Live) -> list[str]:
    labels = live.labels
    return [labels.job, str(labels.rank), str(labels.local_rank), labels.hostname, labels.gpu,
            labels.uuid]  # fmt: skip


def _read(live: Live, total: str) -> Any:
    value: Any = live
    for part in total.split("."):
        value = getattr(value, part)
    return value
