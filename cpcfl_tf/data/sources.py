"""Image sources: tfds for the paper's datasets, offline readers for this machine.

Two entry points, one per role in the paper:

* :func:`load_unlabeled` hands out images only. It is what contrastive pre-training
  reads (Sec. "Problem formulation": the encoder is trained on unlabeled data), and no
  code path inside it returns labels.
* :func:`load_labeled` hands out images and labels, for the clients' data, the proxy set
  of linear evaluation and supervised baselines.

Every source returns ``uint8`` arrays of shape ``(n, h, w, c)``; with ``image_size`` set
they go through :func:`cpcfl_tf.data.images.prepare_images` (resize, grayscale to RGB).
Splits use one syntax everywhere: ``"train"``, ``"train[50000:]"``, ``"test[:1000]"``.
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cpcfl_tf.data.folders import FOLDER, folder_spec, read_folder
from cpcfl_tf.data.specs import DatasetSpec, LabeledImages, Split, check_split_text, finish
from cpcfl_tf.errors import UserError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
"""Where Debian's ``dataset-fashion-mnist`` package puts the IDX files."""


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "stl10",
            "tfds",
            10,
            {"train": 5_000, "test": 8_000, "unlabelled": 100_000},
            unlabeled_splits=frozenset({"unlabelled"}),
            tfds_name="stl10",
            host="ai.stanford.edu",
        ),
        DatasetSpec(
            "cifar10",
            "tfds",
            10,
            {"train": 50_000, "test": 10_000},
            tfds_name="cifar10",
            host="www.cs.toronto.edu",
        ),
        DatasetSpec(
            "cifar100",
            "tfds",
            100,
            {"train": 50_000, "test": 10_000},
            tfds_name="cifar100",
            host="www.cs.toronto.edu",
        ),
        DatasetSpec(
            "cifar100_coarse",
            "tfds",
            20,
            {"train": 50_000, "test": 10_000},
            tfds_name="cifar100",
            label_key="coarse_label",
            host="www.cs.toronto.edu",
        ),
        DatasetSpec(
            "mnist",
            "tfds",
            10,
            {"train": 60_000, "test": 10_000},
            tfds_name="mnist",
            host="storage.googleapis.com",
        ),
        # "balanced" (112,800 training images) is close in size to STL-10's 100,000
        # unlabeled images; the paper does not name the EMNIST split (docs/choices.md).
        DatasetSpec(
            "emnist",
            "tfds",
            47,
            {"train": 112_800, "test": 18_800},
            tfds_name="emnist/balanced",
            transpose=True,
            host="biometrics.nist.gov",
        ),
        DatasetSpec(
            "fashion_mnist",
            "tfds",
            10,
            {"train": 60_000, "test": 10_000},
            tfds_name="fashion_mnist",
            host="fashion-mnist.s3-website.eu-central-1.amazonaws.com",
        ),
        DatasetSpec("fashion_mnist_idx", "idx", 10, {"train": 60_000, "test": 10_000}),
        # scikit-learn's 1,797 digits: the first 1,297 are "train", the last 500 "test".
        DatasetSpec("digits", "sklearn", 10, {"train": 1_297, "test": 500}),
    )
}


def get_spec(dataset: str) -> DatasetSpec:
    """Return the :class:`DatasetSpec` of ``dataset`` or raise a :class:`UserError`."""
    if dataset.startswith(FOLDER):
        return folder_spec(dataset[len(FOLDER) :])
    if dataset in DATASETS:
        return DATASETS[dataset]
    return tfds_spec(dataset)


@functools.lru_cache(maxsize=16)
def tfds_spec(name: str) -> DatasetSpec:
    """Any tfds image classification dataset by name (``svhn_cropped``,
    ``cifar10_corrupted/...``): classes and split sizes read from tfds's own description
    (split sizes are known once the dataset is prepared; before, any split name is
    accepted and checked when it is read). Imports tfds, so only for names the kit does
    not list itself."""
    try:
        import tensorflow_datasets as tfds

        builder = tfds.builder(name)
    except Exception:  # not a tfds name either (tfds raises several types)
        raise UserError(
            f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}, a "
            f"tfds image classification dataset, or {FOLDER}PATH for a folder "
            "of images"
        ) from None
    features = builder.info.features
    image = features["image"] if "image" in features else None
    label = features["label"] if "label" in features else None
    if not (isinstance(image, tfds.features.Image) and isinstance(label, tfds.features.ClassLabel)):
        raise UserError(
            f"{name} is not an image classification dataset: it needs an 'image' "
            f"and a class 'label' feature, it has {', '.join(features)}"
        )
    splits = {split: info.num_examples for split, info in builder.info.splits.items()}
    return DatasetSpec(name, "tfds", label.num_classes, splits, tfds_name=name)


