"""Storing: one SQLite file per store (`db`), the documents a run and its lanes are read as
(`documents`), the dashboard's downsampled series and listings (`series`), and joining stores
(`merge`). Imports `probe.records` and `probe.metrics`; never measures or judges.
"""
