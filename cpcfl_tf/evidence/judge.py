"""Judging a claim from run records, the way a referee would.

Two pieces, used by ``experiments/claims.py`` (which says *which* runs each claim of the
paper needs, found by :class:`~cpcfl_tf.records.store.RecordIndex`) and the studies
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
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.identity import config_record
from cpcfl_tf.records.record import RunRecord

HOLDS, OPPOSITE, NOT_SHOWN, CANNOT = "holds", "opposite", "not shown", "cannot be told here"
SMALLER = "smaller than the paper's"
VERDICTS = (HOLDS, SMALLER, OPPOSITE, NOT_SHOWN, CANNOT)
MIN_SEEDS = 2
"""An interval needs at least two paired seeds."""
ALPHA, POWER = 0.05, 0.8
"""The level of every test (a 95 % interval; the equivalence rule's two one-sided tests
each at 5 %, a 90 % interval) and the power the seeds a link needs are counted for."""

_LINKS = """\
Every claim is judged link by link. A link is a difference that the paper says is
positive (an ordering, an effect, or a statistic above a threshold), computed per seed
from two runs of the *same seed* (same partition, initial weights, batch order and
pre-trained encoder). Over the n seeds we give its mean, min, max and the 95 % interval
of the mean (Student's t, n - 1 degrees of freedom). The verdict:
"""
_CANNOT = f"""\
- **{CANNOT}**: a chosen seed lacks a run, or fewer than {MIN_SEEDS} seeds have both runs
  (the missing runs and the command that makes them are named; what the rule makes of
  the seeds there so far is shown beside it), or the data cannot host the claim (the
  reason is named).
"""

RULE = f"""\
{_LINKS}
- **{HOLDS}**: the interval lies above zero (on the paper's side);
- **{OPPOSITE}**: the interval lies below zero;
- **{NOT_SHOWN}**: the interval contains zero;
{_CANNOT}
A "close to" link (C11) holds when the interval lies within ± its margin, is
{OPPOSITE} when it lies wholly outside, and is {NOT_SHOWN} otherwise.
"""
"""The one rule every study's verdict follows; the claims' page writes
:data:`CLAIMS_RULE`, this rule with what a link of the paper's claims adds."""

CLAIMS_RULE = f"""\
{_LINKS}
- **{HOLDS}**: the interval lies above zero (on the paper's side);
- **{SMALLER}**: the interval contains zero but lies below the paper's own difference:
  whatever the effect is here, it is at most the interval's upper end, less than the
  paper found (on Fashion-MNIST, near its ceiling, effects are expected to be smaller
  than on STL-10);
- **{OPPOSITE}**: the interval lies below zero;
- **{NOT_SHOWN}**: the interval contains zero and the paper's difference (or the paper
  gives none): the seeds cannot tell;
{_CANNOT}
Beside each verdict: the largest effect the interval allows on the paper's side and on
the other ("at most +0.79, at least -0.41"), whether the paper's own difference lies
inside the interval, and, for a link {NOT_SHOWN} or {SMALLER}, the seeds that would decide
it: the fewest at which a two-sided t-test at 5 % finds the difference non-zero with 80 %
probability, were the per-seed differences normal with the mean and standard deviation
seen here (the noncentral t distribution; "-" where the mean or the spread is zero, or
more than 10,000 seeds would be needed).

A claim of no difference (C6's "no gain", C11's "close to") is judged by equivalence
(two one-sided t-tests at 5 % against a margin fixed before looking, its source named
in the link): **{HOLDS}** when both reject, that is when the 90 % interval lies within
± the margin; **{OPPOSITE}** when the 90 % interval lies wholly outside it; **{NOT_SHOWN}**
otherwise.
"""
"""The rule of the paper's claims, at the top of ``claims.md`` (docs/choices.md, "Judging
a claim")."""


def linear_eval_settings(config: Config) -> dict:
    """What decides a linear evaluation's scores: data, pre-training settings (any
    method) and seed."""
    record = config_record(config)
    return {k: record[k] for k in ("data", "pretrain", "seed")}


def linear_eval_config(stored: dict) -> Config:
    """The config a ``linear_eval.json`` stored (files written before pre-training
    settings lost their method still name it)."""
    return Config.from_dict(
        {**stored, "pretrain": {k: v for k, v in stored["pretrain"].items() if k != "method"}}
    )


# -- statistics ----------------------------------------------------------------------
Statistic = Callable[[RunRecord], float]


def final_accuracy(record: RunRecord) -> float:
    """Accuracy (%) at the last round."""
    return 100 * record.final_accuracy


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
    paper: float | None = None
    """The paper's own difference for the link, where it gives one (:data:`CLAIMS_RULE`)."""

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

    @property
    def paper_inside(self) -> bool | None:
        """Whether the paper's difference lies inside the interval (None: no interval, or
        the paper gives none)."""
        if self.interval is None or self.paper is None:
            return None
        return self.interval[0] <= self.paper <= self.interval[1]

    @property
    def seeds_needed(self) -> int | None:
        """For a link not decided: :func:`seeds_needed` of its differences."""
        if (
            self.margin is not None
            or self.n < MIN_SEEDS
            or (
                self.verdict not in (NOT_SHOWN, SMALLER) and self.so_far not in (NOT_SHOWN, SMALLER)
            )
        ):
            return None
        return seeds_needed(self.values)

    def to_json(self) -> dict:
        values = self.values
        return {
            "per_seed": {str(k): v for k, v in self.per_seed.items()},
            "n": self.n,
            "mean": self.mean,
            "min": float(values.min()) if self.n else None,
            "max": float(values.max()) if self.n else None,
            "ci95": list(self.interval) if self.interval else None,
            "margin": self.margin,
            "verdict": self.verdict,
            **({"so_far": self.so_far} if self.so_far else {}),
        }

    def claim_json(self) -> dict:
        """:meth:`to_json` with what a link of the paper's claims adds: the paper's
        difference, whether it lies inside the interval, the seeds that would decide the
        link, and for an equivalence link its 90 % interval."""
        return {
            **self.to_json(),
            "paper_difference": self.paper,
            "paper_inside": self.paper_inside,
            "seeds_needed": self.seeds_needed,
            **(
                {"ci90": list(t_interval(self.values, 1 - 2 * ALPHA))}
                if self.margin is not None and self.n >= MIN_SEEDS
                else {}
            ),
        }


def t_interval(samples: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval of the mean of ``samples`` (Student's t, n - 1 d.o.f.)."""
    from scipy import stats

    values = np.asarray(samples, dtype=float)
    n = len(values)
    if n < 2:
        raise ValueError("an interval needs at least two values")
    half = stats.t.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


def seeds_needed(
    samples: Sequence[float] | np.ndarray,
    power: float = POWER,
    alpha: float = ALPHA,
    most: int = 10_000,
) -> int | None:
    """The fewest seeds n at which a two-sided one-sample t-test at level ``alpha`` finds
    a non-zero mean with probability ``power``, were the per-seed differences normal with
    the mean and standard deviation of ``samples``: the power at n is
    P(|T| > t_(1 - alpha/2, n - 1)) for T noncentral t with n - 1 degrees of freedom and
    noncentrality mean / (sd / sqrt(n)). None where the mean or the standard deviation is
    zero, or beyond ``most``."""
    from scipy import stats

    values = np.asarray(samples, dtype=float)
    if len(values) < 2:
        raise ValueError("a power computation needs at least two values")
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if mean == 0 or sd == 0:
        return None
    effect = abs(mean) / sd
    # The t-test needs at least the z-test's n (its power is lower at every n): start there.
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    for n in range(max(2, int((z / effect) ** 2)), most + 1):
        critical = stats.t.ppf(1 - alpha / 2, n - 1)
        shift = effect * math.sqrt(n)
        if stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift) >= power:
            return n
    return None


def equivalent(samples: Sequence[float] | np.ndarray, margin: float, alpha: float = ALPHA) -> float:
    """The p-value of equivalence within ± ``margin`` (two one-sided t-tests, TOST): the
    larger of the tests of mean <= -margin and of mean >= margin; below ``alpha``, the
    mean lies within the margin."""
    from scipy import stats

    values = np.asarray(samples, dtype=float)
    n = len(values)
    if n < 2:
        raise ValueError("a test needs at least two values")
    error = values.std(ddof=1) / math.sqrt(n)
    if error == 0:
        return 0.0 if abs(values.mean()) < margin else 1.0
    above = stats.t.sf((values.mean() + margin) / error, n - 1)
    below = stats.t.cdf((values.mean() - margin) / error, n - 1)
    return float(max(above, below))


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
    ari = record.final.ari
    if ari is None:
        raise ValueError("a clustering failure needs the true groups: the record has no ARI")
    return record.final.restarts + (ari < 1)


def verdict(
    per_seed: dict[int, float],
    margin: float | None = None,
    *,
    missing: int = 0,
    paper: float | None = None,
    equivalence: bool = False,
) -> Summary:
    """:data:`RULE` applied to per-seed differences (positive: the paper's side), or for
    a "close to" link (``margin``) to differences that should be near zero. ``missing``
    runs of the chosen seeds make it "cannot be told here", with the verdict so far.
    :data:`CLAIMS_RULE` adds: with the paper's own difference ``paper`` (positive), an
    interval that contains zero but lies below it is "smaller than the paper's"; with
    ``equivalence``, a ``margin`` link is judged by two one-sided tests (its 90 %
    interval)."""
    if len(per_seed) < MIN_SEEDS:
        return Summary(dict(per_seed), CANNOT, margin, paper=paper)
    if missing:
        done = verdict(per_seed, margin, paper=paper, equivalence=equivalence)
        return dataclasses.replace(done, verdict=CANNOT, so_far=done.verdict)
    values = list(per_seed.values())
    if margin is None:
        low, high = t_interval(values)
        result = (
            HOLDS
            if low > 0
            else OPPOSITE
            if high < 0
            else SMALLER
            if paper is not None and paper > 0 and high < paper
            else NOT_SHOWN
        )
    else:
        low, high = t_interval(values, 1 - 2 * ALPHA if equivalence else 1 - ALPHA)
        inside = (
            equivalent(values, margin) < ALPHA if equivalence else -margin <= low and high <= margin
        )
        outside = low > margin or high < -margin
        result = HOLDS if inside else OPPOSITE if outside else NOT_SHOWN
    return Summary(dict(per_seed), result, margin, paper=paper)


def bounds(summary: Summary) -> str:
    """The largest effect ``summary``'s interval allows on the paper's side and on the
    other, in words (a "close to" link: its 90 % interval's ends)."""
    if summary.n < MIN_SEEDS:
        return "-"
    interval = (
        t_interval(summary.values, 1 - 2 * ALPHA)
        if summary.margin is not None
        else summary.interval
    )
    if interval is None:
        return "-"
    low, high = interval
    return f"at most {high:+.2f}, at least {low:+.2f}"


def paired(
    a: dict[int, RunRecord],
    b: dict[int, RunRecord] | None,
    stat: Statistic,
    stat_b: Statistic | None = None,
    threshold: float = 0.0,
) -> dict[int, float]:
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
        result["verdict"], f"not told apart from {other}"
    )


def combined(verdicts: Iterable[str]) -> str:
    """A claim's verdict from its links': one word when they agree, else each counted."""
    verdicts = list(verdicts)
    if len(set(verdicts)) == 1:
        return verdicts[0]
    return ", ".join(
        f"{verdicts.count(v)} of {len(verdicts)} links {v}" for v in VERDICTS if v in verdicts
    )
