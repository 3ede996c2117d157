"""Lightning: `FeedscopeCallback` watches a `Trainer`'s training batches as `watch` watches a
loop (the `lightning` extra).

    from probe import FeedscopeCallback

    trainer = lightning.Trainer(callbacks=[FeedscopeCallback("resnet50")])

One `fit` is one run of kind `watch`, each training epoch an epoch of it. Lightning iterates the
loader itself, so the batches are timed by its hooks: a batch's wait runs from the end of the
last training step (or the epoch's start, or a validation's end) to the batch's start, which
takes in Lightning's fetch of the next batch (it fetches one ahead) and the copy to the device;
its step is the training step with its backward and optimizer step. Validation runs are not
counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from probe.measure.watch import Hooked, Outlets, Watched
from probe.records import RunStatus


class FeedscopeCallback(Callback):
    """Records a `Trainer`'s training loop into the store, with `watch`'s options.

    Args:
        name: the run's label in listings.
        db: the store; default `$FEEDSCOPE_DB`, else your data folder.
        sample_hz: GPU and host samples per second (0: none).
        warmup: the first batches, left out of every figure; or "auto".
        metrics_port: serve the figures for Prometheus (each rank on `metrics_port +
            LOCAL_RANK`); needs the `prometheus` extra.
        tensorboard: a folder, or a SummaryWriter (such as your TensorBoardLogger's
            `.experiment`), to write the figures to every `tensorboard_every` batches.
        answer: when the process exits, print on stderr the answer (the verdict and first
            change), as `watch` does.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        db: Path | str | None = None,
        sample_hz: float = 10.0,
        warmup: int | str = 5,
        metrics_port: int | None = None,
        tensorboard: str | Path | Any | None = None,
        tensorboard_every: int = 100,
        answer: bool = True,
    ) -> None:
        self.name, self.db, self.sample_hz, self.warmup = name, db, sample_hz, warmup
        self.answer = answer
        self.outlets = Outlets.checked(metrics_port, tensorboard, tensorboard_every)
        self.watched: Watched[Any] | None = None
        self._hooks: Hooked | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = trainer.train_dataloader or ()  # what `watch` describes the run by
        self.watched = Watched(loader, self.name, self.db, self.sample_hz, self.warmup,
                               self.outlets, self.answer)  # fmt: skip
        self._hooks = Hooked(self.watched)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._hooks is not None:
            self._hooks.epoch_start()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._hooks is not None:
            self._hooks.batch_start(batch)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if self._hooks is not None:
            self._hooks.batch_end()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._hooks is not None:
            self._hooks.resume()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._hooks is not None:
            self._hooks.epoch_end()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.watched is not None:
            self.watched.close(RunStatus.COMPLETED)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if self.watched is not None:
            reason = f"{type(exception).__name__}: {exception}".splitlines()[0]
            interrupted = isinstance(exception, KeyboardInterrupt)
            self.watched.close(RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED, reason)
