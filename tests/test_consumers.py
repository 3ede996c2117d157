"""Consumers: the text users give, and the CPU ones for real."""

from __future__ import annotations

import time

import pytest
import torch

from pipelines import Batch, InputError
from probe.measure.consumers import ConsumerKind, build_consumer, parse_consumer


@pytest.mark.parametrize(
    ("text", "kind", "shown"),
    [
        ("none", ConsumerKind.NONE, "none"),
        ("sleep:20", ConsumerKind.SLEEP, "sleep:20"),
        ("sleep:2.5", ConsumerKind.SLEEP, "sleep:2.5"),
        ("model:resnet50", ConsumerKind.MODEL, "model:resnet50"),
    ],
)
def test_accepted_consumers(text: str, kind: ConsumerKind, shown: str) -> None:
    spec = parse_consumer(text)
    assert spec.kind is kind
    assert str(spec) == shown


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resnet50", "unknown consumer 'resnet50'"),
        ("sleep", "sleep:MS needs a number"),
        ("sleep:fast", "sleep:MS needs a number"),
        ("sleep:0", "0 < MS <= 60000"),
        ("model:", "unknown consumer"),
        ("none:1", "unknown consumer"),
    ],
)
def test_refused_consumers(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_consumer(text)


def batch(size: int = 4, side: int = 32) -> Batch:
    return Batch(torch.randn(size, 3, side, side), torch.randint(0, 5, (size,)))


def test_sleep_on_the_cpu_takes_its_time() -> None:
    consumer = build_consumer(parse_consumer("sleep:30"), None, 5)
    started = time.perf_counter()
    consumer.step(batch())
    assert 0.029 <= time.perf_counter() - started < 0.3


def test_the_built_in_model_trains() -> None:
    consumer = build_consumer(parse_consumer("model:small-resnet"), None, 5)
    fixed = batch(8, 64)
    model = consumer.model  # type: ignore[attr-defined]
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        consumer.step(fixed)
    after = list(model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
