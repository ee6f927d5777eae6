import gzip
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from cpcfl_tf.data.images import prepare_images, to_float
from cpcfl_tf.data.sources import (DATASETS, check_readable, load_labeled, load_unlabeled,
                                   parse_split, read_idx, split_size)
from cpcfl_tf.errors import UserError


def test_fashion_mnist_reader_on_the_real_debian_files():
    train = load_labeled("fashion_mnist_idx", "train")
    test = load_labeled("fashion_mnist_idx", "test")
    assert len(train) + len(test) == 70_000
    assert train.images.shape == (60_000, 28, 28, 1) and train.images.dtype == np.uint8
    assert train.labels[0] == 9 and test.labels[0] == 9  # both start with an ankle boot
    assert np.array_equal(np.bincount(train.labels), np.full(10, 6_000))
    assert np.array_equal(np.bincount(test.labels), np.full(10, 1_000))
    assert train.num_classes == 10 and train.source == "fashion_mnist_idx:train"


def test_slices_select_the_same_rows_as_numpy():
    full = load_labeled("fashion_mnist_idx", "train")
    tail = load_labeled("fashion_mnist_idx", "train[50000:]")
    head = load_labeled("fashion_mnist_idx", "train[:100]")
    assert np.array_equal(tail.images, full.images[50_000:])
    assert np.array_equal(tail.labels, full.labels[50_000:])
    assert np.array_equal(head.labels, full.labels[:100])
    assert split_size("fashion_mnist_idx", "train[50000:]") == 10_000


def test_unlabeled_source_hands_out_images_only():
    images = load_unlabeled("fashion_mnist_idx", "train[:500]")
    assert isinstance(images, np.ndarray) and images.shape == (500, 28, 28, 1)
    assert np.array_equal(images, load_labeled("fashion_mnist_idx", "train[:500]").images)


def test_one_preprocessing_path_resizes_and_repeats_gray():
    images = load_labeled("fashion_mnist_idx", "test[:64]", image_size=32).images
    assert images.shape == (64, 32, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(images[..., 0], images[..., 2])
    assert images.max() > 200  # still on the 0..255 scale
    batch = to_float(images).numpy()
    assert batch.dtype == np.float32 and 0.0 <= batch.min() and batch.max() <= 1.0


def test_prepare_images_keeps_colour_and_rejects_bad_shapes():
    rgb = np.random.default_rng(0).integers(0, 256, (3, 96, 96, 3), dtype=np.uint8)
    assert np.array_equal(prepare_images(rgb, 96), rgb)
    assert prepare_images(rgb, 32).shape == (3, 32, 32, 3)
    with pytest.raises(UserError):
        prepare_images(rgb[..., :2], 32)


def test_digits_splits():
    train, test = load_labeled("digits", "train"), load_labeled("digits", "test")
    assert (len(train), len(test)) == (1_297, 500)
    assert set(np.unique(test.labels)) == set(range(10))
    assert train.images.dtype == np.uint8 and train.images.max() == 255


@pytest.mark.parametrize("dataset,split,message", [
    ("imagenet", "train", "unknown dataset"),
    ("mnist", "validation", "has no split"),
    ("mnist", "train[a:b]", "cannot read split"),
    ("fashion_mnist_idx", "test[20000:]", "selects no images"),
])
def test_bad_names_give_one_line_errors(dataset, split, message):
    with pytest.raises(UserError, match=message) as err:
        load_labeled(dataset, split)
    assert "\n" not in str(err.value)


def test_unlabelled_split_refuses_to_hand_out_labels():
    with pytest.raises(UserError, match="has no labels"):
        load_labeled("stl10", "unlabelled")


def test_missing_idx_files_name_the_fix(tmp_path):
    with pytest.raises(UserError, match="apt-get install -y dataset-fashion-mnist") as err:
        load_labeled("fashion_mnist_idx", "train", data_dir=str(tmp_path))
    assert "--data-dir" in str(err.value)


def test_data_dir_with_idx_files_is_honoured(tmp_path):
    images = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    header = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in images.shape)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.tobytes()))
    assert np.array_equal(read_idx(tmp_path / "t10k-images-idx3-ubyte.gz"), images)
    (tmp_path / "broken-idx1-ubyte.gz").write_bytes(gzip.compress(header + b"\x00"))
    with pytest.raises(UserError, match="truncated"):
        read_idx(tmp_path / "broken-idx1-ubyte.gz")
    (tmp_path / "junk.gz").write_bytes(b"not gzip")
    with pytest.raises(UserError, match="fetch the file again"):
        read_idx(tmp_path / "junk.gz")


def _idx(images: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, images.ndim]) + b"".join(n.to_bytes(4, "big") for n in images.shape)
    return gzip.compress(header + images.tobytes())


def test_an_idx_file_changed_on_disk_is_read_again(tmp_path):
    # A process reads an unchanged file once; a file written again (new time or size)
    # must give its new contents, never the ones read before.
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    first = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    path.write_bytes(_idx(first))
    assert np.array_equal(read_idx(path), first)
    assert read_idx(path) is read_idx(path)  # read once
    second = first[:1] + 7  # another size
    path.write_bytes(_idx(second))
    assert np.array_equal(read_idx(path), second)
    third = second + 1  # the same size, written again (mtime moved on)
    path.write_bytes(_idx(third))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert np.array_equal(read_idx(path), third)
    with pytest.raises(ValueError):  # read-only: a caller cannot change what others get
        read_idx(path)[0, 0, 0] = 1


