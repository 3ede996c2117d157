"""Measure, store, diagnose, report: the `probe` command and its library.

Imports `pipelines`; never `app`.
"""
