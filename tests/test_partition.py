import numpy as np
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.data import partition_clients
from cpcfl_tf.clustered.clients import partition_for
from cpcfl_tf.data.partition import make_group_classes
from cpcfl_tf.errors import UserError
from cpcfl_tf.evidence.plots import plot_client_data_amounts


@pytest.fixture(scope="module")
def paper_partition(fmnist_clients):
    """The paper's protocol (60 clients, 3 groups, 20/20/5/5) on real Fashion-MNIST."""
    train, test = fmnist_clients
    return partition_clients(train.labels, test.labels, num_classes=10, seed=0)


def test_each_client_has_four_classes_with_20_20_5_5(paper_partition, fmnist_clients):
    train, test = fmnist_clients
    assert len(paper_partition.clients) == 60
    for client in paper_partition.clients:
        classes, counts = np.unique(train.labels[client.train_index], return_counts=True)
        assert tuple(classes) == client.classes
        assert sorted(counts) == [5, 5, 20, 20]
        test_classes, test_counts = np.unique(test.labels[client.test_index], return_counts=True)
        assert tuple(test_classes) == client.classes  # test sets inside the client's classes
        assert np.array_equal(test_counts, counts)  # same proportions (test_fraction 1)


def test_which_classes_get_20_is_random_per_client(paper_partition, fmnist_clients):
    train, _ = fmnist_clients
    patterns = {tuple(np.bincount(train.labels[c.train_index], minlength=10))
                for c in paper_partition.clients}
    assert len(patterns) > 6  # 3 groups x C(4,2) = 18 patterns possible


def test_no_image_belongs_to_two_clients(paper_partition):
    for attr in ("train_index", "test_index"):
        rows = np.concatenate([getattr(c, attr) for c in paper_partition.clients])
        assert len(np.unique(rows)) == len(rows) == 60 * 50


def test_groups_hold_the_papers_classes_and_overlap_by_one(paper_partition):
    assert paper_partition.group_classes == ((0, 1, 2, 3), (3, 4, 5, 6), (6, 7, 8, 9))
    assert list(paper_partition.groups) == [0] * 20 + [1] * 20 + [2] * 20
    for client in paper_partition.clients:
        assert client.classes == paper_partition.group_classes[client.group]
    g = [set(c) for c in paper_partition.group_classes]
    assert g[0] & g[1] == {3} and g[1] & g[2] == {6} and not g[0] & g[2]


def test_the_seed_determines_the_partition(fmnist_clients):
    train, test = fmnist_clients

    def rows(seed):
        p = partition_clients(train.labels, test.labels, num_classes=10, seed=seed)
        return [np.concatenate([c.train_index, c.test_index]) for c in p.clients]

    same = rows(3), rows(3)
    assert all(np.array_equal(a, b) for a, b in zip(*same))
    assert not all(np.array_equal(a, b) for a, b in zip(rows(3), rows(4)))


def test_general_shapes_of_the_protocol(fmnist_clients):
    train, test = fmnist_clients
    p = partition_clients(train.labels, test.labels, num_classes=10, num_clients=8,
                          num_groups=2, classes_per_group=5, class_overlap=0,
                          class_counts=(10, 10, 10, 4, 4), test_fraction=0.5, seed=1)
    assert p.group_classes == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    for client in p.clients:
        assert len(client.train_index) == 38 and len(client.test_index) == 19  # 5,5,5,2,2


def test_too_few_images_says_how_many_were_needed_and_exist(fmnist_clients):
    train, test = fmnist_clients
    # class 0: 150 images; its 20 clients ask for about 250 in any draw
    rare = np.concatenate([np.flatnonzero(train.labels == 0)[:150],
                           np.flatnonzero(train.labels != 0)])
    with pytest.raises(UserError, match=r"needs \d+ training images of class 0 from the client "
                                        r"split but only 150 exist.*disjoint=False"):
        partition_clients(train.labels[rare], test.labels, num_classes=10, num_clients=60,
                          seed=0)
    small = train.labels[:400]  # about 40 images per class
    shared = partition_clients(small, test.labels, num_classes=10, num_clients=60, seed=0,
                               disjoint=False)
    assert all(len(np.unique(c.train_index)) == 50 for c in shared.clients)