def test_digits_are_scikit_learns_pixels_stretched_to_0_255_and_read_only():
    from sklearn.datasets import load_digits

    raw = load_digits()
    train, test = load_labeled("digits", "train[:100]"), load_labeled("digits", "test")
    assert np.array_equal(train.images[..., 0], np.rint(raw.images[:100] * 255 / 16))
    assert np.array_equal(test.labels, raw.target[1_297:])
    again = load_labeled("digits", "train[:100]")
    assert np.array_equal(again.images, train.images)
    with pytest.raises(ValueError):
        again.images[0, 0, 0, 0] = 1


TFDS_CASES = [(n, s) for n, spec in DATASETS.items() if spec.backend == "tfds"
              for s in spec.splits if s not in spec.unlabeled_splits]


@pytest.mark.parametrize("dataset,split", TFDS_CASES)
def test_every_tfds_dataset_through_mock_data(dataset, split):
    spec = DATASETS[dataset]
    with tfds.testing.mock_data(num_examples=6):
        raw = load_labeled(dataset, split)
        resized = load_labeled(dataset, split, image_size=32)
    assert raw.images.dtype == np.uint8 and raw.images.ndim == 4 and len(raw) == 6
    assert raw.labels.min() >= 0 and raw.labels.max() < spec.num_classes
    assert resized.images.shape == (6, 32, 32, 3)


def test_stl10_unlabelled_through_mock_data():
    with tfds.testing.mock_data(num_examples=5):
        images = load_unlabeled("stl10", "unlabelled")
    assert images.shape == (5, 96, 96, 3) and images.dtype == np.uint8


def test_emnist_images_are_transposed_back():
    with tfds.testing.mock_data(num_examples=4):
        ours = load_unlabeled("emnist", "train")
        raw = np.stack([ex["image"] for ex in tfds.as_numpy(
            tfds.load("emnist/balanced", split="train"))])
    assert not np.array_equal(ours, raw)
    assert np.array_equal(ours, raw.transpose(0, 2, 1, 3))


def test_unprepared_tfds_data_fails_at_once_when_offline(tmp_path, monkeypatch):
    def no_dns(*args, **kwargs):
        raise socket.gaierror("offline")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    start = time.monotonic()
    with pytest.raises(UserError, match="cannot be reached") as err:
        load_labeled("stl10", "train", data_dir=str(tmp_path))
    assert time.monotonic() - start < 30
    assert "--preset quick" in str(err.value) and "--data-dir" in str(err.value)


def test_what_cannot_be_read_or_fetched_is_refused_before_any_image(tmp_path, monkeypatch):
    """check_readable looks where the loaders would: the IDX files of the splits used,
    and the folder tfds itself names for a prepared dataset (its builder's data_dir)."""
    monkeypatch.setenv("CPCFL_OFFLINE", "1")
    with pytest.raises(UserError, match="t10k-images.*apt-get install"):
        check_readable("fashion_mnist_idx", ["test"], str(tmp_path), None)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"")
    check_readable("fashion_mnist_idx", ["test"], str(tmp_path), None)
    with pytest.raises(UserError, match="train-images"):
        check_readable("fashion_mnist_idx", ["test", "train"], str(tmp_path), None)
    check_readable("digits", ["train", "test"], str(tmp_path), None)  # in scikit-learn

    for name in ("stl10", "emnist"):  # emnist: a tfds config, one folder deeper
        data_dir = tmp_path / name
        with pytest.raises(UserError, match="cannot be reached.*--data-dir"):
            check_readable(name, ["train"], str(data_dir), None)
        prepared = Path(tfds.builder(DATASETS[name].tfds_name, data_dir=str(data_dir)).data_dir)
        prepared.mkdir(parents=True)
        (prepared / "dataset_info.json").write_text("{}")
        check_readable(name, ["train"], str(data_dir), None)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "stl10"))  # tfds's own default
    check_readable("stl10", ["train"], None, None)
    manual = tmp_path / "manual"
    manual.mkdir()
    check_readable("cifar10", ["train"], str(tmp_path), str(manual))  # tfds prepares it


def test_parse_split_round_trips():
    assert str(parse_split("mnist", "train[50000:]")) == "train[50000:]"
    assert str(parse_split("mnist", "test")) == "test"


def test_any_tfds_image_classification_dataset_by_name():
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.data.sources import get_spec

    spec = get_spec("svhn_cropped")  # classes from tfds's description, offline
    assert spec.backend == "tfds" and spec.num_classes == 10
    config = get_preset("quick").with_overrides(data={"client_dataset": "svhn_cropped",
                                                      "client_train_split": "train",
                                                      "client_test_split": "test"})
    with tfds.testing.mock_data(num_examples=12):
        data = load_labeled(config.data.client_dataset, "train", image_size=32)
        pretrain = load_unlabeled("svhn_cropped", "train")
    assert data.images.shape == (12, 32, 32, 3) and data.num_classes == 10
    assert data.labels.max() < 10 and pretrain.shape == (12, 32, 32, 3)


@pytest.mark.parametrize("name,message", [
    ("no_such_dataset_here", "unknown dataset 'no_such_dataset_here'"),
    ("celeb_a", "not an image classification dataset"),  # images, but no class label
])
def test_a_tfds_name_that_cannot_serve_is_one_line(name, message):
    from cpcfl_tf.data.sources import get_spec

    with pytest.raises(UserError, match=message):
        get_spec(name)


def test_a_tfds_dataset_with_too_few_classes_for_the_partition_is_refused():
    from cpcfl_tf.plan.presets import get_preset

    from cpcfl_tf.plan.resolve import resolve

    with pytest.raises(UserError, match="client data has 2"):  # 3 groups need 10 classes
        resolve(get_preset("quick").with_overrides(data={"client_dataset": "cats_vs_dogs",
                                                         "client_train_split": "train[:20000]",
                                                         "client_test_split": "train[20000:]"}))
