"""What eats the batches: nothing, a fixed step time, or a real training step.

`parse_consumer` checks the text a user gives (`none`, `sleep:MS`, `model:NAME`) without
importing torch; `build_consumer` makes the consumer inside a lane. A step returns once its work
is done on the device, so the time it takes is the step's real time.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from pipelines import Batch, InputError
from probe.measure.devices import device_sync

if TYPE_CHECKING:
    import torch

BUILTIN_MODEL = "small-resnet"
USAGE = "none, sleep:MS (a fixed step of MS milliseconds) or model:NAME (e.g. model:resnet50)"


class ConsumerKind(str, Enum):
    NONE = "none"
    SLEEP = "sleep"
    MODEL = "model"


@dataclass(frozen=True)
class ConsumerSpec:
    """A parsed consumer: its kind and its argument (milliseconds or a model name)."""

    kind: ConsumerKind
    step_ms: float | None = None
    model: str | None = None

    def __str__(self) -> str:
        if self.kind is ConsumerKind.SLEEP:
            return f"sleep:{self.step_ms:g}"
        if self.kind is ConsumerKind.MODEL:
            return f"model:{self.model}"
        return "none"


def parse_consumer(text: str) -> ConsumerSpec:
    """Reads `none`, `sleep:MS` or `model:NAME`.

    Raises:
        InputError: anything else, with what is accepted.
    """
    kind, _, argument = text.strip().partition(":")
    if kind == "none" and not argument:
        return ConsumerSpec(ConsumerKind.NONE)
    if kind == "sleep":
        try:
            step_ms = float(argument)
        except ValueError:
            raise InputError(f"sleep:MS needs a number of milliseconds (got {text!r})") from None
        if not 0 < step_ms <= 60_000:
            raise InputError(f"sleep:MS needs 0 < MS <= 60000 (got {text!r})")
        return ConsumerSpec(ConsumerKind.SLEEP, step_ms=step_ms)
    if kind == "model" and argument:
        return ConsumerSpec(ConsumerKind.MODEL, model=argument)
    raise InputError(f"unknown consumer {text!r}: use {USAGE}")


def check_model(spec: ConsumerSpec) -> None:
    """Checks that a model consumer names a model that exists (where torchvision is installed).

    Raises:
        InputError: torchvision has no model of that name.
    """
    if spec.kind is not ConsumerKind.MODEL or spec.model == BUILTIN_MODEL:
        return
    if importlib.util.find_spec("torchvision") is None:
        return  # replaced by the built-in model: model_note says so
    import torchvision

    if spec.model not in torchvision.models.list_models():
        known = ", ".join(sorted(torchvision.models.list_models())[:12])
        raise InputError(f"torchvision has no model {spec.model!r} (some it has: {known}, ...)")


def model_note(spec: ConsumerSpec) -> str | None:
    """What a model consumer will really run, when that is not what was asked for."""
    if spec.kind is not ConsumerKind.MODEL or spec.model == BUILTIN_MODEL:
        return None
    if importlib.util.find_spec("torchvision") is None:
        return (
            f"torchvision is not installed: {spec.model} is replaced by the built-in "
            f"{BUILTIN_MODEL}"
        )
    return None


class Consumer(Protocol):
    def step(self, batch: Batch) -> None:
        """Consumes one batch; returns when the work is done."""


def build_consumer(spec: ConsumerSpec, device: int | None, num_classes: int) -> Consumer:
    """Makes the consumer for one lane.

    Raises:
        InputError: torchvision has no model of that name.
    """
    if spec.kind is ConsumerKind.NONE:
        return _Nothing()
    if spec.kind is ConsumerKind.SLEEP:
        assert spec.step_ms is not None  # parse_consumer guarantees it
        return (
            _Sleep(spec.step_ms / 1000) if device is None else _GpuBusy(spec.step_ms / 1000, device)
        )
    assert spec.model is not None
    return _TrainStep(spec.model, device, num_classes)


class _Nothing:
    def step(self, batch: Batch) -> None:
        pass


class _Sleep:
    """A fixed step time on the CPU: the process sleeps."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step(self, batch: Batch) -> None:
        time.sleep(self.seconds)


class _GpuBusy:
    """A fixed step time on a GPU that really occupies it: bf16 matrix products, as many as
    take the step time (calibrated when made), then waiting for them."""

    SIDE = 4096

    def __init__(self, seconds: float, device: int) -> None:
        import torch

        self.device = torch.device("cuda", device)
        self._wait = device_sync(device)
        shape = (self.SIDE, self.SIDE)
        self.a = torch.randn(shape, device=self.device, dtype=torch.bfloat16)
        self.b = torch.randn(shape, device=self.device, dtype=torch.bfloat16)
        self.out = torch.empty(shape, device=self.device, dtype=torch.bfloat16)
        self._products(10)  # warm-up: cuBLAS picks its kernel, the clocks rise
        per_product = self._time(lambda: self._products(20)) / 20
        self.repeats = max(1, round(seconds / per_product))

    def step(self, batch: Batch) -> None:
        self._products(self.repeats)
        self._wait()

    def _products(self, count: int) -> None:
        import torch

        for _ in range(count):
            torch.mm(self.a, self.b, out=self.out)

    def _time(self, work: Callable[[], None]) -> float:
        self._wait()
        started = time.perf_counter()
        work()
        self._wait()
        return time.perf_counter() - started


class _TrainStep:
    """Forward, loss, backward and SGD step of an image classifier; bf16 autocast and
    channels-last on a GPU, as fast training loops use them."""

    def __init__(self, name: str, device: int | None, num_classes: int) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cpu") if device is None else torch.device("cuda", device)
        self.on_gpu = device is not None
        self._wait = device_sync(device)
        model = _make_model(name, num_classes).to(self.device)
        if self.on_gpu:
            torch.backends.cudnn.benchmark = True
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model = model.train()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, batch: Batch) -> None:
        torch = self.torch
        images = batch.images
        if self.on_gpu:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=self.on_gpu
        ):
            loss = self.loss(self.model(images), batch.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._wait()


def _make_model(name: str, num_classes: int) -> torch.nn.Module:
    if name != BUILTIN_MODEL and importlib.util.find_spec("torchvision") is not None:
        import torchvision

        try:
            model: torch.nn.Module = torchvision.models.get_model(
                name, weights=None, num_classes=num_classes
            )
        except ValueError:
            known = ", ".join(sorted(torchvision.models.list_models())[:12])
            raise InputError(
                f"torchvision has no model {name!r} (some it has: {known}, ...)"
            ) from None
        return model
    return _small_resnet(num_classes)


def _small_resnet(num_classes: int) -> torch.nn.Module:
    """A ResNet with one basic block per stage, 32 to 256 channels: a real network that trains
    in a few milliseconds per small batch on a CPU."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, inputs: int, outputs: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False),
                nn.BatchNorm2d(outputs),
                nn.ReLU(inplace=True),
                nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
                nn.BatchNorm2d(outputs),
            )
            self.skip: nn.Module = nn.Identity()
            if stride != 1 or inputs != outputs:
                self.skip = nn.Sequential(
                    nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
                )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.relu(self.body(x) + self.skip(x))
            return out

    widths = (32, 64, 128, 256)
    layers: list[nn.Module] = [
        nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    for stage, width in enumerate(widths):
        layers.append(Block(widths[max(stage - 1, 0)], width, 1 if stage == 0 else 2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], num_classes)]
    return nn.Sequential(*layers)