@pytest.mark.parametrize("cut,message", [
    (dict(train=400), "60 clients of 50 training images need 3,000 but the training split "
                      "holds 400; use at most 8 clients"),
    (dict(test=1000), "60 clients of 50 test images need 3,000 but the test split holds "
                      "1,000; use at most 20 clients"),
    (dict(class3=150), "needs at least 200 training images of class 3 from the training "
                       "split but only 150 exist"),  # 40 clients share it, 5 images at least
])
def test_impossible_partitions_are_refused_by_arithmetic_before_any_draw(
        fmnist_clients, monkeypatch, cut, message):
    import cpcfl_tf.data.partition as partition

    train, test = fmnist_clients
    y, t = train.labels, test.labels
    if "train" in cut:
        y = y[:cut["train"]]
    if "test" in cut:
        t = t[:cut["test"]]
    if "class3" in cut:
        y = y[np.concatenate([np.flatnonzero(y == 3)[:150], np.flatnonzero(y != 3)])]
    monkeypatch.setattr(partition, "_shortage", lambda *a: pytest.fail("a draw was tried"))
    with pytest.raises(UserError, match=message):
        partition_clients(y, t, num_classes=10, num_clients=60, seed=0,
                          source="the training split", test_source="the test split")


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_clients=16), "split evenly"),
    (dict(num_clients=2, num_groups=3), "split evenly"),
    (dict(num_groups=4, num_clients=60), "need classes 0..12"),
    (dict(class_counts=(20, 20, 5)), "class_counts"),
    (dict(test_fraction=0), "test_fraction"),
])
def test_bad_partition_requests(fmnist_clients, kwargs, message):
    train, test = fmnist_clients
    with pytest.raises(UserError, match=message):
        partition_clients(train.labels, test.labels, num_classes=10, **kwargs)


