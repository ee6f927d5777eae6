"""How a federation combines what its members sent, and what each way tolerates: the one
home of both federated stages' aggregation (a cluster's members in the clustered rounds,
:mod:`cpcfl_tf.clustered.algorithm`; a round's clients in a federated pre-training,
:mod:`cpcfl_tf.pretraining.federated_pretrain`). Pure NumPy.

``federated.aggregation`` chooses the combination, ``federated.update_norm`` bounds every
update before it counts:

- ``mean``: the |D_u|-weighted mean (the paper's Eq. weighted_avg). One member sending
  huge weights moves it without bound: it tolerates no bad member.
- ``median``: the coordinate-wise median (Yin et al., "Byzantine-Robust Distributed
  Learning", ICML 2018; Flower's FedMedian). Of n members it tolerates
  ``(n - 1) // 2`` bad ones; the median of two is their mean, so it tolerates none below
  :data:`MIN_MEMBERS`.
- ``trimmed-mean``: the coordinate-wise mean without the k largest and k smallest values
  (Yin et al. 2018, with beta = ``trim_fraction`` the share cut from each end, at least
  the share of bad members; Flower's FedTrimmedAvg). k = ``int(beta * n)``, but at least
  one whenever n >= :data:`MIN_MEMBERS` and beta > 0 (:func:`trim_count`), so the
  default 0.2 cuts one of three or four members, not none; it tolerates k.
- ``update_norm``: each update (weights minus the model the member was sent) is scaled
  down to that L2 norm where it is longer (Sun et al., "Can You Really Backdoor
  Federated Learning?", 2019). It tolerates any number of bad members in the sense that
  none moves the combination by more than the bound; a cluster of 1 or 2 members has
  no other defence, so a run whose clusters can be that small is refused ``median`` and
  ``trimmed-mean`` without it (:func:`defence_problem`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

AGGREGATIONS = ("mean", "median", "trimmed-mean")
ROBUST = ("median", "trimmed-mean")
"""The aggregations that tolerate a bad member once a cluster has :data:`MIN_MEMBERS`."""
MIN_MEMBERS = 3
"""The fewest members among which a median or a trimmed mean can out-vote one bad member."""

Sizes = Sequence[float] | np.ndarray
"""Each member's example count (its weight in a mean), a list or an array."""