def parse_split(dataset: str, split: str) -> Split:
    """Parse and validate ``split`` for ``dataset``; an empty selection is an error."""
    spec = get_spec(dataset)
    match = check_split_text(split)
    base = match["base"]
    bounds = [int(v) if v not in (None, "") else None for v in (match["start"], match["stop"])]
    parsed = Split(base, *bounds)
    if not spec.splits:  # a tfds dataset not prepared yet: sizes unknown until read
        return parsed
    if base not in spec.splits:
        raise UserError(f"{dataset} has no split {base!r}; choose one of {', '.join(spec.splits)}")
    if not parsed.indices(spec.splits[base]):
        raise UserError(
            f"split {split!r} of {dataset} selects no images ({base} has {spec.splits[base]:,})"
        )
    return parsed


def split_size(dataset: str, split: str) -> int:
    """Number of images ``split`` selects, from the static split sizes."""
    parsed = parse_split(dataset, split)
    sizes = get_spec(dataset).splits
    if parsed.base not in sizes:
        raise UserError(
            f"the size of {dataset}:{split} is known once tfds has prepared it; "
            "prepare it first (or pass --data-dir with a prepared copy)"
        )
    return len(parsed.indices(sizes[parsed.base]))


def load_labeled(
    dataset: str,
    split: str,
    *,
    image_size: int | None = None,
    data_dir: str | None = None,
    manual_dir: str | None = None,
) -> LabeledImages:
    """Load a labeled split.

    Parameters
    ----------
    dataset, split
        A name from :data:`DATASETS` and a split such as ``"train[50000:]"``.
    image_size
        Resize to ``image_size x image_size x 3`` (grayscale repeated); ``None`` keeps
        the stored shape.
    data_dir
        tfds data directory, or the directory that holds the IDX files.
    manual_dir
        tfds manual-download directory (an archive fetched by hand, e.g.
        ``stl10_binary.tar.gz``).
    """
    spec = get_spec(dataset)
    parsed = parse_split(dataset, split)
    if parsed.base in spec.unlabeled_splits:
        raise UserError(
            f"{dataset}:{parsed.base} has no labels; use it as unlabeled data "
            f"(load_unlabeled) or pick one of "
            f"{', '.join(s for s in spec.splits if s not in spec.unlabeled_splits)}"
        )
    images, read = _READERS[spec.backend](spec, parsed, True, data_dir, manual_dir)
    assert read is not None  # asked for (want_labels)
    labels = read.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise UserError(
            f"{dataset}:{split} has labels outside [0, {spec.num_classes}); "
            "the data files look corrupt, fetch them again"
        )
    return LabeledImages(
        finish(images, spec, image_size), labels, spec.num_classes, f"{dataset}:{parsed}"
    )


def load_unlabeled(
    dataset: str,
    split: str,
    *,
    image_size: int | None = None,
    data_dir: str | None = None,
    manual_dir: str | None = None,
) -> np.ndarray:
    """Load images only: the pre-training source. Labels are never read.

    Parameters are those of :func:`load_labeled`; returns ``uint8 (n, h, w, c)``.
    """
    spec = get_spec(dataset)
    images, _ = _READERS[spec.backend](
        spec, parse_split(dataset, split), False, data_dir, manual_dir
    )
    return finish(images, spec, image_size)


# --- readers: (spec, split, want_labels, data_dir, manual_dir) -> (images, labels | None)


