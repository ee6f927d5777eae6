"""The paper's scores (F1, AUROC, ARI) against references written here from their
definitions, on a case with an absent class (NumPy only: no scikit-learn)."""
import itertools

import numpy as np
import pytest

from cpcfl_tf.clustered.metrics import cluster_ari, pooled_scores


def _auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Mann-Whitney: the chance a positive outscores a negative (ties count half)."""
    pos, neg = scores[positive], scores[~positive]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


def _reference(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    pred = p.argmax(1)
    labels = np.union1d(y, pred)  # F1 over classes that occur or are predicted
    f1 = []
    for c in labels:
        tp, fp = np.sum((pred == c) & (y == c)), np.sum((pred == c) & (y != c))
        fn = np.sum((pred != c) & (y == c))
        f1.append(2 * tp / (2 * tp + fp + fn))
    support = np.array([np.sum(y == c) for c in labels])
    present = np.unique(y)
    q = p[:, present] / p[:, present].sum(1, keepdims=True)  # absent columns dropped
    prevalence = np.array([np.mean(y == c) for c in present])
    ovr = np.array([_auc(q[:, i], y == c) for i, c in enumerate(present)])
    pairs, weights = [], []
    for (i, a), (j, b) in itertools.combinations(enumerate(present), 2):
        both = (y == a) | (y == b)
        pairs.append((_auc(q[both, i], y[both] == a) + _auc(q[both, j], y[both] == b)) / 2)
        weights.append(both.mean())
    return {"f1_macro": np.mean(f1), "f1_weighted": np.sum(support * f1) / support.sum(),
            "auroc_ovr_macro": ovr.mean(), "auroc_ovr_weighted": np.sum(prevalence * ovr),
            "auroc_ovo_macro": np.mean(pairs),
            "auroc_ovo_weighted": np.sum(np.array(weights) * pairs) / np.sum(weights)}


def test_pooled_scores_match_their_definitions_with_an_absent_class():
    rng = np.random.default_rng(7)
    y = rng.choice([0, 1, 2, 4, 5], size=(6, 40))  # 6 clients; class 3 never occurs
    logits = rng.normal(size=(6, 40, 6)) + 2.0 * np.eye(6)[y]
    logits[..., 3] += 1.0  # ... but is predicted at times
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert np.any(p.argmax(-1) == 3)
    got = pooled_scores(y, p.astype(np.float32))
    want = _reference(y.reshape(-1), p.reshape(-1, 6).astype(np.float32).astype(np.float64))
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-9), key


def _ari(a: np.ndarray, b: np.ndarray) -> float:
    """Hubert and Arabie's adjusted Rand index from the contingency table."""
    table = np.array([[np.sum((a == i) & (b == j)) for j in np.unique(b)] for i in np.unique(a)])
    pairs = lambda n: n * (n - 1) / 2  # noqa: E731
    index = pairs(table).sum()
    rows, cols, total = pairs(table.sum(1)).sum(), pairs(table.sum(0)).sum(), pairs(table.sum())
    expected = rows * cols / total
    return (index - expected) / ((rows + cols) / 2 - expected)


def test_ari_matches_its_definition_over_the_clients_that_took_part():
    groups = np.repeat([0, 1, 2], 5)
    ids = np.array([2, 2, 2, 0, -1, 1, 1, 0, 1, -1, 0, 0, 0, 2, 0])
    took_part = ids >= 0
    assert cluster_ari(groups, ids) == pytest.approx(_ari(groups[took_part], ids[took_part]))
    assert cluster_ari(groups, (groups + 1) % 3) == pytest.approx(1.0)
    assert np.isnan(cluster_ari(groups, np.full(15, -1)))


def test_auroc_has_scikit_learns_bits():
    """Records hold scikit-learn's roc_auc_score (one-vs-rest and one-vs-one, both
    averages, and the binary score each is made of) to the last bit; the kit computes
    them by its arithmetic without its input checks, which must change no bit (ties, an
    absent class, few and many classes, two classes)."""
    from sklearn.metrics import roc_auc_score

    from cpcfl_tf.clustered.metrics import binary_auroc

    rng = np.random.default_rng(11)
    for trial in range(16):
        classes = int(rng.integers(4, 11))
        y = rng.integers(0, classes, size=(3, int(rng.integers(20, 200))))
        y[y == 1] = 0  # class 1 never occurs
        p = rng.random((*y.shape, classes)) ** 3
        p = np.round(p, 2) + 1e-3 if trial % 2 else p  # many ties
        got = pooled_scores(y, p.astype(np.float32))
        flat = y.reshape(-1)
        present = np.unique(flat)
        q = p.reshape(-1, classes).astype(np.float32).astype(np.float64)[:, present]
        q /= q.sum(axis=1, keepdims=True)
        for kind, average in itertools.product(("ovr", "ovo"), ("macro", "weighted")):
            want = roc_auc_score(flat, q, multi_class=kind, average=average, labels=present)
            assert got[f"auroc_{kind}_{average}"] == float(want), (trial, kind, average)
        positive = flat == present[trial % len(present)]
        assert binary_auroc(positive, q[:, 0]) == float(roc_auc_score(positive, q[:, 0]))
    # Hand-worked: scores 0.9 0.8 0.8 0.1 for labels 1 0 1 0: of the four pairs the
    # positive wins three and ties one (0.8 against 0.8): (3 + 0.5) / 4.
    assert binary_auroc(np.array([True, False, True, False]),
                        np.array([0.9, 0.8, 0.8, 0.1])) == 0.875
