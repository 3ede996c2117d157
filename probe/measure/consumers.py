"""What eats the batches: nothing, a fixed step time, or a real training step.

`parse_consumer` checks the text a user gives (`none`, `sleep:MS`, `sleep:MS@SM%`,
`model:NAME`) without importing torch; `build_consumer` makes the consumer inside a lane. A step
returns once its work is done on the device, so the time it takes is the step's real time.

`sleep:MS@SM%` stands in for a training step that was measured: its time, and the share of it
its kernels held the SMs. A training step's kernels leave SMs and gaps that DALI's kernels (its
decoder's CUDA part, resize, normalize) run in; a step of back-to-back matrix products that fill
every SM for all of its time leaves them none, and DALI's GPU work then waits for the step's end
(on one H100, DALI fed 1,756 images/s to such a 50.9 ms step and 2,480 to ResNet-18's own). So
the step is cut into slices of a few milliseconds, each busy for its share and idle for the rest.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from pipelines import Batch, InputError
from probe.measure.devices import device_spin, device_sync

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

BUILTIN_MODEL = "small-resnet"
USAGE = (
    "none, sleep:MS (a fixed step of MS milliseconds, its GPU busy throughout), sleep:MS@SM% "
    "(busy SM% of it, as a measured step was) or model:NAME (e.g. model:resnet50)"
)


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
    sm_pct: float | None = None  # the share of the step its GPU work holds the SMs (None: all)

    def __str__(self) -> str:
        if self.kind is ConsumerKind.SLEEP:
            held = "" if self.sm_pct is None else f"@{self.sm_pct:g}%"
            return f"sleep:{self.step_ms:g}{held}"
        if self.kind is ConsumerKind.MODEL:
            return f"model:{self.model}"
        return "none"


def parse_consumer(text: str) -> ConsumerSpec:
    """Reads `none`, `sleep:MS`, `sleep:MS@SM%` or `model:NAME`.

    Raises:
        InputError: anything else, with what is accepted.
    """
    kind, _, argument = text.strip().partition(":")
    if kind == "none" and not argument:
        return ConsumerSpec(ConsumerKind.NONE)
    if kind == "sleep":
        length, at, held = argument.partition("@")
        try:
            step_ms = float(length)
            sm_pct = float(held.removesuffix("%")) if at else None
        except ValueError:
            raise InputError(
                f"sleep:MS needs a number of milliseconds, and sleep:MS@SM% a percentage "
                f"(got {text!r})"
            ) from None
        if not 0 < step_ms <= 60_000:
            raise InputError(f"sleep:MS needs 0 < MS <= 60000 (got {text!r})")
        if sm_pct is not None and not 0 < sm_pct <= 100:
            raise InputError(f"sleep:MS@SM% needs 0 < SM <= 100 (got {text!r})")
        return ConsumerSpec(ConsumerKind.SLEEP, step_ms=step_ms, sm_pct=sm_pct)
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
        return  # replaced by the built-in model: consumer_note says so
    import torchvision

    if spec.model not in torchvision.models.list_models():
        known = ", ".join(sorted(torchvision.models.list_models())[:12])
        raise InputError(f"torchvision has no model {spec.model!r} (some it has: {known}, ...)")


def consumer_note(spec: ConsumerSpec, step_read: str | None = None) -> str | None:
    """What a consumer stands for where that needs saying: a model replaced by the built-in
    one; a stand-in for a watched step (`sleep:MS@SM%`), with how far the job may run from it,
    and how its time was read from the job's batches where that needs saying (`step_read`: a
    DDP job's, its ranks' step without their wait for each other; then `sleep:MS` too)."""
    if spec.kind is ConsumerKind.SLEEP and spec.step_ms and (spec.sm_pct is not None or step_read):
        step = f"a stand-in for a watched step: {spec.step_ms:g} ms"
        if step_read:
            step = f"{step}, {step_read}"
        if spec.sm_pct is None:
            return step
        work = spec.step_ms * spec.sm_pct / 100
        return (
            f"{step}, its SMs busy {spec.sm_pct:g}% of it ({work:.1f} ms of GPU work), as the "
            "job's kernels held them; the step as the job ran it, its loader's load beside it "
            "(its workers' CPU, its batches' copy to the GPU): a loader that frees those may "
            "shorten it toward its GPU work, so where the step holds a figure here the job may "
            f"run up to {spec.step_ms / work:.1f}x it"
        )
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
        if device is None:
            return _Sleep(spec.step_ms / 1000)
        return _GpuBusy(spec.step_ms / 1000, device, (spec.sm_pct or 100.0) / 100)
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
    """A fixed step time on a GPU that really occupies it, for `busy` of it: the step is cut
    into slices of about `SLICE_S`; in each, bf16 matrix products fill the SMs for `busy` of the
    slice, then one thread spins on the device for the rest (the stream stays in use, its SMs
    free); then the step waits for them. Calibrated when made: on the step itself, run until
    it takes its time within `CLOSE` (a product timed once, before the clocks rose, put a 30 ms
    step at 20.6 ms on one H100)."""

    SIDE = 2048  # a product of about 30 us on an H100: the grain of a training step's kernels
    SLICE_S = 0.002
    WARM_S = 0.5  # products first, for that long: the clocks rise
    CLOSE = 0.02
    ROUNDS = 6
    CALIBRATE_S = 3.0  # no round begins after this long: a long step stays as it came

    def __init__(self, seconds: float, device: int, busy: float = 1.0) -> None:
        import torch

        self.device = torch.device("cuda", device)
        self.seconds, self.busy = seconds, busy
        self._wait = device_sync(device)
        self._spin = device_spin(device)
        shape = (self.SIDE, self.SIDE)
        self.a = torch.randn(shape, device=self.device, dtype=torch.bfloat16)
        self.b = torch.randn(shape, device=self.device, dtype=torch.bfloat16)
        self.out = torch.empty(shape, device=self.device, dtype=torch.bfloat16)
        started = time.perf_counter()
        while time.perf_counter() - started < self.WARM_S:
            self._products(50)
            self._wait()
        per_product = self._time(lambda: self._products(100)) / 100
        cycles = 10_000_000
        per_cycle = self._time(lambda: self._spin(cycles)) / cycles
        calibrating = time.perf_counter()
        for _ in range(self.ROUNDS):
            self._plan(per_product, per_cycle)
            took = min(self._time(lambda: self.step(None)) for _ in range(3))
            if abs(took / seconds - 1) <= self.CLOSE:
                break
            if time.perf_counter() - calibrating > self.CALIBRATE_S:
                logger.info("a %.1f ms step calibrated to %.1f ms", seconds * 1e3, took * 1e3)
                break
            per_product, per_cycle = per_product * took / seconds, per_cycle * took / seconds

    def _plan(self, per_product: float, per_cycle: float) -> None:
        """The step's slices: how many products each, and the cycles each spins after them."""
        seconds, busy = self.seconds, self.busy
        slices = max(1, round(seconds / self.SLICE_S)) if busy < 1 else 1
        products = max(1, round(seconds * busy / per_product))
        self.plan = [products // slices + (k < products % slices) for k in range(slices)]
        idle_s = max(0.0, seconds - products * per_product) / slices
        self.idle_cycles = round(idle_s / per_cycle) if busy < 1 else 0

    def step(self, batch: Batch | None) -> None:
        for products in self.plan:
            self._products(products)
            if self.idle_cycles:
                self._spin(self.idle_cycles)
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
