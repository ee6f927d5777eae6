"""Image folders: a ``folder:`` dataset (one subfolder of PNG/JPEG images per class) and
a Flower node's own data (its ``data-path``: labeled images per class, unlabeled ones in
``unlabeled/``), listed and checked without reading an image, then read as every
source's images."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from cpcfl_tf.data.specs import DatasetSpec, LabeledImages, Split, finish
from cpcfl_tf.errors import UserError

FOLDER = "folder:"
"""Prefix of a folder source: ``folder:PATH``."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
FOLDER_TEST_SHARE = 0.2
"""A folder without ``train/`` and ``test/`` is split by a seeded draw: this share tests."""


def _split_dirs(root: Path, what: str) -> dict[str, Path]:
    """An image folder's split folders: ``train/`` and ``test/`` when it has both, else
    the whole folder as ``all`` (to be split by a seeded draw)."""
    if not root.is_dir():
        raise UserError(
            f"no folder {root} {what}; give a folder with one subfolder of "
            "PNG/JPEG images per class"
        )
    if (root / "train").is_dir() and (root / "test").is_dir():
        return {"train": root / "train", "test": root / "test"}
    return {"all": root}


def _seeded_split(count: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a folder without ``train/`` and ``test/``: a seeded draw, the same on
    every machine, :data:`FOLDER_TEST_SHARE` of them for testing (train rows, test rows)."""
    order = np.random.default_rng(0).permutation(count)
    cut = count - int(round(FOLDER_TEST_SHARE * count))
    return order[:cut], order[cut:]


@functools.lru_cache(maxsize=16)
def folder_spec(path: str) -> DatasetSpec:
    """A folder of images with one subfolder per class (PNG/JPEG), as a dataset.

    With ``train/`` and ``test/`` subfolders (each holding the class subfolders) those are
    the splits; otherwise every image is split by a seeded draw into ``train`` and
    ``test`` (:data:`FOLDER_TEST_SHARE`). Images directly in a split folder, outside any
    class subfolder, count as unlabeled (class -1): fine for pre-training, refused as
    client data. Only names are read here, no image.
    """
    root = Path(path).expanduser()
    split_dirs = _split_dirs(root, f"for {FOLDER}{path}")
    classes = sorted(
        {d.name for folder in split_dirs.values() for d in folder.iterdir() if d.is_dir()}
    )
    listed = {}
    for split, folder in split_dirs.items():
        files = [
            (str(f), -1) for f in sorted(folder.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES
        ]
        for k, name in enumerate(classes):
            sub = folder / name
            if sub.is_dir():
                files += [
                    (str(f), k) for f in sorted(sub.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES
                ]
        listed[split] = files
    if "all" in listed:
        files = listed.pop("all")
        train, test = _seeded_split(len(files))
        listed = {"train": [files[i] for i in train], "test": [files[i] for i in test]}
    if not any(listed.values()):
        raise UserError(f"{root} holds no PNG or JPEG images")
    return DatasetSpec(
        f"{FOLDER}{path}",
        "folder",
        len(classes),
        {split: len(files) for split, files in listed.items()},
        files={split: tuple(files) for split, files in listed.items()},
    )


def class_folder_names(num_classes: int) -> tuple[str, ...]:
    """A node folder's class subfolder names unless the run names its classes: the class
    indices, ``0`` .. ``num_classes - 1``."""
    return tuple(str(k) for k in range(num_classes))


def list_node_folder(
    path: str | os.PathLike, class_names: tuple[str, ...]
) -> dict[str, list[tuple[str, int]]]:
    """One client's own images (a Flower node's ``data-path``): ``train``/``test`` ->
    ``[(file, class index), ...]``, checked without reading an image.

    The folder has the image-folder layout of :func:`folder_spec` (one subfolder per
    class, optional ``train/`` and ``test/``), but the class indices are the run's:
    a subfolder's name is looked up in ``class_names``, so a node holding 2 of 10 classes
    labels them as the other nodes do. Within a split, images are ordered by file name
    across classes (``tools/export_partition.py`` names them by row: the partition's order).
    Without ``train/`` and ``test/`` the images are split by a seeded draw
    (:data:`FOLDER_TEST_SHARE` test). Refuses in one line a missing folder, an image
    outside any class subfolder, a class the run does not know, and a split without
    images. (Fewer training images than a batch are one smaller batch, as the simulator
    trains an epoch's remainder.)
    """
    root = Path(path).expanduser()
    split_dirs = _split_dirs(root, "(node config data-path)")
    index = {name: k for k, name in enumerate(class_names)}
    listed: dict[str, list[tuple[str, int]]] = {}
    for split, folder in split_dirs.items():
        stray = [f for f in sorted(folder.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
        if stray:
            raise UserError(
                f"{stray[0]} is in no class subfolder; a node's images go in one "
                "subfolder per class"
            )
        found: list[tuple[Path, int]] = []
        for sub in sorted(d for d in folder.iterdir() if d.is_dir() and d.name != UNLABELED_FOLDER):
            if sub.name not in index:
                raise UserError(
                    f"{sub} is a class the run does not know; its classes are "
                    f"{', '.join(class_names)} (run config class-names)"
                )
            found += [
                (f, index[sub.name]) for f in sub.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES
            ]
        found.sort(key=lambda item: (item[0].name, item[1]))
        listed[split] = [(str(f), k) for f, k in found]
    if "all" in listed:
        files = listed.pop("all")
        train, test = _seeded_split(len(files))  # kept in file order
        listed = {
            "train": [files[i] for i in sorted(train)],
            "test": [files[i] for i in sorted(test)],
        }
    if not listed["train"] or not listed["test"]:
        raise UserError(
            f"{root} has {len(listed['train'])} training and "
            f"{len(listed['test'])} test images; a node needs at least one of "
            "each"
        )
    return listed


UNLABELED_FOLDER = "unlabeled"
"""The subfolder of a node's ``data-path`` with its unlabeled images (no class
subfolders): what a federated pre-training trains on."""


def list_node_unlabeled(path: str | os.PathLike) -> list[str]:
    """The files of a node's unlabeled images (``data-path``/``unlabeled/``), checked
    without reading one: a missing or empty folder is refused in one line."""
    folder = Path(path).expanduser() / UNLABELED_FOLDER
    files = (
        sorted(str(f) for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if folder.is_dir()
        else []
    )
    if not files:
        raise UserError(
            f"no unlabeled images in {folder}; a federated pre-training needs the "
            f"node's PNG/JPEG images there (node config data-path)"
        )
    return files


def read_node_unlabeled(files: list[str], image_size: int | None = None) -> np.ndarray:
    """The images of :func:`list_node_unlabeled`'s files, prepared as every source's
    (``uint8 (n, h, w, 3)``)."""
    spec = DatasetSpec(
        "node",
        "folder",
        0,
        {"unlabeled": len(files)},
        files={"unlabeled": tuple((f, -1) for f in files)},
    )
    images, _ = read_folder(spec, Split("unlabeled", None, None), False, None, None)
    return finish(images, spec, image_size)


def read_node_folder(
    listed: dict[str, list[tuple[str, int]]], num_classes: int, image_size: int | None = None
) -> dict[str, LabeledImages]:
    """The images of :func:`list_node_folder`'s listing, prepared as every source's."""
    spec = DatasetSpec(
        "node",
        "folder",
        num_classes,
        {k: len(v) for k, v in listed.items()},
        files={k: tuple(v) for k, v in listed.items()},
    )
    out = {}
    for split in ("train", "test"):
        images, labels = read_folder(spec, Split(split, None, None), True, None, None)
        assert labels is not None  # asked for (want_labels)
        out[split] = LabeledImages(
            finish(images, spec, image_size), labels.astype(np.int64), num_classes, f"node:{split}"
        )
    return out


def read_folder(
    spec: DatasetSpec, split: Split, want_labels: bool, data_dir: str | None, manual_dir: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """A folder source's reader (the readers' signature: :mod:`cpcfl_tf.data.sources`)."""
    del data_dir, manual_dir
    from PIL import Image

    if spec.files is None:
        raise ValueError(f"{spec.name} is not a folder source")
    rows = split.indices(spec.splits[split.base])
    chosen = [spec.files[split.base][i] for i in rows]
    if want_labels and any(label < 0 for _, label in chosen):
        path = next(p for p, label in chosen if label < 0)
        raise UserError(
            f"{path} is in no class subfolder; labeled data needs one subfolder per class"
        )
    images = []
    for path, _ in chosen:
        try:
            with Image.open(path) as image:
                images.append(np.asarray(image.convert("RGB"), np.uint8))
        except OSError as err:
            raise UserError(f"cannot read image {path} ({err}); remove or replace it") from None
    shapes = {im.shape for im in images}
    if len(shapes) > 1:  # resized one by one to the largest, then as every source is
        h, w = max(s[0] for s in shapes), max(s[1] for s in shapes)
        images = [
            np.asarray(Image.fromarray(im).resize((w, h), Image.Resampling.BILINEAR))
            for im in images
        ]
    labels = np.array([label for _, label in chosen], np.int64) if want_labels else None
    return np.stack(images), labels
