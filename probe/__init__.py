"""Measure, store, diagnose, report: the `probe` command and its library.

Imports `pipelines`; never `app`. `from probe import watch` records your own training loop.
"""

from pipelines import InputError
from probe.measure.watch import watch

__all__ = ["InputError", "watch"]
