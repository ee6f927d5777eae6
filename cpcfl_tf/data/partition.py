"""The paper's client partition (Sec. "Experimental settings", fig:client_data_amount).

C clients are split evenly into G groups. Group g holds ``classes_per_group`` consecutive
classes that start ``classes_per_group - class_overlap`` after group g-1's, so on a
10-class dataset the default groups hold {0,1,2,3}, {3,4,5,6}, {6,7,8,9} (the paper's
1-4, 4-7, 7-10). Each client gets ``class_counts`` images of its group's classes in a
random order per client (the paper: 20 images for two of the four classes, 5 for the
other two, 50 in all), and a local test set of the same class proportions.

Images are drawn without replacement, so no image belongs to two clients (nor two test
sets). Where the random 20/5 choices of one draw ask for more images of a class than
the split has, the choices are drawn again (from the same seeded generator): on
STL-10 with 60 clients the shared classes need 500 +- 47 of 500 images, so about half
the draws do not fit. The partition is then the paper's, conditioned on fitting.

Two other kinds of heterogeneity keep the same guarantees (seeded, disjoint, equal-sized
clients, true groups for ARI, a clear error when the data cannot hold them):

* ``rotated`` (IFCA's own benchmark): every client holds every class, as evenly as
  ``sum(class_counts)`` images allow; group g sees its images turned by g quarter turns
  (0/90/180/270 degrees for four groups).
* ``dirichlet`` (label skew): group g draws a class distribution p_g ~ Dir(alpha) and
  each of its clients draws its class counts from Multinomial(sum(class_counts), p_g).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from cpcfl_tf.errors import UserError


@dataclasses.dataclass(frozen=True)
class Client:
    """One client's data: rows into the client train/test splits, and its true group."""

    id: int
    group: int
    classes: tuple[int, ...]
    train_index: np.ndarray
    test_index: np.ndarray
    rotation: int = 0
    """Quarter turns applied to this client's images (``rotated`` partitions)."""


KINDS = ("groups", "rotated", "dirichlet", "own")
"""The kinds of heterogeneity :func:`partition_clients` draws (groups: the paper's); and
``own``: each client brings its own data (Flower nodes started with a ``data-path``), so
nothing is drawn and the server knows no groups."""


@dataclasses.dataclass(frozen=True)
class Partition:
    """All clients of a run; the ground-truth groups serve ARI and the by-group baseline."""

    clients: tuple[Client, ...]
    group_classes: tuple[tuple[int, ...], ...]
    kind: str = "groups"

    @property
    def groups(self) -> np.ndarray:
        """True group id of each client, in client order."""
        return np.array([c.group for c in self.clients], dtype=np.int64)

    def describe(self, train_labels: np.ndarray, test_labels: np.ndarray) -> list[dict]:
        """Per-client records for the result JSON (class counts keyed by class as text)."""

        def counts(labels: np.ndarray) -> dict[str, int]:
            values, n = np.unique(labels, return_counts=True)
            return {str(int(v)): int(k) for v, k in zip(values, n)}

        return [
            {
                "id": c.id,
                "group": c.group,
                "train_class_counts": counts(train_labels[c.train_index]),
                "test_class_counts": counts(test_labels[c.test_index]),
                **({"rotation": 90 * c.rotation} if self.kind == "rotated" else {}),
            }
            for c in self.clients
        ]


