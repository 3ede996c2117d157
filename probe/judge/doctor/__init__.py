"""The doctor: the whole diagnosis in one session on lanes kept warm.

It measures your setting first, then what is most likely to gain, by what that run shows: where
the loader starves with the CPU saturated, DALI next (more workers cannot add CPU); otherwise the
DataLoader's workers first, around the knee its run's curve predicts (`probe.judge.model`), or,
where a term of the curve was not measured, a search from yours (up where the CPU has room, down
where yours feeds the consumer). Each point gets its share of the budget left
(`probe.judge.session`): a slow pipeline gets longer points, not a refusal. It reads your setting
epoch by epoch where a shard is short enough for epoch starts to matter, diagnoses your setting,
weighs DALI against the DataLoader's answer as measured (the cores DALI frees count), and
verifies the first recommendation by running it again. A verification that disagrees beyond the
errors and the drift decides: yours and the candidate are measured in turn on the same lanes,
and the answer follows those runs, or keeps yours and says why. Every decision uses the points'
errors.

From the top down:
- `plan`: `run_doctor`, the session: what is measured in which order (yours, DALI or the
  worker search, the verification, the epoch reading), and the result it stores.
- `points`: how one point of each of the doctor's own kinds is measured: DALI, and your
  setting read epoch by epoch.
- `answer`: the judgement: your setting's verdict, the recommendations, DALI weighed and what
  it costs (`dali_trade`), and the verification with what a disagreeing one decides.
"""

from probe.judge.doctor.answer import dali_trade
from probe.judge.doctor.plan import run_doctor

__all__ = ["dali_trade", "run_doctor"]
