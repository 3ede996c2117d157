"""feedscope's probe: it measures input pipelines, stores what it measured, judges whether the
GPU starves and why, and presents the answer (the `probe` command, reports, and what the
dashboard reads). One room per step, imports going downward only:

    present/  ->  judge/  ->  measure/  ->  store/  ->  metrics.py, steady.py, records.py

Imports `pipelines`; never `app`. `from probe import watch` records your own training loop.
"""

from pipelines import InputError
from probe.measure.watch import watch

__all__ = ["InputError", "watch"]
