"""Judging a claim from run records, the way a referee would.

Two pieces, used by ``experiments/claims.py`` (which says *which* runs each claim of the
paper needs, found by :class:`~cpcfl_tf.record_store.RecordIndex`) and the studies
beyond the paper (a reproducer's runs against the committed ones are
:mod:`cpcfl_tf.running.compare`'s):

* :func:`paired` takes a statistic of two runs of the *same seed* (the same partition,
  initial weights, batch order and pre-trained encoder) and gives their per-seed
  differences;
* :func:`verdict` applies :data:`RULE` to those differences.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import numpy as np

from cpcfl_tf.config import Config, config_record
from cpcfl_tf.record import RunRecord

HOLDS, OPPOSITE, NOT_SHOWN, CANNOT = "holds", "opposite", "not shown", "cannot be told here"
VERDICTS = (HOLDS, OPPOSITE, NOT_SHOWN, CANNOT)
MIN_SEEDS = 2
"""An interval needs at least two paired seeds."""

RULE = f"""\
Every claim is judged link by link. A link is a difference that the paper says is
positive (an ordering, an effect, or a statistic above a threshold), computed per seed
from two runs of the *same seed* (same partition, initial weights, batch order and
pre-trained encoder). Over the n seeds we give its mean, min, max and the 95 % interval
of the mean (Student's t, n - 1 degrees of freedom). The verdict:

- **{HOLDS}**: the interval lies above zero (on the paper's side);
- **{OPPOSITE}**: the interval lies below zero;
- **{NOT_SHOWN}**: the interval contains zero;
- **{CANNOT}**: a chosen seed lacks a run, or fewer than {MIN_SEEDS} seeds have both runs
  (the missing runs and the command that makes them are named; what the rule makes of
  the seeds there so far is shown beside it), or the data cannot host the claim (the
  reason is named).

A "close to" link (C11) holds when the interval lies within ± its margin, is
{OPPOSITE} when it lies wholly outside, and is {NOT_SHOWN} otherwise.
"""
"""The one rule every verdict follows; written at the top of ``claims.md``."""


def linear_eval_settings(config: Config) -> dict:
    """What decides a linear evaluation's scores: data, pre-training settings (any
    method) and seed."""
    record = config_record(config)
    return {k: record[k] for k in ("data", "pretrain", "seed")}


def linear_eval_config(stored: dict) -> Config:
    """The config a ``linear_eval.json`` stored (files written before pre-training
    settings lost their method still name it)."""
    return Config.from_dict({**stored, "pretrain": {k: v for k, v in stored["pretrain"].items()
                                                    if k != "method"}})


# -- statistics ----------------------------------------------------------------------
Statistic = Callable[[RunRecord], float]


def final_accuracy(record: RunRecord) -> float:
    """Accuracy (%) at the last round."""
    return 100 * record.final.accuracy


def accuracy_at(round_: int) -> Statistic:
    """Accuracy (%) after ``round_`` rounds."""
    def stat(record: RunRecord) -> float:
        return 100 * record.accuracy_at(round_)
    stat.__doc__ = f"accuracy (%) at T = {round_}"
    return stat


@dataclasses.dataclass(frozen=True)
class Summary:
    """Per-seed differences and what :data:`RULE` makes of them."""

    per_seed: dict[int, float]
    verdict: str
    margin: float | None = None
    so_far: str | None = None
    """With runs missing: the rule applied to the seeds there (None: nothing to say)."""

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def values(self) -> np.ndarray:
        return np.array(list(self.per_seed.values()), dtype=float)

    @property
    def mean(self) -> float | None:
        return float(self.values.mean()) if self.n else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return t_interval(self.values) if self.n >= MIN_SEEDS else None

    def to_json(self) -> dict:
        values = self.values
        return {"per_seed": {str(k): v for k, v in self.per_seed.items()}, "n": self.n,
                "mean": self.mean, "min": float(values.min()) if self.n else None,
                "max": float(values.max()) if self.n else None,
                "ci95": list(self.interval) if self.interval else None,
                "margin": self.margin, "verdict": self.verdict,
                **({"so_far": self.so_far} if self.so_far else {})}


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval of the mean of ``values`` (Student's t, n - 1 d.o.f.)."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2:
        raise ValueError("an interval needs at least two values")
    half = stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``level`` interval of a rate seen ``k`` times in ``n``."""
    from scipy import stats

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"a rate needs 0 <= k <= n and n >= 1, got {k} of {n}")
    tail = (1 - level) / 2
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def clustering_failures(record: RunRecord) -> float:
    """Clustering failures of a run (claim C4's statistic): IFCA's restarts, plus one if
    the final clusters are not the true groups."""
    return record.final.restarts + (record.final.ari < 1)


def verdict(per_seed: dict[int, float], margin: float | None = None, *,
            missing: int = 0) -> Summary:
    """:data:`RULE` applied to per-seed differences (positive: the paper's side), or for
    a "close to" link (``margin``) to differences that should be near zero. ``missing``
    runs of the chosen seeds make it "cannot be told here", with the verdict so far."""
    if len(per_seed) < MIN_SEEDS:
        return Summary(dict(per_seed), CANNOT, margin)
    if missing:
        return dataclasses.replace(verdict(per_seed, margin), verdict=CANNOT,
                                   so_far=verdict(per_seed, margin).verdict)
    low, high = t_interval(list(per_seed.values()))
    if margin is None:
        result = HOLDS if low > 0 else OPPOSITE if high < 0 else NOT_SHOWN
    else:
        inside = -margin <= low and high <= margin
        outside = low > margin or high < -margin
        result = HOLDS if inside else OPPOSITE if outside else NOT_SHOWN
    return Summary(dict(per_seed), result, margin)


def paired(a: dict[int, RunRecord], b: dict[int, RunRecord] | None, stat: Statistic,
           stat_b: Statistic | None = None, threshold: float = 0.0) -> dict[int, float]:
    """``stat(a) - stat_b(b)`` per seed that has both runs (``b`` None: ``stat(a) -
    threshold``)."""
    stat_b = stat_b or stat
    if b is None:
        return {seed: stat(r) - threshold for seed, r in sorted(a.items())}
    return {seed: stat(a[seed]) - stat_b(b[seed]) for seed in sorted(set(a) & set(b))}


def compared(result: dict | None, other: str) -> str:
    """Where a paired difference's first run stands against ``other``, in the words the
    studies' sentences use, from its verdict (a :meth:`Verdict.to_json`): ahead of
    (holds), behind (opposite) or not told apart from it; not compared without one."""
    if result is None:
        return f"not compared with {other}"
    return {HOLDS: f"ahead of {other}", OPPOSITE: f"behind {other}"}.get(
        result["verdict"], f"not told apart from {other}")


def combined(verdicts: Iterable[str]) -> str:
    """A claim's verdict from its links': one word when they agree, else each counted."""
    verdicts = list(verdicts)
    if len(set(verdicts)) == 1:
        return verdicts[0]
    return ", ".join(f"{verdicts.count(v)} of {len(verdicts)} links {v}"
                     for v in VERDICTS if v in verdicts)
