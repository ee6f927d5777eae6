"""Evaluation of a federated run (Sec. "Additional metrics").

Accuracy is the mean over clients of their local test accuracy, each client using the
model of the cluster it chose. F1 and AUROC pool every client's test predictions
(again from its own cluster model) into one set and score that with scikit-learn. ARI
compares the clients' cluster identities with their true groups.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np
from sklearn.metrics import adjusted_rand_score, f1_score, roc_auc_score

try:  # the binary AUROC roc_auc_score computes each pair with, without its input checks
    from sklearn.metrics._ranking import _binary_roc_auc_score as _binary_auroc
except ImportError:  # pragma: no cover - another scikit-learn layout: the public function
    _binary_auroc = roc_auc_score


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
    scores = {"f1_macro": f1_score(y, p.argmax(1), average="macro"),
              "f1_weighted": f1_score(y, p.argmax(1), average="weighted")}
    if len(present) > 2:
        q = p[:, present]
        q /= q.sum(axis=1, keepdims=True)
        for average in ("macro", "weighted"):
            scores[f"auroc_ovr_{average}"] = roc_auc_score(
                y, q, multi_class="ovr", average=average, labels=present)
        scores["auroc_ovo_macro"], scores["auroc_ovo_weighted"] = ovo_auroc(
            np.searchsorted(present, y), q)
    return {k: float(v) for k, v in scores.items()}


def ovo_auroc(y: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """One-vs-one AUROC (Hand & Till 2001), macro and prevalence-weighted, of labels
    ``y`` in ``0..C-1`` (every class occurs) and scores ``q (n, C)``: scikit-learn's
    ``roc_auc_score(multi_class="ovo")`` computation, its pairs' scores made once for
    both averages instead of once per average (they were most of a report's time)."""
    pairs = list(combinations(range(q.shape[1]), 2))
    pair_scores, prevalence = np.empty(len(pairs)), np.empty(len(pairs))
    for ix, (a, b) in enumerate(pairs):
        a_mask, b_mask = y == a, y == b
        ab_mask = np.logical_or(a_mask, b_mask)
        prevalence[ix] = np.average(ab_mask)
        pair_scores[ix] = (_binary_auroc(a_mask[ab_mask], q[ab_mask, a])
                           + _binary_auroc(b_mask[ab_mask], q[ab_mask, b])) / 2
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
    return np.array([(pred[y == c] == c).mean() if np.any(y == c) else np.nan
                     for c in range(num_classes)])


def zigzag_amplitude(accuracy: np.ndarray) -> float:
    """Mean of ``|a[t+1] - 2 a[t] + a[t-1]| / 2`` over the rounds t of the second half of
    the run: the round-to-round swing of an accuracy curve that alternates (a curve
    alternating between x and x + d gives d; a straight or smooth one about 0)."""
    a = np.asarray(accuracy, np.float64)
    centre = np.arange(max(1, len(a) // 2), len(a) - 1)
    if len(centre) == 0:
        return float("nan")
    return float(np.mean(np.abs(a[centre + 1] - 2 * a[centre] + a[centre - 1])) / 2)