def check_partition(
    num_clients: int,
    num_groups: int,
    classes_per_group: int,
    class_overlap: int,
    class_counts: Sequence[int],
    test_fraction: float,
    kind: str = "groups",
    alpha: float = 1.0,
) -> None:
    """Refuse, in one line naming the ``partition.*`` setting, a request no data can
    satisfy. The one check of a partition's shape: the config's ``PartitionConfig`` runs
    it when a config is made, :func:`partition_clients` before drawing; whether the
    data holds enough images is :func:`check_split_sizes`'s."""

    def number(value, whole: bool) -> bool:
        kinds = (int,) if whole else (int, float)
        return (
            isinstance(value, kinds)
            and not isinstance(value, bool)
            and value > 0
            and math.isfinite(value)
        )

    for name, value, whole in (
        ("num_clients", num_clients, True),
        ("num_groups", num_groups, True),
        ("classes_per_group", classes_per_group, True),
        ("test_fraction", test_fraction, False),
        ("alpha", alpha, False),
    ):
        if not number(value, whole):
            raise UserError(
                f"partition.{name} must be a positive "
                f"{'integer' if whole else 'number'}, got {value!r}"
            )
    if kind not in KINDS:
        raise UserError(f"unknown partition.kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "rotated" and num_groups > 4:
        raise UserError(
            f"a rotated partition has 4 distinct quarter turns: at most 4 groups, got {num_groups}"
        )
    if num_groups > num_clients:
        raise UserError(
            f"partition has more groups ({num_groups}) than clients "
            f"({num_clients}): {num_clients} clients cannot be split evenly"
        )
    if num_clients % num_groups:
        raise UserError(
            f"{num_clients} clients cannot be split evenly into {num_groups} groups; "
            "make partition.num_clients a multiple of partition.num_groups"
        )
    if not (isinstance(class_overlap, int) and 0 <= class_overlap < classes_per_group):
        raise UserError(
            f"partition.class_overlap must be in [0, {classes_per_group}), got {class_overlap!r}"
        )
    if not (
        len(class_counts) == classes_per_group
        and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in class_counts)
    ):
        raise UserError(
            f"partition.class_counts needs {classes_per_group} positive integers, "
            f"got {tuple(class_counts)}"
        )


def make_group_classes(
    num_groups: int, classes_per_group: int, class_overlap: int, num_classes: int
) -> tuple[tuple[int, ...], ...]:
    """Class sets of the groups: consecutive runs that share ``class_overlap`` classes."""
    stride = classes_per_group - class_overlap
    last = (num_groups - 1) * stride + classes_per_group - 1
    if last >= num_classes:
        raise UserError(
            f"{num_groups} groups of {classes_per_group} classes overlapping by "
            f"{class_overlap} need classes 0..{last}, but the client data has "
            f"{num_classes}; use fewer groups or classes per group"
        )
    return tuple(
        tuple(range(g * stride, g * stride + classes_per_group)) for g in range(num_groups)
    )


def test_counts_for(class_counts: Sequence[int], test_fraction: float) -> tuple[int, ...]:
    """Test images per class position: the training counts scaled, rounded half up."""
    return tuple(int(np.floor(c * test_fraction + 0.5)) for c in class_counts)


def _fix(disjoint: bool, *, fewer: str = "fewer clients", alpha: bool = False) -> str:
    """What to change when the data cannot hold the partition (the end of the error)."""
    return (
        f"use {fewer} or smaller class_counts"
        + (", or a larger alpha" if alpha else "")
        + (", or allow shared images (disjoint=False)" if disjoint else "")
    )


def client_sizes(
    class_counts: Sequence[int], test_fraction: float, kind: str = "groups"
) -> tuple[int, int]:
    """Training and test images of one client."""
    size = sum(class_counts)
    if kind == "groups":
        return size, sum(test_counts_for(class_counts, test_fraction))
    return size, int(np.floor(size * test_fraction + 0.5))


def check_split_sizes(
    num_clients: int,
    class_counts: Sequence[int],
    test_fraction: float,
    disjoint: bool,
    kind: str,
    sizes: Sequence[int],
    sources: Sequence[str],
) -> None:
    """Arithmetic before any draw: C disjoint clients need C times a client's images of
    each split (``sizes``: what the training and test splits hold)."""
    for split, per_client, have, source in zip(
        ("training", "test"), client_sizes(class_counts, test_fraction, kind), sizes, sources
    ):
        need = per_client * (num_clients if disjoint else 1)
        if need > have:
            most = have // per_client
            raise UserError(
                f"{num_clients} clients of {per_client} {split} images need "
                f"{need:,} but {source} holds {have:,}; "
                + _fix(disjoint, fewer=f"at most {most} clients")
            )