def test_describe_and_figure(fmnist_clients, tmp_path):
    train, test = fmnist_clients
    config = get_preset("quick")
    p = partition_for(config, train, test)
    records = p.describe(train.labels, test.labels)
    assert len(records) == 15 and records[0]["id"] == 0
    assert sum(records[0]["train_class_counts"].values()) == 50
    png = plot_client_data_amounts(p, train.labels, tmp_path / "amounts.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temp left


def test_group_classes_helper():
    assert make_group_classes(3, 4, 1, 10) == ((0, 1, 2, 3), (3, 4, 5, 6), (6, 7, 8, 9))
    from cpcfl_tf.data.partition import check_partition

    with pytest.raises(UserError, match=r"partition.class_overlap must be in \[0, 4\), got 4"):
        check_partition(3, 3, 4, 4, (5, 5, 5, 5), 1.0)  # the one check, before any helper
    with pytest.raises(UserError, match="need classes 0..12"):
        make_group_classes(4, 4, 1, 10)


def _disjoint(partition):
    for attr in ("train_index", "test_index"):
        rows = np.concatenate([getattr(c, attr) for c in partition.clients])
        assert len(rows) == len(np.unique(rows)), attr


def test_a_rotated_partition_gives_every_client_every_class_turned_by_its_group(
        fmnist_clients, tmp_path):
    from cpcfl_tf.clustered.clients import make_clients

    train, test = fmnist_clients
    p = partition_clients(train.labels, test.labels, num_classes=10, num_clients=8,
                          num_groups=4, kind="rotated", seed=1)
    _disjoint(p)
    assert [c.rotation for c in p.clients] == [0, 0, 1, 1, 2, 2, 3, 3]
    for c in p.clients:
        assert np.array_equal(np.bincount(train.labels[c.train_index], minlength=10), [5] * 10)
    clients = make_clients(p, train, test)
    for u, c in enumerate(p.clients):  # the images each client trains on are turned
        raw = train.images[c.train_index]
        assert np.array_equal(clients.train.images[u], np.rot90(raw, c.rotation, axes=(1, 2)))
    assert [r["rotation"] for r in clients.records] == [0, 0, 90, 90, 180, 180, 270, 270]
    assert plot_client_data_amounts(p, train.labels, tmp_path / "r.png",
                                    title="rotated").stat().st_size > 1000
    with pytest.raises(UserError, match="at most 4 groups"):
        get_preset("quick").with_overrides(partition={"kind": "rotated", "num_groups": 5,
                                                      "num_clients": 15})


def test_a_dirichlet_partition_skews_labels_per_group(fmnist_clients, tmp_path):
    train, test = fmnist_clients

    def draw(alpha, seed=0):
        return partition_clients(train.labels, test.labels, num_classes=10, num_clients=15,
                                 kind="dirichlet", alpha=alpha, seed=seed)

    skewed, flat = draw(0.1), draw(100.0)
    _disjoint(skewed)
    assert [len(c.train_index) for c in skewed.clients] == [50] * 15
    assert [c.test_index.tolist() for c in draw(0.1).clients] == \
        [c.test_index.tolist() for c in skewed.clients]  # seeded
    assert [c.train_index.tolist() for c in draw(0.1, seed=1).clients] != \
        [c.train_index.tolist() for c in skewed.clients]

    def classes_per_group(p):
        return np.mean([len(np.unique(np.concatenate([train.labels[c.train_index]
                                                      for c in p.clients if c.group == g])))
                        for g in range(3)])

    assert classes_per_group(skewed) < 6 < classes_per_group(flat)  # Dir(0.1): few classes
    assert plot_client_data_amounts(skewed, train.labels, tmp_path / "d.png",
                                    title="dirichlet").stat().st_size > 1000
    with pytest.raises(UserError, match="dirichlet partition needs .* larger alpha"):
        partition_clients(train.labels[:600], test.labels, num_classes=10, num_clients=12,
                          kind="dirichlet", alpha=0.05, seed=0)


def test_test_counts_round_half_up_not_to_even():
    """Python's round() takes 2.5 to 2; the partition rounds it up (20,20,5,5 at 0.5 is
    10,10,3,3: 26 test images a client, what the check of split sizes counts too)."""
    from cpcfl_tf.data.partition import client_sizes, test_counts_for

    assert test_counts_for((20, 20, 5, 5), 0.5) == (10, 10, 3, 3)
    assert test_counts_for((7, 3), 0.5) == (4, 2)  # 3.5 -> 4, 1.5 -> 2
    assert client_sizes((20, 20, 5, 5), 0.5) == (50, 26)
    train, test = np.repeat(np.arange(10), 40), np.repeat(np.arange(10), 40)
    part = partition_clients(train, test, num_classes=10, num_clients=3, test_fraction=0.5,
                             seed=0)
    for client in part.clients:
        counts = sorted(np.bincount(test[client.test_index]).tolist(), reverse=True)
        assert counts[:4] == [10, 10, 3, 3]


@pytest.mark.parametrize("have,fits", [(6, True), (5, False)])
def test_a_draw_gets_exactly_its_counts_or_is_refused_even_one_image_short(have, fits):
    """One client of class counts (6, 4, 4, 4) over classes 0-3: with six images of class
    0 the draws that give it the 6 fit exactly; with five of every class every draw is one
    image short, and the call refuses instead of handing out one image fewer."""
    labels = np.concatenate([np.full(have, 0), np.repeat([1, 2, 3], 5)])
    kwargs = dict(num_classes=4, num_clients=1, num_groups=1, classes_per_group=4,
                  class_overlap=0, class_counts=(6, 4, 4, 4), seed=1, max_draws=50)
    if not fits:
        with pytest.raises(UserError, match="needs 6 (training|test) images of class 0 .* but only 5 exist"):
            partition_clients(labels, labels, **kwargs)
        return
    (client,) = partition_clients(labels, labels, **kwargs).clients
    assert np.bincount(labels[client.train_index], minlength=4).tolist() == [6, 4, 4, 4]
    assert np.bincount(labels[client.test_index], minlength=4).tolist() == [6, 4, 4, 4]
