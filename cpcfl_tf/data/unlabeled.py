"""Dealing the unlabeled pre-training images to the clients (``partition.unlabeled``).

The paper's server holds the unlabeled images (``server``). Federated self-supervised
pre-training (:mod:`cpcfl_tf.pretraining.federated_pretrain`) needs them on the clients
instead, dealt one of two ways:

* ``iid``: uniformly at random, C near-equal shares of all the images;
* ``groups``: each client's images follow its own labeled class distribution (on the
  paper's partition: its group's four classes in its own 20/20/5/5 proportions, and a
  rotated client's turns): the images of each class are dealt over the clients that hold
  the class, in proportion to how many of it each holds. Every image of a held class is
  dealt, so both deals use the same images as the server (up to rounding).

The labels of the pre-training split serve the deal only, as the clients' labels serve the
partition: they are never given to a pre-training. The deal is seeded (its own stream of
the run's seed) and disjoint from every client's labeled and test images (the config keeps
the splits apart). Whether each client gets a batch is arithmetic, checked before any image
is drawn: :func:`check_deal` from the split's size, :func:`group_shares` from the class
counts.
"""

from __future__ import annotations

import numpy as np

from cpcfl_tf.errors import UserError

DEALS = ("server", "iid", "groups")
"""Where the unlabeled pre-training images are (``partition.unlabeled``)."""

_STREAM = 0x756E6C  # "unl": the deal's own stream of the run's seed


def check_deal(num_images: int, num_clients: int, batch_size: int, source: str) -> None:
    """Refuse, in one line, clients that cannot get a batch each of ``num_images``."""
    if num_images // num_clients < batch_size:
        most = num_images // batch_size
        raise UserError(
            f"{num_clients} clients cannot get a batch of {batch_size} unlabeled "
            f"images each from the {num_images:,} of {source}; use at most "
            f"{most} clients or a smaller batch_size of the federated "
            "pre-training (pretrain.options)"
        )


def group_shares(class_sizes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(clients, classes)`` image counts of the ``groups`` deal: class c's
    ``class_sizes[c]`` images over the clients in proportion to ``weights[:, c]`` (their
    labeled counts of c), by largest remainder so that every image of a held class is
    dealt."""
    weights = np.asarray(weights, dtype=np.float64)
    shares = np.zeros(weights.shape, dtype=np.int64)
    for c, size in enumerate(class_sizes):
        total = weights[:, c].sum()
        if total == 0:
            continue
        exact = size * weights[:, c] / total
        shares[:, c] = np.floor(exact).astype(np.int64)
        rest = int(size - shares[:, c].sum())
        order = np.argsort(-(exact - shares[:, c]), kind="stable")
        shares[order[:rest], c] += 1
    return shares


SMALLER_BATCH = "use a smaller batch_size of the federated pre-training (pretrain.options)"


def check_batch(count: int, batch_size: int, holder: str, fix: str = SMALLER_BATCH) -> None:
    """The one refusal of a client short of one batch of unlabeled images (a federated
    pre-training's round would make no step): ``holder`` names it as the sentence's
    subject, e.g. ``"client 3 has"``."""
    if count < batch_size:
        raise UserError(
            f"{holder} {count} unlabeled images, less than a batch of {batch_size}; {fix}"
        )


def deal_unlabeled(
    kind: str,
    num_images: int,
    num_clients: int,
    *,
    seed: int,
    batch_size: int,
    labels: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    source: str = "the pre-training split",
) -> list[np.ndarray]:
    """Each client's rows of the pre-training split (sorted), for deal ``kind``.

    ``labels`` (the split's, ``groups`` only) and ``weights`` (``(clients, classes)``: each
    client's labeled class counts) decide the ``groups`` deal; a client left with fewer
    than ``batch_size`` images is refused in one line before anything is drawn.
    """
    if kind not in ("iid", "groups"):
        raise UserError(
            f"deal {kind!r}: the clients get unlabeled images with "
            "partition.unlabeled iid or groups"
        )
    check_deal(num_images, num_clients, batch_size, source)
    rng = np.random.default_rng([seed, _STREAM])
    if kind == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(num_images), num_clients)]
    assert labels is not None and weights is not None and len(labels) == num_images
    classes = weights.shape[1]
    sizes = np.bincount(labels, minlength=classes)[:classes]
    shares = group_shares(sizes, weights)
    fewest = int(shares.sum(axis=1).min())
    check_batch(
        fewest,
        batch_size,
        f"the groups deal of {source} leaves client {int(shares.sum(axis=1).argmin())}",
        "use fewer clients or a smaller batch_size of the federated pre-training "
        "(pretrain.options)",
    )
    rows: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(classes):
        pool = rng.permutation(np.flatnonzero(labels == c))
        ends = np.cumsum(shares[:, c])
        for k, (start, end) in enumerate(zip(ends - shares[:, c], ends)):
            rows[k].append(pool[start:end])
    return [np.sort(np.concatenate(r)) for r in rows]