def partition_clients(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    *,
    num_classes: int,
    num_clients: int = 60,
    num_groups: int = 3,
    classes_per_group: int = 4,
    class_overlap: int = 1,
    class_counts: Sequence[int] = (20, 20, 5, 5),
    test_fraction: float = 1.0,
    disjoint: bool = True,
    seed: int = 0,
    max_draws: int = 1000,
    source: str = "the client split",
    test_source: str = "the client test split",
    kind: str = "groups",
    alpha: float = 1.0,
) -> Partition:
    """Draw the paper's partition (or another ``kind`` of heterogeneity).

    Parameters
    ----------
    train_labels, test_labels
        Labels of the splits the clients' training and test images come from.
    num_classes
        Number of classes of the dataset.
    num_clients, num_groups
        C and G; C must be a multiple of G. Clients ``[g*C/G, (g+1)*C/G)`` form group g.
    classes_per_group, class_overlap
        See :func:`make_group_classes`.
    class_counts
        Images per class, one entry per class of the group, permuted per client.
    test_fraction
        Local test set = ``class_counts`` scaled by this (1.0: 50 test images per client,
        which is what the paper's accuracies, multiples of 1/3000 at 60 clients, imply).
    disjoint
        No image in two clients (default). ``False`` draws each client independently,
        for settings the split is too small for (90 clients on STL-10).
    seed
        Determines the whole partition; the paper's "trials" use other seeds.
    max_draws
        Redraws of the per-client count order before giving up as infeasible.
    source, test_source
        Names of the training and test splits, for error messages.
    kind, alpha
        ``groups`` (the paper's), ``rotated`` or ``dirichlet`` (with concentration
        ``alpha``); see the module's description.
    """
    if kind == "own":
        raise UserError(
            "partition.kind=own: the clients bring their own data (Flower nodes "
            "with a data-path), there is nothing to draw; run them with "
            "python -m cpcfl_tf.flower.loopback --data, or choose another kind"
        )
    train_labels = np.asarray(train_labels)
    test_labels = np.asarray(test_labels)
    check_partition(
        num_clients,
        num_groups,
        classes_per_group,
        class_overlap,
        tuple(class_counts),
        test_fraction,
        kind,
        alpha,
    )
    sources = (source, test_source)
    check_split_sizes(
        num_clients,
        class_counts,
        test_fraction,
        disjoint,
        kind,
        (len(train_labels), len(test_labels)),
        sources,
    )
    if kind != "groups":
        return _skewed(
            train_labels,
            test_labels,
            num_classes,
            num_clients,
            num_groups,
            sum(class_counts),
            test_fraction,
            disjoint,
            seed,
            sources,
            kind,
            alpha,
        )
    groups = make_group_classes(num_groups, classes_per_group, class_overlap, num_classes)
    test_counts = test_counts_for(class_counts, test_fraction)
    rng = np.random.default_rng(seed)
    per_group = num_clients // num_groups
    client_group = np.repeat(np.arange(num_groups), per_group)

    available = [
        np.bincount(labels, minlength=num_classes)[:num_classes]
        for labels in (train_labels, test_labels)
    ]
    if disjoint:  # whatever the draw, each member of a class's groups takes min(counts)
        members = np.zeros(num_classes, np.int64)
        for classes in groups:
            members[list(classes)] += per_group
        for which, counts in enumerate((class_counts, test_counts)):
            least = members * min(counts)
            short = np.flatnonzero(least > available[which])
            if len(short):
                cls = int(short[0])
                raise UserError(
                    f"the partition needs at least {int(least[cls])} "
                    f"{('training', 'test')[which]} images of class {cls} from "
                    f"{sources[which]} but only {int(available[which][cls])} exist; "
                    + _fix(disjoint)
                )
    # orders[u, k]: which entry of class_counts client u's k-th group class gets.
    best: tuple[int, int, int, int, int] | None = None
    for _ in range(max_draws):
        orders = np.stack([rng.permutation(classes_per_group) for _ in range(num_clients)])
        shortage = _shortage(
            orders,
            client_group,
            groups,
            (class_counts, test_counts),
            available,
            num_classes,
            disjoint,
        )
        if shortage is None:
            break
        if best is None or shortage[0] < best[0]:
            best = shortage
    else:
        assert best is not None  # max_draws >= 1 draws, each short
        _, which, cls, need, have = best
        split = ("training", "test")[which]
        hint = _fix(disjoint)
        raise UserError(
            f"the partition needs {need} {split} images of class {cls} from "
            f"{sources[which]} "
            f"but only {have} exist (best of {max_draws} draws); {hint}"
        )

    picked = [
        _rows(
            labels,
            _wanted(orders, client_group, groups, counts, num_classes),
            num_classes,
            disjoint,
            rng,
        )
        for labels, counts in ((train_labels, class_counts), (test_labels, test_counts))
    ]
    clients = tuple(
        Client(u, int(client_group[u]), groups[client_group[u]], picked[0][u], picked[1][u])
        for u in range(num_clients)
    )
    return Partition(clients, groups)


