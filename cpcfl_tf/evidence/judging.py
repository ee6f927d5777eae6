"""A claim judged on a tree's runs (:func:`judge`): per link the per-seed differences,
their summary by the rule of :mod:`cpcfl_tf.evidence.judge`, and what is missing
(:class:`Judged`)."""

from __future__ import annotations

import dataclasses

from cpcfl_tf.evidence.claims import Claim, Link
from cpcfl_tf.evidence.judge import (
    CANNOT,
    Summary,
    combined,
    paired,
    verdict,
)
from cpcfl_tf.evidence.tree import Evidence


@dataclasses.dataclass
class Judged:
    claim: Claim
    links: list[tuple[Link, Summary, list[str]]]
    """Each link with its summary and what is missing (``seed K: run``)."""

    @property
    def verdict(self) -> str:
        if self.claim.cannot:
            return CANNOT
        return combined(s.verdict for _, s, _ in self.links)


def judge(ev: Evidence, claim: Claim) -> Judged:
    """``claim`` judged by the rule of :mod:`cpcfl_tf.evidence.judge` on ``ev``'s runs:
    each link's per-seed differences, their summary and what is missing; what a link used
    is noted in ``ev`` (its :attr:`~Evidence.linked` records and :attr:`~Evidence.pairs`)
    for the report's provenance notes."""
    judged = []
    for link in claim.links:
        names = [n for n in (link.a, link.b, link.c, link.d) if n is not None]
        if link.linear_eval:  # one evaluation per seed scores all its encoders
            if link.b is None:
                raise ValueError(f"{link.label}: a linear evaluation link names two methods")
            a, b = ev.linear_eval(link.a), ev.linear_eval(link.b)
            diffs = {s: a[s] - b[s] for s in sorted(set(a) & set(b))}
            missing = [f"seed {s}: linear evaluation" for s in ev.seeds if s not in a or s not in b]
        else:
            runs = ev.together(names)
            ev.linked.update((id(r), r) for have in runs.values() for r in have.values())
            ev.pairs += [
                (claim.id, seed, [runs[n][seed] for n in names])
                for seed in ev.seeds
                if all(seed in runs[n] for n in names)
            ]
            diffs = paired(
                runs[link.a],
                None if link.b is None else runs[link.b],
                link.stat,
                threshold=link.threshold,
            )
            if link.c is not None and link.d is not None:
                other = paired(runs[link.c], runs[link.d], link.stat)
                diffs = {s: diffs[s] - other[s] for s in diffs if s in other}
            missing = [
                f"seed {s}: {name}" for s in ev.seeds for name in names if not ev.every(name, s)
            ]
        judged.append(
            (
                link,
                verdict(
                    diffs,
                    link.margin,
                    missing=len(missing),
                    paper=link.effect,
                    equivalence=link.equivalence,
                ),
                missing,
            )
        )
    return Judged(claim, judged)
