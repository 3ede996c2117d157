"""Judging: from stored runs, the facts of each lane, verdicts with their evidence, ranked
recommendations, and the sessions that measure several settings to decide (sweeps and the
doctor). Imports `probe.store` and, to run a session's points, `probe.measure`.

From the bottom up: `thresholds` (the rules' numbers), `changes` (what a recommendation
changes), `facts` (what the rules read about a lane), `evidence` and `verdicts` (whether and why
a lane starves), `knee` (a sweep's best and knee), `results` (a session's typed result and its
document), `model` (a DataLoader's predicted curve), `scaling` (the job on 1 to N lanes of one
host), `epochs` and `recommend` (what to change, once each, and what loses against yours),
`diagnosis` (a run's), `session` (points measured on lanes kept warm), `sweep` and `doctor` (a
package: its `plan`, its `points`, its `answer`).
"""