def _wanted(orders, client_group, groups, counts, num_classes) -> np.ndarray:
    """``(clients, classes)``: the images of each class each client gets in one draw."""
    wanted = np.zeros((len(orders), num_classes), np.int64)
    for u, order in enumerate(orders):
        for cls, k in zip(groups[client_group[u]], order):
            wanted[u, cls] = counts[k]
    return wanted


def _need(wanted: np.ndarray, disjoint: bool) -> np.ndarray:
    """Images of each class the clients ask for (the largest single ask if not disjoint)."""
    return wanted.sum(axis=0) if disjoint else wanted.max(axis=0)


def _shortage(orders, client_group, groups, count_sets, available, num_classes, disjoint):
    """``None`` if the draw fits, else (total excess, split, class, needed, available)."""
    worst = None
    for which, (counts, have) in enumerate(zip(count_sets, available)):
        need = _need(_wanted(orders, client_group, groups, counts, num_classes), disjoint)
        excess = np.maximum(need - have, 0)
        if excess.any():
            cls = int(np.argmax(excess))
            total = int(excess.sum()) + (worst[0] if worst else 0)
            worst = (total, which, cls, int(need[cls]), int(have[cls]))
    return worst


def _rows(labels, wanted: np.ndarray, num_classes, disjoint, rng) -> list[np.ndarray]:
    """Rows of ``labels`` for each client, ``wanted[u, c]`` of class c, without
    replacement (and, if ``disjoint``, no row for two clients)."""
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    taken = [0] * num_classes
    rows = []
    for counts in wanted:
        mine = []
        for c in np.flatnonzero(counts):
            k = int(counts[c])
            if disjoint:
                mine.append(pools[c][taken[c] : taken[c] + k])
                taken[c] += k
            else:
                mine.append(rng.choice(pools[c], k, replace=False))
        rows.append(np.sort(np.concatenate(mine)))
    return rows


def _skewed(
    train_labels,
    test_labels,
    num_classes,
    num_clients,
    num_groups,
    size,
    test_fraction,
    disjoint,
    seed,
    sources,
    kind,
    alpha,
) -> Partition:
    """The ``rotated`` and ``dirichlet`` kinds: per client class counts, then rows."""
    rng = np.random.default_rng(seed)
    test_size = int(np.floor(size * test_fraction + 0.5))
    client_group = np.repeat(np.arange(num_groups), num_clients // num_groups)
    if kind == "rotated":  # every class, as evenly as the size allows

        def counts(n: int) -> np.ndarray:
            even = np.full(num_classes, n // num_classes)
            even[rng.choice(num_classes, n % num_classes, replace=False)] += 1
            return even

        train_counts = np.stack([counts(size) for _ in range(num_clients)])
        test_counts = np.stack([counts(test_size) for _ in range(num_clients)])
    else:  # each group's own class distribution
        skew = rng.dirichlet(np.full(num_classes, alpha), size=num_groups)
        train_counts = np.stack([rng.multinomial(size, skew[g]) for g in client_group])
        test_counts = np.stack([rng.multinomial(test_size, skew[g]) for g in client_group])
    picked = []
    for which, (labels, wanted) in enumerate(
        ((train_labels, train_counts), (test_labels, test_counts))
    ):
        have = np.bincount(labels, minlength=num_classes)[:num_classes]
        need = _need(wanted, disjoint)
        short = np.flatnonzero(need > have)
        if len(short):
            cls = int(short[0])
            hint = _fix(disjoint, alpha=kind == "dirichlet")
            raise UserError(
                f"the {kind} partition needs {int(need[cls])} "
                f"{('training', 'test')[which]} images of class {cls} from "
                f"{sources[which]} but only {int(have[cls])} exist; {hint}"
            )
        picked.append(_rows(labels, wanted, num_classes, disjoint, rng))
    everything = tuple(range(num_classes))
    classes = [tuple(int(c) for c in np.flatnonzero(train_counts[u])) for u in range(num_clients)]
    clients = tuple(
        Client(
            u,
            int(client_group[u]),
            classes[u],
            picked[0][u],
            picked[1][u],
            int(client_group[u]) if kind == "rotated" else 0,
        )
        for u in range(num_clients)
    )
    return Partition(clients, (everything,) * num_groups, kind)
