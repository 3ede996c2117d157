"""feedscope's probe: it measures input pipelines, stores what it measured, judges whether the
GPU starves and why, and presents the answer (the `probe` command, reports, and what the
dashboard reads). One room per step, imports going downward only:

    present/  ->  judge/  ->  measure/  ->  store/  ->  metrics.py, lane_figures.py, steady.py,
                                                       records.py

Imports `pipelines`; never `app`. `from probe import watch` records your own training loop, and
`from probe import FeedscopeCallback` a Lightning Trainer's (the `lightning` extra).
Importing `probe` itself imports nothing heavy: `watch` and `InputError` load when first asked
for, so that the `probe` command can stop quietly at a Ctrl-C while it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pipelines import InputError
    from probe.measure.lightning import FeedscopeCallback
    from probe.measure.watch import watch

__all__ = ["FeedscopeCallback", "InputError", "watch"]


def _answerer() -> Callable[[Path, str], list[str]]:
    """How `watch` tells the answer when the process exits: the judge's, which `probe.measure`
    below it cannot import. Loaded when the first watched run starts, since an exiting process
    cannot load what registers its own exit (`concurrent.futures`)."""
    import probe.judge.diagnosis
    import probe.store.documents  # noqa: F401  (used by the answer, at exit)
    from probe.present.watching import loader_answers

    return loader_answers


def __getattr__(name: str) -> Any:
    if name == "watch":
        from probe.measure.recording import Answer
        from probe.measure.watch import watch

        Answer.teller = _answerer
        return watch
    if name == "FeedscopeCallback":
        from probe.measure.live import require

        require("lightning", "lightning", "FeedscopeCallback", "lightning")
        from probe.measure.lightning import FeedscopeCallback
        from probe.measure.recording import Answer

        Answer.teller = _answerer
        return FeedscopeCallback
    if name == "InputError":
        from pipelines import InputError

        return InputError
    raise AttributeError(f"module 'probe' has no attribute {name!r}")
