"""Evaluation of a federated run (Sec. "Additional metrics").

Accuracy is the mean over clients of their local test accuracy, each client using the
model of the cluster it chose. F1 and AUROC pool every client's test predictions
(again from its own cluster model) into one set and score that as scikit-learn does
(F1 by scikit-learn, AUROC by its arithmetic to the last bit, without its input checks). ARI
compares the clients' cluster identities with their true groups.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from sklearn.metrics import adjusted_rand_score, f1_score


def client_accuracy(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``(K,)`` local test accuracy of each client from ``labels (K, n)``, ``probs (K, n, C)``."""
    return (probs.argmax(axis=-1) == labels).mean(axis=1)


def pooled_scores(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """F1 (macro, weighted) and AUROC (one-vs-rest and one-vs-one, macro and weighted).

    AUROC needs probabilities over the classes that occur: columns of absent classes
    are dropped and the rest renormalised (with the paper's partition all occur).
    """
    y = labels.reshape(-1)
    p = probs.reshape(-1, probs.shape[-1]).astype(np.float64)
    present = np.unique(y)
    scores = {
        "f1_macro": f1_score(y, p.argmax(1), average="macro"),
        "f1_weighted": f1_score(y, p.argmax(1), average="weighted"),
    }
    if len(present) > 2:
        q = p[:, present]
        q /= q.sum(axis=1, keepdims=True)
        classes = np.searchsorted(present, y)
        scores["auroc_ovr_macro"], scores["auroc_ovr_weighted"] = ovr_auroc(classes, q)
        scores["auroc_ovo_macro"], scores["auroc_ovo_weighted"] = ovo_auroc(classes, q)
    return {k: float(v) for k, v in scores.items()}


def binary_auroc(positive: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve of ``score`` for the boolean labels ``positive`` (both
    kinds occur), by the arithmetic of scikit-learn's ``roc_auc_score``, to the last bit:
    the curve's corners at each distinct score, from the highest down (collinear points
    dropped), integrated by the trapezoidal rule. Without its input checks, which were
    most of a report's time (``tests/test_metrics.py`` compares the bits)."""
    order = np.argsort(score, kind="stable")[::-1]
    score, hits = score[order], positive[order].astype(np.float64)
    ends = np.concatenate([np.nonzero(np.diff(score))[0], [hits.size - 1]])
    tps = np.cumsum(hits, dtype=np.float64)[ends]  # within a tie, order cannot matter
    fps = 1 + ends.astype(np.float64) - tps
    if fps.shape[0] > 2:
        corner = np.concatenate([[True], np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), [True]])
        fps, tps = fps[corner], tps[corner]
    fpr = np.concatenate([[0.0], fps]) / fps[-1]
    tpr = np.concatenate([[0.0], tps]) / tps[-1]
    return float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2.0, dtype=np.float64))


def ovr_auroc(y: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """One-vs-rest AUROC, macro and prevalence-weighted, of labels ``y`` in ``0..C-1``
    (every class occurs) and scores ``q (n, C)``: scikit-learn's
    ``roc_auc_score(multi_class="ovr")``, each class's score made once for both."""
    per_class = np.array([binary_auroc(y == c, q[:, c]) for c in range(q.shape[1])])
    support = np.bincount(y, minlength=q.shape[1])
    return float(np.average(per_class)), float(np.average(per_class, weights=support))


def ovo_auroc(y: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """One-vs-one AUROC (Hand & Till 2001), macro and prevalence-weighted, of labels
    ``y`` in ``0..C-1`` (every class occurs) and scores ``q (n, C)``: scikit-learn's
    ``roc_auc_score(multi_class="ovo")`` computation, its pairs' scores made once for
    both averages instead of once per average."""
    pairs = list(combinations(range(q.shape[1]), 2))
    pair_scores, prevalence = np.empty(len(pairs)), np.empty(len(pairs))
    for ix, (a, b) in enumerate(pairs):
        a_mask, b_mask = y == a, y == b
        ab_mask = np.logical_or(a_mask, b_mask)
        prevalence[ix] = np.average(ab_mask)
        pair_scores[ix] = (
            binary_auroc(a_mask[ab_mask], q[ab_mask, a])
            + binary_auroc(b_mask[ab_mask], q[ab_mask, b])
        ) / 2
    return np.average(pair_scores), np.average(pair_scores, weights=prevalence)


def cluster_ari(groups: np.ndarray, cluster_ids: np.ndarray) -> float:
    """Adjusted Rand index of the cluster identities against the true groups, over the
    clients that have a cluster (id >= 0; with partial participation some may never have
    taken part). NaN when none has."""
    groups, cluster_ids = np.asarray(groups), np.asarray(cluster_ids)
    assigned = cluster_ids >= 0
    if not assigned.any():
        return float("nan")
    return float(adjusted_rand_score(groups[assigned], cluster_ids[assigned]))


def class_accuracy(labels: np.ndarray, probs: np.ndarray, num_classes: int) -> np.ndarray:
    """``(C,)`` accuracy on each class over all clients' test images (NaN: class absent)."""
    y, pred = labels.reshape(-1), probs.reshape(-1, probs.shape[-1]).argmax(axis=1)
    return np.array(
        [(pred[y == c] == c).mean() if np.any(y == c) else np.nan for c in range(num_classes)]
    )


def zigzag_amplitude(accuracy: np.ndarray) -> float:
    """Mean of ``|a[t+1] - 2 a[t] + a[t-1]| / 2`` over the rounds t of the second half of
    the run: the round-to-round swing of an accuracy curve that alternates (a curve
    alternating between x and x + d gives d; a straight or smooth one about 0)."""
    a = np.asarray(accuracy, np.float64)
    centre = np.arange(max(1, len(a) // 2), len(a) - 1)
    if len(centre) == 0:
        return float("nan")
    return float(np.mean(np.abs(a[centre + 1] - 2 * a[centre] + a[centre - 1])) / 2)