def _read_idx(
    spec: DatasetSpec, split: Split, want_labels: bool, data_dir: str | None, manual_dir: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    del manual_dir
    prefix = _IDX_PREFIX[split.base]
    folder = _find_idx_dir(data_dir, f"{prefix}-images-idx3-ubyte.gz")
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
    rows = split.indices(len(images))
    images = images[rows.start : rows.stop : rows.step]
    if not want_labels:
        return images, None
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")
    if len(labels) != spec.splits[split.base]:
        raise UserError(
            f"{folder}: {len(labels)} labels, expected {spec.splits[split.base]}; "
            "reinstall with `apt-get install --reinstall dataset-fashion-mnist`"
        )
    return images, labels[rows.start : rows.stop : rows.step]


_IDX_PREFIX = {"train": "train", "test": "t10k"}


def _find_idx_dir(data_dir: str | None, filename: str) -> Path:
    roots = [Path(data_dir).expanduser()] if data_dir else [Path(FASHION_MNIST_DIR)]
    candidates = [d for r in roots for d in (r, r / "fashion-mnist", r / "fashion_mnist")]
    for folder in candidates:
        if (folder / filename).is_file():
            return folder
    raise UserError(
        f"Fashion-MNIST file {filename} not found in {roots[0]}; run "
        "`apt-get install -y dataset-fashion-mnist` or pass --data-dir DIR "
        "holding the four *-idx*-ubyte.gz files"
    )


_IDX_DTYPES = {0x08: np.uint8}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a read-only numpy array, checking its
    header. A process reads a file once while it stays unchanged (same time and size):
    Fashion-MNIST's pre-training and client splits are slices of one file, and scripts
    and tests read the same splits again; decompressing took a quarter of a second each
    time."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as err:
        raise UserError(f"cannot read {path} ({err}); fetch the file again") from None
    return _read_idx_file(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_idx_file(path: Path, mtime_ns: int, size: int) -> np.ndarray:
    del mtime_ns, size  # part of the key only: a changed file is read again
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as err:
        raise UserError(f"cannot read {path} ({err}); fetch the file again") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise UserError(f"{path} is not an IDX file of unsigned bytes; fetch it again")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != header + int(np.prod(shape)):
        raise UserError(
            f"{path} is truncated ({len(raw) - header} bytes of data for shape "
            f"{shape}); fetch it again"
        )
    return np.frombuffer(raw, dtype=_IDX_DTYPES[raw[2]], offset=header).reshape(shape)


def _read_sklearn(
    spec: DatasetSpec, split: Split, want_labels: bool, data_dir: str | None, manual_dir: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    del data_dir, manual_dir
    images, labels = _digits()
    offset = 0 if split.base == "train" else spec.splits["train"]
    rows = split.indices(spec.splits[split.base])
    take = slice(offset + rows.start, offset + rows.stop, rows.step)
    return images[take], (labels[take] if want_labels else None)


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, read-only, parsed once per process (its CSV took a tenth
    of a second per split), with pixel values stretched from 0..16 to the 0..255 range
    every other source uses."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.copy()
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def _read_tfds(
    spec: DatasetSpec, split: Split, want_labels: bool, data_dir: str | None, manual_dir: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    import tensorflow_datasets as tfds

    kwargs = dict(split=str(split), data_dir=data_dir, shuffle_files=False)
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # tfds warns about every folder it cannot use
    try:
        ds = tfds.load(spec.tfds_name, download=False, **kwargs)
    except Exception:  # not prepared in data_dir (tfds raises several types for that)
        absl_logger.setLevel(level)
        _check_can_fetch(spec, data_dir, manual_dir)
        config = tfds.download.DownloadConfig(manual_dir=manual_dir)
        try:
            ds = tfds.load(
                spec.tfds_name,
                download=True,
                download_and_prepare_kwargs={"download_config": config},
                **kwargs,
            )
        except Exception as err:
            raise UserError(
                f"could not fetch {spec.name} with tfds ({type(err).__name__}); "
                "check the connection, or pass --data-dir with a prepared copy "
                "or --manual-dir with the downloaded archive"
            ) from None
    absl_logger.setLevel(level)
    key = spec.label_key
    if want_labels:
        batches = list(tfds.as_numpy(ds.map(lambda ex: (ex["image"], ex[key])).batch(4096)))
    else:  # the label feature is dropped inside the graph and never reaches Python
        batches = list(tfds.as_numpy(ds.map(lambda ex: ex["image"]).batch(4096)))
    if not batches:
        raise UserError(f"{spec.name}:{split} is empty in {data_dir or 'the tfds data dir'}")
    if not want_labels:
        return np.concatenate(batches), None
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def _check_can_fetch(spec: DatasetSpec, data_dir: str | None, manual_dir: str | None) -> None:
    """Fail at once when tfds would only retry a download that cannot work."""
    if manual_dir and Path(manual_dir).expanduser().is_dir():
        return
    host = spec.host or "storage.googleapis.com"
    try:
        if os.environ.get("CPCFL_OFFLINE"):  # downloads forbidden by the user (and tests)
            raise OSError("CPCFL_OFFLINE is set")
        socket.getaddrinfo(host, 443)
    except OSError:
        where = data_dir or "~/tensorflow_datasets"
        raise UserError(
            f"{spec.name} is not prepared in {where} and {host} cannot be reached "
            "(no internet?); pass --data-dir with a prepared copy or --manual-dir "
            "with the downloaded archive, or use --preset quick for offline "
            "Fashion-MNIST"
        ) from None


def check_readable(
    dataset: str, bases: Sequence[str], data_dir: str | None, manual_dir: str | None
) -> None:
    """Refuse at once a dataset this machine can neither read nor fetch: Fashion-MNIST's
    IDX files of the ``bases`` (``train``, ``test``) missing, a tfds dataset neither
    prepared in the data dir nor reachable. It looks at files and names only (no image
    read, TensorFlow not imported), so a script stops before its first run; a folder the
    loader then cannot read still fails there, with its own error."""
    spec = get_spec(dataset)
    if spec.backend == "idx":
        for base in bases:
            _find_idx_dir(data_dir, f"{_IDX_PREFIX[base]}-images-idx3-ubyte.gz")
    elif spec.backend == "tfds" and not _prepared(spec.tfds_name or dataset, data_dir):
        _check_can_fetch(spec, data_dir, manual_dir)


def _prepared(tfds_name: str, data_dir: str | None) -> bool:
    """Whether tfds has prepared ``tfds_name`` in the data dir it would read (``data_dir``,
    else ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``): its ``dataset_info.json``."""
    root = Path(data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")
    folder = root.expanduser() / tfds_name.split(":")[0]
    return folder.is_dir() and next(folder.rglob("dataset_info.json"), None) is not None


_READERS = {"idx": _read_idx, "sklearn": _read_sklearn, "tfds": _read_tfds, "folder": read_folder}