def trim_count(members: int, fraction: float) -> int:
    """How many of ``members`` values ``trimmed-mean`` cuts from each end:
    ``int(fraction * members)``, at least one when ``members`` >= :data:`MIN_MEMBERS` and
    ``fraction`` > 0, never so many that nothing is left."""
    k = int(fraction * members)
    if fraction > 0 and members >= MIN_MEMBERS:
        k = max(k, 1)
    return min(k, (members - 1) // 2)


def tolerated(how: str, members: int, fraction: float = 0.2) -> int:
    """How many bad members of ``members`` the combination ``how`` out-votes (each bad
    member may send anything finite): none for the mean; ``(n - 1) // 2`` for the median;
    :func:`trim_count` for the trimmed mean."""
    if how == "median":
        return (members - 1) // 2
    if how == "trimmed-mean":
        return trim_count(members, fraction)
    if how == "mean":
        return 0
    raise ValueError(f"unknown aggregation {how!r}")


def too_few(how: str, members: int) -> bool:
    """Whether a combination of ``members`` (at least one) is too small for the robust
    aggregation ``how`` to out-vote one bad member (fewer than :data:`MIN_MEMBERS`): what a
    round's record names (``too_few_to_defend``). Never for the mean, which claims no
    such defence."""
    return how in ROBUST and 0 < members < MIN_MEMBERS


def weighted_average(stacked: Sequence[np.ndarray], sizes: Sizes) -> list[np.ndarray]:
    """``sum_u |D_u| phi_u / sum_u |D_u|`` for each array, accumulated in float64.

    ``stacked[i]`` holds array i of every member, stacked on a leading axis.
    """
    share = np.asarray(sizes, np.float64) / float(np.sum(sizes))
    return [np.tensordot(share, a.astype(np.float64), axes=1).astype(a.dtype) for a in stacked]


def trimmed_mean(a: np.ndarray, k: int) -> np.ndarray:
    """The coordinate-wise mean of ``a``'s members (axis 0) without the ``k`` largest and
    ``k`` smallest values, computed as SciPy's ``trim_mean`` computes it."""
    n = len(a)
    return np.mean(np.partition(a, (k, n - k - 1), axis=0)[k : n - k], axis=0)


def combine(
    stacked: Sequence[np.ndarray],
    sizes: Sizes,
    how: str = "mean",
    trim: float = 0.2,
    mean=weighted_average,
) -> list[np.ndarray]:
    """One model from its members' weights (``stacked[i][u]``: array i of member u) as
    ``how`` says (the module's list); ``mean(stacked, sizes)`` is the weighted mean used
    for ``mean``. The median and the trimmed mean ignore ``sizes``, as Flower's do."""
    if how == "mean":
        return mean(stacked, sizes)
    if how == "median":
        return [np.median(a, axis=0).astype(a.dtype) for a in stacked]
    if how == "trimmed-mean":
        k = trim_count(len(stacked[0]), trim) if len(stacked) else 0
        return [np.asarray(trimmed_mean(a, k)).astype(a.dtype) for a in stacked]
    raise ValueError(f"unknown aggregation {how!r}")


def bound_updates(
    weights: Sequence[np.ndarray], sent: Sequence[np.ndarray], bound: float
) -> list[np.ndarray]:
    """``weights`` (array i of member u at ``weights[i][u]``) with each member's update
    (its arrays minus ``sent``, the model it was sent, stacked the same way) scaled down
    to L2 norm ``bound`` over all its arrays where it is longer:
    ``phi + min(1, bound / ||delta||) * delta``. A member within the bound keeps its bits;
    the list itself is returned when none is longer."""
    if not len(weights) or not len(weights[0]):
        return list(weights)
    deltas = [w.astype(np.float64) - s.astype(np.float64) for w, s in zip(weights, sent)]
    norms = np.sqrt(sum(np.square(d).reshape(len(d), -1).sum(1) for d in deltas))
    longer = norms > bound
    if not longer.any():
        return list(weights)
    scale = (bound / norms[longer]).reshape(-1, 1)
    out = []
    for w, s, d in zip(weights, sent, deltas):
        new = w.copy()
        new[longer] = (
            s[longer].astype(np.float64)
            + (d[longer].reshape(len(scale), -1) * scale).reshape(d[longer].shape)
        ).astype(w.dtype)
        out.append(new)
    return out


@dataclasses.dataclass(frozen=True)
class Defence:
    """A stage's aggregation settings (``federated.aggregation``, ``trim_fraction``,
    ``update_norm``): what both stages combine with."""

    aggregation: str = "mean"
    trim_fraction: float = 0.2
    update_norm: float | None = None

    @classmethod
    def of(cls, fl) -> Defence:
        """The defence of a federated config section."""
        return cls(fl.aggregation, fl.trim_fraction, fl.update_norm)

    @property
    def is_default(self) -> bool:
        """The paper's: the plain weighted mean, nothing bounded."""
        return self == Defence()

    def named(self) -> dict:
        """Its settings as a cache key or record names them (the trim only where it cuts)."""
        out: dict[str, str | float] = {"aggregation": self.aggregation}
        if self.aggregation == "trimmed-mean":
            out["trim_fraction"] = self.trim_fraction
        if self.update_norm is not None:
            out["update_norm"] = self.update_norm
        return out

    def combine(
        self,
        stacked: Sequence[np.ndarray],
        sizes: Sizes,
        sent: Sequence[np.ndarray] | None = None,
        mean=weighted_average,
    ) -> list[np.ndarray]:
        """The members' combination, each update bounded first where ``update_norm`` is
        set (``sent``: what each member was sent, stacked like ``stacked``)."""
        if self.update_norm is not None and sent is not None:
            stacked = bound_updates(stacked, sent, self.update_norm)
        return combine(stacked, sizes, self.aggregation, self.trim_fraction, mean)


def defence_problem(defence: Defence, smallest: int, why: str) -> str | None:
    """Why a stage whose combinations can have as few as ``smallest`` members (``why``:
    what makes them that small, in a few words) cannot hold ``defence`` (None: it can): a
    robust aggregation with no norm bound behind it, where a combination can have fewer
    than :data:`MIN_MEMBERS` members."""
    if (
        defence.aggregation not in ROBUST
        or defence.update_norm is not None
        or smallest >= MIN_MEMBERS
    ):
        return None
    small = (
        "the median of two is their mean"
        if defence.aggregation == "median"
        else "of two it cuts nothing"
    )
    return (
        f"federated.aggregation={defence.aggregation} out-votes a bad member only among "
        f"{MIN_MEMBERS} or more ({small}), and {why}; set "
        "federated.update_norm too, which bounds every update (docs/flower.md, "
        '"What each defence tolerates")'
    )


def lower_median(counts: Sequence[int]) -> int:
    """The ``ceil(n / 2)``-th smallest of ``counts``: with fewer than half of them too
    large, it is one of the others' (of two, the smaller)."""
    ordered = sorted(int(c) for c in counts)
    return ordered[(len(ordered) - 1) // 2]
