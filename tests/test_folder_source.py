"""A folder of images as a dataset (``folder:PATH``), written here from real Fashion-MNIST."""
import numpy as np
import pytest
from PIL import Image

from cpcfl_tf.data import load_labeled, load_unlabeled
from cpcfl_tf.data.sources import get_spec
from cpcfl_tf.errors import UserError

NAMES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
         "boot"]


def write(folder, images, labels):
    for k, (image, label) in enumerate(zip(images, labels)):
        target = folder / NAMES[label]
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0]).save(target / f"{k:04d}.png")


@pytest.fixture(scope="module")
def fmnist():
    return load_labeled("fashion_mnist_idx", "test[:400]")


def test_a_folder_with_train_and_test_is_a_labeled_dataset(tmp_path, fmnist):
    write(tmp_path / "train", fmnist.images[:300], fmnist.labels[:300])
    write(tmp_path / "test", fmnist.images[300:], fmnist.labels[300:])
    name = f"folder:{tmp_path}"
    spec = get_spec(name)
    assert spec.num_classes == 10 and spec.splits == {"train": 300, "test": 100}
    train = load_labeled(name, "train")
    assert train.images.shape == (300, 28, 28, 3) and train.num_classes == 10
    # The classes are the subfolders in name order; each image keeps its own class.
    order = np.argsort([NAMES[label] for label in range(10)], kind="stable")
    for image, label in zip(train.images[:20], train.labels[:20]):
        matches = [k for k in range(300) if np.array_equal(fmnist.images[k, ..., 0], image[..., 0])]
        assert any(order[label] == fmnist.labels[k] for k in matches)
    assert load_labeled(name, "test[:10]", image_size=32).images.shape == (10, 32, 32, 3)
    assert load_unlabeled(name, "train").shape == (300, 28, 28, 3)


def test_a_flat_folder_gets_a_seeded_split_and_serves_a_run(tmp_path, fmnist):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.clustered.clients import clients_for

    write(tmp_path / "images", fmnist.images, fmnist.labels)
    name = f"folder:{tmp_path / 'images'}"
    spec = get_spec(name)
    assert spec.splits == {"train": 320, "test": 80}
    assert spec.files == get_spec(name).files  # the same split every time
    config = get_preset("smoke").with_overrides(
        data={"client_dataset": name, "client_train_split": "train",
              "client_test_split": "test"},
        partition={"num_clients": 3, "class_counts": (4, 4, 1, 1), "test_fraction": 0.5})
    clients = clients_for(config)
    assert clients.train.images.shape[:2] == (3, 10)


def test_folder_mistakes_are_one_line_errors(tmp_path, fmnist):
    with pytest.raises(UserError, match="no folder"):
        get_spec(f"folder:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no PNG or JPEG"):
        get_spec(f"folder:{tmp_path / 'empty'}")
    write(tmp_path / "few", fmnist.images[:40], fmnist.labels[:40] % 3)
    from cpcfl_tf.plan.presets import get_preset

    from cpcfl_tf.plan.resolve import resolve

    with pytest.raises(UserError, match="client data has 3"):  # too few classes for 3 groups
        resolve(get_preset("smoke").with_overrides(data={
            "client_dataset": f"folder:{tmp_path / 'few'}", "client_train_split": "train",
            "client_test_split": "test"}))
    loose = tmp_path / "loose"
    write(loose, fmnist.images[:10], fmnist.labels[:10])
    Image.fromarray(fmnist.images[0, ..., 0]).save(loose / "stray.png")
    with pytest.raises(UserError, match="in no class subfolder"):
        load_labeled(f"folder:{loose}", "train")
    assert len(load_unlabeled(f"folder:{loose}", "train")) == 9  # fine without labels
