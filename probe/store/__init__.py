"""Storing: one SQLite file per store, opened with its locks and transactions (`connection`) and
read and written (`db`), its tables, migrations and row mapping (`schema`), per-bucket sums kept
as rows are written (`rollups`), a run read as a typed document (`documents`), the dashboard's
downsampled and live series (`series`), and joining stores (`merge`). Imports `probe.records` and
`probe.metrics`; never measures, judges or presents.
"""
